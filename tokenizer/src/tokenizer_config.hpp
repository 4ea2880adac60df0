#pragma once
// What tokenizer_config.json, generation_config.json and config.json of a model directory say about
// special tokens, and how that combines with what the tokenizer file itself says.
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "conveyor/tokenizer/tokenizer.hpp"
#include "hf_tokenizer.hpp"

namespace conveyor::tokenizer {

struct dir_config {
  std::optional<bool> add_bos;  ///< tokenizer_config.json add_bos_token
  std::optional<bool> add_eos;  ///< tokenizer_config.json add_eos_token
  std::string bos_token;        ///< tokenizer_config.json bos_token (string or {"content": ...})
  std::string eos_token;
  std::string chat_template;    ///< a string, or the entry named "default" of a list
  std::vector<added_token> added;  ///< tokenizer_config.json added_tokens_decoder
  std::optional<std::int32_t> bos_id;  ///< generation_config.json, else config.json
  std::vector<std::int32_t> eos_ids;   ///< generation_config.json, else config.json (int or list)
};

/// Reads the three files where present (all optional); bad_format when one exists but is not JSON.
result<dir_config> read_dir_config(const std::string& model_dir);

/// What the tokenizer file itself says, before the directory's files have their say.
struct native_specials {
  std::optional<std::int32_t> bos_id;
  std::optional<std::int32_t> eos_id;
  bool add_bos = false;
  bool add_eos = false;
};

/// Combines them: tokenizer_config.json wins, then the tokenizer file, then the generation config.
special_tokens resolve_specials(const dir_config& config, const native_specials& native,
                                const std::function<std::optional<std::int32_t>(const std::string&)>& lookup,
                                const std::function<std::string(std::int32_t)>& text_of);

}  // namespace conveyor::tokenizer
