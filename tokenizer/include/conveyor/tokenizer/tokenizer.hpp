#pragma once
// Text <-> token ids for a served model, loaded from its HF directory. Frontends (HTTP, RPC) use it to
// accept text prompts and return text; the engine and the scheduler only ever see ids.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "conveyor/base/result.hpp"

namespace conveyor::tokenizer {

/// The special tokens and policies that come from tokenizer.json's post-processor, tokenizer_config.json
/// and generation_config.json / config.json (in that order of precedence, later files filling gaps).
struct special_tokens {
  std::optional<std::int32_t> bos_id;
  std::vector<std::int32_t> eos_ids;  ///< every id that ends generation (eos_token and generation config)
  std::string bos_token;              ///< its text, e.g. "<s>" or "<|begin_of_text|>"
  std::string eos_token;
  bool add_bos = false;  ///< encode() with add_special prepends bos_id
  bool add_eos = false;  ///< encode() with add_special appends the first eos id
  std::string chat_template;  ///< tokenizer_config.json's chat_template (Jinja source), "" if none
};

struct encode_options {
  bool add_special = true;    ///< add BOS/EOS as the tokenizer's config says
  bool parse_special = true;  ///< text like "<|eot_id|>" becomes that special token (HF's default)
};

struct decode_options {
  bool skip_special = true;  ///< leave out special tokens (BOS, EOS, chat markers)
};

/// A loaded tokenizer. Immutable after loading: encode and decode may run on many threads at once.
class tokenizer {
 public:
  virtual ~tokenizer() = default;
  /// Text (UTF-8) to ids. Invalid UTF-8 is an invalid_argument error.
  virtual result<std::vector<std::int32_t>> encode(std::string_view text, const encode_options& options = {}) const = 0;
  /// Ids to text. Always valid UTF-8: byte sequences that are not (a token boundary inside a
  /// character, or a model's stray bytes) become U+FFFD, as HF's decode does. Ids outside the
  /// vocabulary are skipped.
  virtual std::string decode(std::span<const std::int32_t> ids, const decode_options& options = {}) const = 0;
  /// Number of ids the tokenizer can produce (vocabulary plus added tokens).
  virtual int vocab_size() const = 0;
  /// The id of a token's text ("<|eot_id|>", "</s>"), if it is one token.
  virtual std::optional<std::int32_t> token_id(std::string_view token) const = 0;
  /// True for control/added special tokens (left out by decode's skip_special).
  virtual bool is_special(std::int32_t id) const = 0;
  virtual const special_tokens& specials() const = 0;
  /// "byte_level_bpe" (GPT-2, Llama 3, Qwen2), "metaspace_bpe" (Llama 2's tokenizer.json) or
  /// "sentencepiece" (tokenizer.model).
  virtual std::string_view kind() const = 0;
};

/// Loads the tokenizer of an HF model directory: tokenizer.json when it describes a byte-level BPE,
/// else tokenizer.model (SentencePiece), else a metaspace tokenizer.json; plus tokenizer_config.json,
/// generation_config.json and config.json for the special tokens. not_found when the directory has
/// neither file; unsupported (naming the component) for tokenizer.json features we don't implement.
result<std::unique_ptr<tokenizer>> load_tokenizer(const std::string& model_dir);

/// Loads one tokenizer.json file (no directory, no config files: specials from the file alone).
result<std::unique_ptr<tokenizer>> load_tokenizer_json(const std::string& path);

}  // namespace conveyor::tokenizer
