#pragma once
// A tokenizer.json, parsed into the steps we run (internal to the tokenizer library).
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "bpe_model.hpp"
#include "conveyor/tokenizer/tokenizer.hpp"
#include "pre_tokenizer.hpp"

namespace conveyor::tokenizer {

struct added_token {
  std::int32_t id = 0;
  std::string content;
  bool special = false;
  bool lstrip = false;  ///< swallow whitespace before it
  bool rstrip = false;  ///< swallow whitespace after it
};

/// HF's decoder chain, reduced to what LLaMA-family files use.
struct hf_decoder {
  bool byte_level = false;     ///< ByteLevel: pieces are in GPT-2's byte alphabet
  std::string metaspace;       ///< Replace/Metaspace: this string becomes a space ("" = none)
  bool byte_fallback = false;  ///< ByteFallback: <0xXX> pieces are raw bytes
  int strip_start = 0;         ///< Strip/Metaspace: spaces removed from the start of the text
};

struct hf_spec {
  std::vector<normalizer_step> normalizers;
  std::vector<pre_tokenizer_step> pre_tokenizers;
  bpe_model model;
  hf_decoder decoder;
  std::vector<added_token> added;
  std::vector<std::string> prefix_specials;  ///< post-processor: special tokens before the text (BOS)
  std::vector<std::string> suffix_specials;  ///< ... and after it (EOS)
  bool has_template = false;                 ///< the post-processor is a TemplateProcessing
};

/// Parses a tokenizer.json document; errors name the component ("pre_tokenizer.type = Whitespace").
result<hf_spec> parse_tokenizer_json(const nlohmann::json& doc);
/// True when the document's pre-tokenizer (or decoder) is byte-level.
bool is_byte_level(const nlohmann::json& doc);

std::unique_ptr<tokenizer> make_hf_tokenizer(hf_spec spec, special_tokens specials);

}  // namespace conveyor::tokenizer
