#pragma once
// The BPE model of an HF tokenizer.json: a vocabulary and ranked merges, applied to one pre-tokenized
// word at a time (for metaspace tokenizers the whole normalized text is one word).
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "conveyor/base/result.hpp"

namespace conveyor::tokenizer {

struct bpe_options {
  bool ignore_merges = false;  ///< a word that is itself in the vocabulary is one token (Llama 3, tiktoken)
  bool byte_fallback = false;  ///< a character outside the vocabulary becomes <0xXX> byte tokens
  std::optional<std::int32_t> unk_id;  ///< else it becomes this token (else it is dropped)
  bool fuse_unk = false;       ///< consecutive unknown characters become one unk
};

class bpe_model {
 public:
  bpe_model() = default;
  /// Builds the model; invalid_argument/bad_format when a merge names a piece outside the vocabulary or
  /// the merged piece is not in it.
  static result<bpe_model> create(std::unordered_map<std::string, std::int32_t> vocab,
                                  const std::vector<std::pair<std::string, std::string>>& merges,
                                  const bpe_options& options);

  /// Appends the ids of `word` (in the vocabulary's alphabet) to `out`.
  void encode_word(std::string_view word, std::vector<std::int32_t>& out) const;
  /// The piece of an id, or nullptr outside the vocabulary.
  const std::string* piece(std::int32_t id) const;
  std::optional<std::int32_t> id(std::string_view piece) const;
  /// One past the largest id.
  int size() const { return static_cast<int>(pieces_.size()); }
  /// The byte a "<0xXX>" piece stands for, or -1.
  int byte_of(std::int32_t id) const;

 private:
  struct merge_entry {
    std::int32_t rank;
    std::int32_t merged;
  };
  static std::uint64_t pair_key(std::int32_t a, std::int32_t b) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) | static_cast<std::uint32_t>(b);
  }
  void initial_symbols(std::string_view word, std::vector<std::int32_t>& ids) const;

  std::unordered_map<std::string, std::int32_t> vocab_;
  std::vector<std::string> pieces_;  // id -> piece ("" where the id is unused)
  std::unordered_map<std::uint64_t, merge_entry> merges_;
  std::vector<std::int16_t> byte_of_;  // id -> byte for <0xXX> pieces, -1 otherwise
  std::int32_t byte_ids_[256] = {};    // byte -> id of <0xXX>, -1 if absent
  bpe_options options_;
};

}  // namespace conveyor::tokenizer
