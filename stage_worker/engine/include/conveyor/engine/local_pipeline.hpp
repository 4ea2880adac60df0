#pragma once
// K consecutive stages in one process, activations handed from one to the next: the engine's own
// driver for `conveyor generate`, the golden tests and the GPU benchmarks (no actors involved).
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "conveyor/base/result.hpp"
#include "conveyor/engine/executor.hpp"
#include "conveyor/engine/kv_cache.hpp"
#include "conveyor/engine/tp_stage.hpp"

namespace conveyor::engine {

struct generation_request {
  std::vector<std::int32_t> prompt;
  int max_new_tokens = 16;
  kernels::sample_params sampling;  ///< step is filled in per token
  bool stop_at_eos = true;
};

struct generation_result {
  std::vector<std::int32_t> tokens;
  std::string finish_reason;  ///< "length" or "stop"
};

class local_pipeline {
 public:
  /// Loads the model in `model_dir` split into `stages` even layer ranges. `keep_layers` > 0 loads
  /// only the first keep_layers layers, then the model's own final norm and LM head: a draft model
  /// for speculative decoding made of the target itself (same vocabulary, often the same top token).
  static result<std::unique_ptr<local_pipeline>> create(kernels::backend& backend, const std::string& model_dir,
                                                        int stages, const executor_options& options,
                                                        int keep_layers = 0);
  /// The same with every stage a tensor-parallel group of rank_backends.size() ranks (rank r runs on
  /// rank_backends[r], in its own thread); `make_group` provides each stage's collectives.
  static result<std::unique_ptr<local_pipeline>> create(const std::vector<kernels::backend*>& rank_backends,
                                                        const std::string& model_dir, int stages,
                                                        const executor_options& options,
                                                        const tp_group_factory& make_group, int keep_layers = 0);

  /// Runs one step through every stage.
  result<step_output> step(const step_plan& plan);
  /// A step in two halves, for a host loop that queues step n+1 before it waits for step n
  /// (stage_executor::begin / end say what may be queued and chained): one stage (of any number of
  /// tensor-parallel ranks) only.
  status begin_step(const step_plan& plan, bool chain);
  result<step_output> end_step();
  /// True where begin_step/end_step work (one stage); generate() then overlaps steps.
  bool can_queue_steps() const { return stages_.size() == 1; }

  /// Generates for all requests together: prompts are prefilled in chunks of at most
  /// max_step_tokens, then every running sequence decodes one token per step. Where steps can be
  /// queued, a decode step of every running sequence is followed at once by the next one, chained
  /// on the device to its draw, before the host waits for it; a sequence that stops (EOS) then has
  /// one token computed in vain, which is dropped.
  result<std::vector<generation_result>> generate(const std::vector<generation_request>& requests);

  const model_config& config() const { return config_; }
  const executor_options& options() const { return options_; }
  /// Wall time of every step of the last generate() call, in order (the first ones are prefill).
  const std::vector<double>& last_step_seconds() const { return step_seconds_; }
  kv_block_manager& blocks() { return blocks_; }
  /// The stages, first to last (each a tensor-parallel group; rank0() is the stage's executor).
  std::vector<std::unique_ptr<tp_stage>>& stages() { return stages_; }
  int tp() const { return stages_.empty() ? 1 : stages_[0]->tp(); }

 private:
  local_pipeline(model_config c, const executor_options& o)
      : config_(std::move(c)), options_(o), blocks_(o.kv_blocks, o.kv_block_size) {}

  model_config config_;
  executor_options options_;
  kv_block_manager blocks_;
  std::vector<std::unique_ptr<tp_stage>> stages_;
  std::int64_t next_seq_id_ = 1;
  std::vector<double> step_seconds_;
};

}  // namespace conveyor::engine
