#pragma once
// Speculative decoding over two local pipelines: a small draft model proposes k tokens one at a
// time, the target checks all of them in one forward pass (k + 1 positions of each sequence, a short
// prefill chunk on top of its KV) and keeps the accepted prefix plus one token of its own. Rejected
// positions are rolled back in both KV caches.
#include <cstdint>
#include <vector>

#include "conveyor/base/result.hpp"
#include "conveyor/engine/local_pipeline.hpp"

namespace conveyor::engine {

struct speculative_options {
  int k = 4;  ///< draft tokens proposed per target step
  /// Sampled requests: true = rejection sampling (the target's distribution, the most accepted
  /// tokens); false = keep drafts equal to the target's own seeded draw (the exact tokens of plain
  /// decoding with that seed, fewer accepted). Greedy requests are exact either way.
  bool rejection_sampling = true;
};

struct speculative_stats {
  std::int64_t target_steps = 0;  ///< verification passes of the target (each one a pipeline step)
  std::int64_t draft_steps = 0;   ///< draft pipeline steps
  std::int64_t proposed = 0;      ///< draft tokens checked by the target
  std::int64_t accepted = 0;      ///< of them kept
  std::int64_t emitted = 0;       ///< tokens produced (accepted + the target's own)
  double draft_seconds = 0.0;
  double target_seconds = 0.0;
  double acceptance_rate() const { return proposed ? static_cast<double>(accepted) / proposed : 0.0; }
  std::int64_t rounds = 0;  ///< verification rounds, summed over sequences
  /// Tokens a sequence gains per verification round (per target step once the prompt is in); plain
  /// decoding gains 1.
  double tokens_per_target_step() const { return rounds ? static_cast<double>(emitted) / rounds : 0.0; }
};

class speculative_decoder {
 public:
  /// Errors when the two models cannot share tokens (different vocabularies).
  static result<std::unique_ptr<speculative_decoder>> create(local_pipeline& target, local_pipeline& draft,
                                                             const speculative_options& options);

  /// The same contract as local_pipeline::generate; greedy results are identical to it.
  result<std::vector<generation_result>> generate(const std::vector<generation_request>& requests);

  /// Counters of the last generate() call.
  const speculative_stats& stats() const { return stats_; }

 private:
  speculative_decoder(local_pipeline& t, local_pipeline& d, const speculative_options& o)
      : target_(t), draft_(d), options_(o) {}

  local_pipeline& target_;
  local_pipeline& draft_;
  speculative_options options_;
  speculative_stats stats_;
  std::int64_t next_seq_id_ = 1;
};

}  // namespace conveyor::engine
