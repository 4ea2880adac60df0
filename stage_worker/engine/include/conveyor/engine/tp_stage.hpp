#pragma once
// One pipeline stage as a tensor-parallel group inside one process: an executor per rank (each on
// its own backend, e.g. its own GPU), joined by a collective. Every rank runs every step in its own
// thread; the all-reduces keep their activations identical, so rank 0's output is the stage's. With
// one rank it is simply the stage's executor. Used by local_pipeline and by the stage worker.
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "conveyor/base/result.hpp"
#include "conveyor/engine/executor.hpp"
#include "conveyor/kernels/collective.hpp"

namespace conveyor::engine {

/// Makes the collectives of one tensor-parallel group of `size` ranks (one per rank, rank order).
using tp_group_factory = std::function<result<std::vector<std::unique_ptr<kernels::collective>>>(int size)>;

class tp_stage {
 public:
  /// rank_backends.size() ranks; `make_group` is called once when there is more than one.
  static result<std::unique_ptr<tp_stage>> create(const std::vector<kernels::backend*>& rank_backends,
                                                  checkpoint& ckpt, const model_config& config, stage_range range,
                                                  const executor_options& options, const tp_group_factory& make_group);

  /// Runs one step on every rank; the first rank error wins.
  result<step_output> run(const step_plan& plan, std::span<const float> hidden);
  /// The same with raw activations (stage_executor::run_raw): every rank reads `hidden_in`, rank 0
  /// writes `hidden_out`.
  result<step_output> run_raw(const step_plan& plan, const void* hidden_in, void* hidden_out);
  /// Queued steps (stage_executor::begin / end) on every rank, for a stage with the embedding and
  /// the head: begin() has each rank queue its part of the step (on GPUs the all-reduces run on the
  /// devices, so it returns before the step ends), end() waits for the oldest queued step on every
  /// rank and returns rank 0's output. The ranks hold identical logits and draw with the same
  /// parameters, so each rank chains its own draw into its next step.
  status begin(const step_plan& plan, bool chain);
  result<step_output> end();
  int queued() const { return ranks_[0]->queued(); }
  /// The dtype of run_raw's activations (the ranks' backends agree on it).
  kernels::dtype act_dtype() const { return act_dtype_; }

  stage_executor& rank0() { return *ranks_[0]; }
  int tp() const { return static_cast<int>(ranks_.size()); }
  /// Weight bytes over all ranks.
  std::size_t weight_bytes() const;

 public:
  ~tp_stage();

 private:
  tp_stage() = default;
  class rank_threads;
  std::vector<std::unique_ptr<kernels::collective>> group_;  // outlives the executors that use it
  std::vector<std::unique_ptr<stage_executor>> ranks_;
  /// Ranks 1.. run each step on threads that live as long as the stage (declared after ranks_: they
  /// stop before the executors go).
  std::unique_ptr<rank_threads> threads_;
  kernels::dtype act_dtype_ = kernels::dtype::f32;
  template <class F>
  result<step_output> on_every_rank(F run_rank);
};

}  // namespace conveyor::engine
