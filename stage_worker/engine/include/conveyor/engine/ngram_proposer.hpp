#pragma once
// The n-gram proposer of speculative decoding (prompt lookup decoding, vLLM's `ngram` method),
// optionally with a datastore (REST-style): for n = max_n down to min_n, the k tokens that followed
// the latest earlier occurrence of the sequence's last n tokens in the sequence itself (prompt +
// generated), or else in the corpus (there the latest occurrence followed by the n-gram's most
// frequent next token). No model runs, so a proposal costs microseconds; it pays where
// the output repeats its context (code edits, quoting, summaries) or a known text.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "conveyor/engine/ngram_match.hpp"
#include "conveyor/engine/token_proposer.hpp"

namespace conveyor::engine {

struct ngram_options {
  /// Lengths of the suffix matched, longest first. A 1-token match guesses often and wrongly;
  /// every wrong guess still costs a verification row.
  int min_n = 2;
  int max_n = 4;
};

class ngram_proposer final : public token_proposer {
 public:
  /// Errors when min_n/max_n are out of [1, max_ngram] or min_n > max_n, or the corpus holds a
  /// negative id. `corpus` may be empty (prompt lookup alone).
  static result<std::unique_ptr<ngram_proposer>> create(const ngram_options& options, std::vector<std::int32_t> corpus);
  static constexpr int max_ngram = 64;

  std::vector<proposal> propose(const std::vector<draft_query>& queries) override;
  void forget(std::int64_t) override {}  // nothing kept per sequence
  /// Every corpus id must be a token of the target.
  status check_vocabulary(int vocab_size) const override;
  const draft_counters& counters() const override { return counters_; }

  const ngram_options& options() const { return options_; }
  std::size_t corpus_size() const { return index_.size(); }

 private:
  ngram_proposer(const ngram_options& o, std::vector<std::int32_t> corpus)
      : options_(o), index_(std::move(corpus), o.min_n, o.max_n) {}

  std::vector<std::int32_t> lookup(std::span<const std::int32_t> history, int k) const;

  ngram_options options_;
  ngram_index index_;
  std::int32_t max_corpus_id_ = -1;
  draft_counters counters_;
};

/// An n-gram proposer whose corpus is the token-id file at `corpus_path` (empty = no corpus).
result<std::unique_ptr<ngram_proposer>> make_ngram_proposer(const ngram_options& options, const std::string& corpus_path);

/// Reads a corpus of token ids: decimal ids separated by whitespace (or commas). Errors name the
/// file and the first thing that is not an id.
result<std::vector<std::int32_t>> read_token_ids(const std::string& path);

}  // namespace conveyor::engine
