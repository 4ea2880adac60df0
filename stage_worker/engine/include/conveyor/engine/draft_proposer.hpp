#pragma once
// The draft-model proposer of speculative decoding: a local pipeline of the draft model that, given
// a sequence's token history, proposes its next k tokens one draft step at a time. It keeps each
// sequence's draft KV between calls and rolls it back by itself to the longest prefix of the
// history it has seen (rejected drafts, preemption), so its user only reports retirements.
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "conveyor/engine/local_pipeline.hpp"
#include "conveyor/engine/token_proposer.hpp"

namespace conveyor::engine {

class draft_proposer final : public token_proposer {
 public:
  /// Owns the draft pipeline.
  explicit draft_proposer(std::unique_ptr<local_pipeline> draft) : owned_(std::move(draft)), draft_(*owned_) {}
  /// Borrows it (it must outlive the proposer).
  explicit draft_proposer(local_pipeline& draft) : draft_(draft) {}

  /// Empty proposals where the draft's KV was full (or the draft step failed).
  std::vector<proposal> propose(const std::vector<draft_query>& queries) override;
  /// Frees a retired sequence's draft KV.
  void forget(std::int64_t seq) override;
  /// The draft's vocabulary must be the target's.
  status check_vocabulary(int vocab_size) const override;
  const draft_counters& counters() const override { return counters_; }

  const model_config& config() const { return draft_.config(); }

 private:
  void forget_all();

  std::unique_ptr<local_pipeline> owned_;
  local_pipeline& draft_;
  std::unordered_map<std::int64_t, std::vector<std::int32_t>> fed_;  ///< tokens in each sequence's draft KV
  draft_counters counters_;
};

}  // namespace conveyor::engine
