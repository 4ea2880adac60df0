#pragma once
// The draft side of speculative decoding for a serving scheduler: a local pipeline of the draft
// model that, given a sequence's token history, proposes its next k tokens. It keeps each
// sequence's draft KV between calls and rolls it back by itself to the longest prefix of the
// history it has seen (rejected drafts, preemption), so the scheduler only reports retirements.
#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "conveyor/base/result.hpp"
#include "conveyor/engine/local_pipeline.hpp"

namespace conveyor::engine {

struct draft_query {
  std::int64_t seq = 0;
  std::span<const std::int32_t> history;  ///< prompt + generated tokens, the last one not yet verified
  kernels::sample_params sampling;        ///< the request's; drafts draw with its seed (exact matching)
  int k = 0;                              ///< tokens wanted
};

struct draft_counters {
  std::int64_t steps = 0;
  double seconds = 0.0;
  std::int64_t out_of_memory = 0;  ///< calls that found the draft KV full (and proposed nothing)
};

class draft_proposer {
 public:
  explicit draft_proposer(std::unique_ptr<local_pipeline> draft) : draft_(std::move(draft)) {}

  /// Proposals for each query, in order (empty where none could be made: the draft's KV was full;
  /// speculation is an optimisation, so that is not an error).
  std::vector<std::vector<std::int32_t>> propose(const std::vector<draft_query>& queries);
  /// Frees a retired sequence's draft KV.
  void forget(std::int64_t seq);

  const model_config& config() const { return draft_->config(); }
  const draft_counters& counters() const { return counters_; }

 private:
  void forget_all();

  std::unique_ptr<local_pipeline> draft_;
  std::unordered_map<std::int64_t, std::vector<std::int32_t>> fed_;  ///< tokens in each sequence's draft KV
  draft_counters counters_;
};

}  // namespace conveyor::engine
