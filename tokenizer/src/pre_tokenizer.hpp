#pragma once
// HF pre-tokenizers and normalizers that LLaMA-family tokenizer.json files use, as data: a chain of
// steps applied to each stretch of text between added tokens, producing the words the BPE model sees.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "conveyor/base/result.hpp"

namespace conveyor::tokenizer {

/// A compiled PCRE2 pattern (UTF + Unicode properties + JIT). Shared between threads: each match uses
/// its own match data.
class regex {
 public:
  /// invalid_argument naming the offset when PCRE2 rejects the pattern.
  static result<std::shared_ptr<const regex>> compile(const std::string& pattern);
  ~regex();
  regex(const regex&) = delete;
  regex& operator=(const regex&) = delete;
  /// Splits `text` into matches and the gaps between them, in order (HF's "Isolated" behaviour).
  /// invalid_argument when the text is not valid UTF-8.
  status split_isolated(std::string_view text, std::vector<std::string>& out) const;

 private:
  explicit regex(void* code) : code_(code) {}
  void* code_;  // pcre2_code_8*; kept out of the header so users don't need pcre2.h
};

struct normalizer_step {
  enum class kind { nfc, prepend, replace };
  kind what = kind::nfc;
  std::string a;  ///< prepend: the prefix; replace: the pattern (a plain string)
  std::string b;  ///< replace: the replacement
};

struct pre_tokenizer_step {
  enum class kind { split, byte_level, metaspace, digits };
  kind what = kind::split;
  std::shared_ptr<const regex> pattern;  ///< split (and byte_level with use_regex)
  bool add_prefix_space = false;         ///< byte_level
  std::string replacement = "\xE2\x96\x81";  ///< metaspace: U+2581
  bool prepend_first = true;             ///< metaspace: prepend the replacement to the first word
  bool metaspace_split = false;          ///< metaspace: words start at each replacement char
  bool individual_digits = false;        ///< digits
};

/// Applies the normalizer chain to `text`.
status normalize(const std::vector<normalizer_step>& steps, std::string& text);
/// Applies the pre-tokenizer chain to one normalized stretch; `at_start` is true for the stretch that
/// begins the input (metaspace's "first" prepend scheme). Appends words to `words`.
status pre_tokenize(const std::vector<pre_tokenizer_step>& steps, std::string_view text, bool at_start,
                    std::vector<std::string>& words);

/// GPT-2's pre-tokenization pattern (ByteLevel with use_regex = true).
const std::string& gpt2_pattern();

}  // namespace conveyor::tokenizer
