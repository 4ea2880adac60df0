#pragma once
// Runs a stage's layer range on a batch of sequences: plan on the host (validate, build index
// arrays), then run the backend's ops over preallocated workspace, never allocating per step.
#include <array>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "conveyor/base/result.hpp"
#include "conveyor/engine/checkpoint.hpp"
#include "conveyor/engine/kv_cache.hpp"
#include "conveyor/engine/model_config.hpp"
#include "conveyor/engine/stage.hpp"
#include "conveyor/engine/stage_weights.hpp"
#include "conveyor/engine/step_plan.hpp"
#include "conveyor/kernels/backend.hpp"
#include "conveyor/kernels/collective.hpp"

namespace conveyor::engine {

struct executor_options {
  int max_step_tokens = 1024;  ///< tokens per step the workspace is sized for
  int max_seqs = 256;          ///< sequences per step
  int kv_blocks = 256;         ///< blocks in this stage's KV pools
  int kv_block_size = 16;
  weight_quant_options quant;  ///< int8 / fp8 weights for the linear layers (default: none)
  /// Recorded decode steps (CUDA graphs, one per step shape) kept at most; a new shape past this
  /// evicts the one replayed least recently.
  int max_recorded_steps = 64;
  /// Called after each layer's weights are on the backend (from the loading thread: every rank of a
  /// tensor-parallel stage loads in its own), so a command can show loading progress.
  std::function<void()> on_layer_loaded;
};

/// Called with the residual stream at model layer `index` (index = input of that layer; index ==
/// num_layers is the output of the final norm), [rows, hidden] float32 on the host.
using hidden_observer = std::function<void(int index, std::span<const float> hidden)>;

class stage_executor {
 public:
  /// `collective` (optional) makes this executor one rank of a tensor-parallel group: it loads only
  /// its slice of every layer and sums the row-parallel outputs across the group. Every rank must
  /// run the same plans in the same order.
  static result<std::unique_ptr<stage_executor>> create(kernels::backend& backend, checkpoint& ckpt,
                                                        const model_config& config, stage_range range,
                                                        const executor_options& options,
                                                        kernels::collective* collective = nullptr);
  ~stage_executor();

  /// Runs one step. `hidden_in` is [num_tokens, hidden] float32 for a stage without the embedding
  /// and empty for the first stage. Bad plans (ids out of range, short block tables, too many
  /// tokens) are errors, not crashes.
  result<step_output> run(const step_plan& plan, std::span<const float> hidden_in);
  /// The same step with activations in the backend's own activation dtype (caps().act_dtype), raw,
  /// in host memory the caller owns: what a stage hands to and takes from the transport. No float32
  /// round trip (half the bytes when activations are bf16), and the device copies go straight
  /// from/to the caller's (pinned, reused) buffers. `hidden_in`: [num_tokens, hidden] for a stage
  /// without the embedding, nullptr for the first. `hidden_out`: [num_tokens, hidden] for a stage
  /// without the head, or nullptr to skip the copy (tensor-parallel ranks other than 0); the
  /// returned step_output has no `hidden` then.
  result<step_output> run_raw(const step_plan& plan, const void* hidden_in, void* hidden_out);

  /// The two halves of a step, for a host loop that queues step n+1 before it waits for step n (a
  /// stage with the embedding and the head, no observer; tensor-parallel ranks through
  /// tp_stage::begin, which runs every rank's begin together). begin() validates the step,
  /// queues it and returns without waiting for the device; end() waits for the oldest queued step
  /// and returns its output. At most two steps are queued, and none that reads logits back (run()
  /// those). With `chain`, the step's token ids are the tokens the step queued just before it drew
  /// (its plan's ids are not used): it must name the same sequences in the same order with one
  /// token each, every one sampled once by that step. run() while steps are queued is an error.
  status begin(const step_plan& plan, bool chain);
  result<step_output> end();
  int queued() const { return static_cast<int>(queued_.size()); }
  /// Decode step shapes recorded now (at most options().max_recorded_steps).
  int recorded_steps() const { return static_cast<int>(captures_.size()); }

  /// Test hook: observe the residual stream between layers (slower: it materialises each layer's output).
  void set_observer(hidden_observer observer) { observer_ = std::move(observer); }

  const model_config& config() const { return config_; }
  stage_range range() const { return range_; }
  const executor_options& options() const { return options_; }
  std::size_t weight_bytes() const { return weights_->bytes; }
  std::size_t kv_bytes() const { return kv_.bytes(); }

