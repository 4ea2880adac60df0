#pragma once
// Speculative decoding over a local pipeline: a proposer (a small draft model, or n-gram lookup)
// guesses k tokens, the target checks all of them in one forward pass (k + 1 positions of each
// sequence, a short prefill chunk on top of its KV) and keeps the accepted prefix plus one token of
// its own. Rejected positions are rolled back in the target's KV (the proposer rolls back its own).
#include <cstdint>
#include <memory>
#include <vector>

#include "conveyor/base/result.hpp"
#include "conveyor/engine/local_pipeline.hpp"
#include "conveyor/engine/token_proposer.hpp"

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
  std::int64_t draft_steps = 0;   ///< draft pipeline steps (0 for a proposer without a model)
  std::int64_t proposed = 0;      ///< draft tokens checked by the target
  std::int64_t accepted = 0;      ///< of them kept
  std::int64_t emitted = 0;       ///< tokens produced (accepted + the target's own)
  double draft_seconds = 0.0;  ///< time spent proposing
  double target_seconds = 0.0;
  double acceptance_rate() const { return proposed ? static_cast<double>(accepted) / proposed : 0.0; }
  std::int64_t rounds = 0;  ///< verification rounds, summed over sequences
  /// Tokens a sequence gains per verification round (per target step once the prompt is in); plain
  /// decoding gains 1.
  double tokens_per_target_step() const { return rounds ? static_cast<double>(emitted) / rounds : 0.0; }
};

class speculative_decoder {
 public:
  /// Errors when the two models cannot share tokens (different vocabularies). The draft model is
  /// borrowed and must outlive the decoder.
  static result<std::unique_ptr<speculative_decoder>> create(local_pipeline& target, local_pipeline& draft,
                                                             const speculative_options& options);
  /// Any proposer (borrowed, must outlive the decoder); errors when its tokens may fall outside the
  /// target's vocabulary.
  static result<std::unique_ptr<speculative_decoder>> create(local_pipeline& target, token_proposer& proposer,
                                                             const speculative_options& options);

  /// The same contract as local_pipeline::generate; greedy results are identical to it.
  result<std::vector<generation_result>> generate(const std::vector<generation_request>& requests);

  /// Counters of the last generate() call.
  const speculative_stats& stats() const { return stats_; }

 private:
  speculative_decoder(local_pipeline& t, std::unique_ptr<token_proposer> owned, token_proposer& p,
                      const speculative_options& o)
      : target_(t), owned_(std::move(owned)), proposer_(p), options_(o) {}

  local_pipeline& target_;
  std::unique_ptr<token_proposer> owned_;  ///< the draft_proposer made for a draft model
  token_proposer& proposer_;
  speculative_options options_;
  speculative_stats stats_;
  std::int64_t next_seq_id_ = 1;
};

}  // namespace conveyor::engine
