#pragma once
// Prompt lookup (vLLM's `ngram` speculative method): the guess for what follows a sequence is what
// followed the latest earlier occurrence of its last n tokens, for the longest n in [min_n, max_n]
// that occurs. Pure functions and a read-only index, unit-tested on their own (ngram_proposer uses them).
#include <cstdint>
#include <span>
#include <vector>

namespace conveyor::engine {

/// Up to k tokens that followed the latest earlier occurrence of `tokens`' last n tokens within
/// `tokens` itself, trying n = max_n down to min_n; empty when none occurs. The continuation may run
/// into the suffix itself (a repeating pattern continues), and is cut at the end of `tokens`.
std::vector<std::int32_t> lookup_in_sequence(std::span<const std::int32_t> tokens, int min_n, int max_n, int k);

/// The same lookup in a fixed corpus of token ids (a datastore, as REST does): for each n in
/// [min_n, max_n] a sorted table of the n-grams' hashes and the position after their latest
/// occurrence, so a lookup costs a binary search, not a scan.
class ngram_index {
 public:
  ngram_index() = default;
  ngram_index(std::vector<std::int32_t> corpus, int min_n, int max_n);

  /// Up to k tokens that followed an occurrence of `pattern` (min_n..max_n tokens) in the corpus:
  /// the latest of those followed by the pattern's most frequent next token. Empty when it does
  /// not occur (or has nothing after it).
  std::span<const std::int32_t> continuation(std::span<const std::int32_t> pattern, int k) const;

  std::size_t size() const { return corpus_.size(); }
  const std::vector<std::int32_t>& corpus() const { return corpus_; }

 private:
  struct entry {
    std::uint64_t hash;
    std::uint32_t next;  ///< corpus position right after the n-gram
  };
  std::vector<std::int32_t> corpus_;
  int min_n_ = 0;
  std::vector<std::vector<entry>> tables_;  ///< [n - min_n], sorted by hash, one entry per hash
};

/// The hash the index keys n-grams by.
std::uint64_t ngram_hash(std::span<const std::int32_t> tokens);

}  // namespace conveyor::engine