 private:
  stage_executor(kernels::backend& b, const model_config& c, stage_range r, const executor_options& o)
      : backend_(b), config_(c), range_(r), options_(o) {}
  status validate(const step_plan& plan, std::size_t hidden_values) const;
  /// Which logit row each sequence's drawn token comes from, and the draws' parameters.
  struct draw_rows {
    std::vector<kernels::sample_params> params;
    std::vector<int> last_row_of;   ///< plan index -> row among the first block, or -1
    std::vector<int> early_row_of;  ///< plan index -> first of its earlier rows (verification), or -1
    bool any_logits = false;
  };
  /// What end() needs of a queued step's plan, and where its draw waits.
  struct queued_step {
    struct seq {
      std::int64_t id;
      bool sample;
      int sample_rows;
    };
    std::vector<seq> seqs;
    draw_rows draws;
    int slot = 0;
  };
  static draw_rows plan_draws(const step_plan& plan);
  template <class Seqs>
  static void fill_tokens(const Seqs& seqs, const draw_rows& d, const std::vector<std::int32_t>& drawn,
                          step_output& out);
  result<step_output> run_impl(const step_plan& plan, std::size_t hidden_values, const float* in_f32,
                               const void* in_raw, bool raw_out, void* out_raw);
  /// `fixed_shape`: pad the block tables to the context's bucket, so a recorded step fits every
  /// step of that bucket.
  void upload_plan(const step_plan& plan, bool fixed_shape);
  /// The step's device ops, from the embedding to the LM head (no host transfers).
  status run_ops(int n);
  /// Decode steps (one token per sequence) on a backend that can record them: replays a CUDA graph
  /// per shape, recording it the first time.
  bool capturable(const step_plan& plan) const;
  status run_captured(int n);
  status run_layer(int layer_index, int n, bool first);
  /// The norm a layer's down projection feeds (the next layer's input norm, or the final norm before
  /// the head), or nullptr where the layer ends the stage without a head.
  const kernels::weight* norm_after(int layer_index) const;
  /// True while normed_ already holds the next layer's (or the head's) input: the previous layer's
  /// down projection ran with its residual add and norm (backend linear_add_rmsnorm).
  bool normed_ahead_ = false;
  /// Every layer of a one-token step as the backend's decode_layers, where it has it; false: run them.
  bool run_fused_layers(int n);
  status reduce(void* data, int rows);
  void observe(int index, const void* data, int rows);

  kernels::backend& backend_;
  model_config config_;
  stage_range range_;
  executor_options options_;
  std::unique_ptr<stage_weights> weights_;
  kv_pools kv_;
  device_buffer inv_freq_;
  float attention_scaling_ = 1.0f;
  kernels::attn_shape shape_;
  kernels::collective* collective_ = nullptr;
  int ffn_ = 0;  ///< ffn units of this rank
  int max_blocks_per_seq_ = 0;
  int table_stride_ = 1;  ///< block-table row length of the current step

  // Workspace (activations) and the plan's index arrays, sized once at create.
  device_buffer residual_, normed_, qkv_, attn_, delta_, gate_up_, act_, head_in_, logits_;
  device_buffer plan_ints_;
  std::vector<std::int32_t> host_ints_;
  struct plan_view {
    const std::int32_t *ids, *positions, *slots, *q_start, *ctx_len, *block_table, *logit_rows;
    int num_tokens, num_seqs, num_logit_rows, max_ctx, max_q;
    /// Row-wise attention (the backend's row_invariant_rows covers the step): every token as a
    /// sequence of one query row, its context ending at its own position, its sequence's block table.
    bool row_wise;
    const std::int32_t *row_q_start, *row_ctx_len, *row_block_table;
  } pv_{};
  /// True when a step of `tokens` tokens runs its attention row-wise (see plan_view).
  bool row_wise(int tokens) const;
  hidden_observer observer_;
  std::vector<kernels::layer_ref> layer_refs_;  ///< decode_layers' view of the weights (built once)
  std::vector<float> observe_buf_;
  std::deque<queued_step> queued_;  ///< begun, not yet ended (oldest first)
  int next_slot_ = 0;               ///< the backend draw slot of the next begun step
  /// Recorded decode steps by (tokens, sequences, logit rows, block-table stride), with the replay
  /// count at their last use (the least recently used is evicted first).
  struct recorded_step {
    kernels::capture_id id;
    std::uint64_t used;
  };
  std::map<std::array<int, 4>, recorded_step> captures_;
  std::uint64_t replays_ = 0;
};

}  // namespace conveyor::engine
