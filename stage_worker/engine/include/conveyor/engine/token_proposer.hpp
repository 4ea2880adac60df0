#pragma once
// What speculative decoding asks of its proposer: given a sequence's tokens, guess the next k. Two
// implementations: draft_proposer (a small draft model of the same vocabulary) and ngram_proposer
// (prompt lookup: the tokens that followed the latest earlier occurrence of the sequence's last n
// tokens, in the sequence itself or in a corpus). The target verifies whatever is proposed, so a
// proposer only decides how fast decoding goes, never what it produces.
#include <cstdint>
#include <span>
#include <vector>

#include "conveyor/base/result.hpp"
#include "conveyor/kernels/backend.hpp"

namespace conveyor::engine {

struct draft_query {
  std::int64_t seq = 0;
  std::span<const std::int32_t> history;  ///< prompt + generated tokens, the last one not yet verified
  kernels::sample_params sampling;        ///< the request's; drafts draw with its seed (exact matching)
  int k = 0;                              ///< tokens wanted (at most)
  /// Rejection sampling will judge the drafts of a sampled request: a proposer that draws them
  /// from a distribution draws independently of the target (engine::draft_seed) and reports it.
  bool rejection_sampling = false;
};

struct proposal {
  std::vector<std::int32_t> tokens;  ///< at most k; empty = nothing to propose
  /// One row per token: the distribution over the vocabulary it was drawn from, where the query
  /// asked for rejection sampling and the proposer draws. Empty = each token was chosen outright
  /// (its distribution is one-hot on it).
  std::vector<std::vector<double>> q;
};

struct draft_counters {
  std::int64_t steps = 0;  ///< draft model steps (0 for proposers without a model)
  double seconds = 0.0;    ///< time spent proposing
  std::int64_t out_of_memory = 0;  ///< calls that found the draft KV full (and proposed nothing)
};

class token_proposer {
 public:
  virtual ~token_proposer() = default;

  /// Proposals for each query, in order. A proposal may be shorter than asked or empty
  /// (speculation is an optimisation: no guess is not an error).
  virtual std::vector<proposal> propose(const std::vector<draft_query>& queries) = 0;
  /// A sequence has retired: drop what is kept for it.
  virtual void forget(std::int64_t seq) = 0;
  /// Errors when proposals could hold tokens outside a target vocabulary of `vocab_size` ids.
  virtual status check_vocabulary(int vocab_size) const = 0;
  virtual const draft_counters& counters() const = 0;
};

}  // namespace conveyor::engine
