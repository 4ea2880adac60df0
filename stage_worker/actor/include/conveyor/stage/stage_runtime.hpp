#pragma once
// Everything a stage worker does besides talking to the coordinator, in plain C++ (no CAF): the
// stage's executor, its UCX context and channels to the neighbouring stages, and the compute thread
// that takes a step (from the coordinator for stage 0, from the upstream channel otherwise), runs
// the layers and passes the activations on, or, on the last stage, reports the sampled tokens.
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "conveyor/base/result.hpp"
#include "conveyor/engine/executor.hpp"
#include "conveyor/engine/memory_plan.hpp"
#include "conveyor/engine/tp_stage.hpp"
#include "conveyor/engine/warm_up.hpp"
#include "conveyor/stage/hop_meter.hpp"
#include "conveyor/transport/staging_pool.hpp"
#include "conveyor/transport/ucx_context.hpp"

namespace conveyor::stage {

struct stage_runtime_options {
  std::string model_dir;
  int stage = 0;
  int num_stages = 1;
  engine::stage_range range;
  /// executor.kv_blocks 0: the KV pool is planned by engine::plan_memory with kv_plan on each rank's
  /// device (the least over the ranks), and the load fails with the plan's message where fewer than
  /// kv_plan.min_blocks fit.
  engine::executor_options executor;
  engine::memory_plan_options kv_plan;
  transport::ucx_config ucx;
  std::uint64_t max_frame_bytes = std::uint64_t{1} << 30;
  int max_sends_in_flight = 4;  ///< activation frames not yet taken by the next stage
  /// Element type of the activations this stage sends. Default: the stage's own activation dtype
  /// (bf16 on a bf16 GPU stage: half the bytes of f32, and exact, since that is what the device
  /// holds); f32 forces the float32 wire. The frame header carries it; the receiver converts.
  std::optional<kernels::dtype> wire_dtype;
  /// Throwaway steps run at load, after the weights (engine::warm_up), where decode_batches names
  /// any (none by default).
  engine::warm_up_options warm_up;
  /// Test only: sleep this long in every step, to make pipelining measurable on tiny models.
  std::chrono::microseconds step_delay{0};
};

/// Busy and idle time of the compute thread (the bubble is the idle part).
struct stage_timings {
  double busy_s = 0.0;
  double idle_s = 0.0;
  std::uint64_t steps = 0;
};

class stage_runtime {
 public:
  /// microbatch, step (the coordinator's number, so it can tell a stale step from a current one),
  /// sampled tokens (last stage only).
  using tokens_callback = std::function<void(std::uint64_t, std::uint64_t, std::vector<std::int32_t>)>;
  /// microbatch and step (both UINT64_MAX when the stage as a whole broke), what went wrong.
  using failure_callback = std::function<void(std::uint64_t, std::uint64_t, std::string)>;

  /// Loads the stage's layers and opens its UCX worker. Slow (reads weights); not on an actor thread.
  /// With several backends the stage is a tensor-parallel group (rank r on rank_backends[r],
  /// joined by the collectives `make_group` makes); only rank 0's activations travel on.
  static result<std::unique_ptr<stage_runtime>> create(const std::vector<kernels::backend*>& rank_backends,
                                                       const stage_runtime_options& o,
                                                       const engine::tp_group_factory& make_group);
  ~stage_runtime();

  const transport::worker_address& address() const { return ucx_->address(); }
  std::size_t weight_bytes() const { return stage_->weight_bytes(); }
  /// KV blocks of each rank's pool (as planned where the options asked for 0).
  int kv_blocks() const { return options_.executor.kv_blocks; }
  /// What the load adds for the log ("warm-up: 8 steps in 0.412 s"), or empty.
  const std::string& load_note() const { return load_note_; }

  /// Opens the channels to the neighbouring stages (either may be absent) and starts the compute
  /// thread. Blocks until both peers answered; upstream first so a chain of stages wires in order.
  /// After detach(), wires again: a peer given for a side whose channel is still open is ignored.
  status wire(const std::optional<transport::worker_address>& upstream,
              const std::optional<transport::worker_address>& downstream, tokens_callback on_tokens,
              failure_callback on_failure);
  /// How stage 0 runs a step from the coordinator. plain: run it and report its tokens. Queued
  /// steps (a stage with the embedding and the head, on every rank; protocol.hpp's qstep): hold begins
  /// it on the device and keeps it; chain begins it with the ids the held step draws, then ends the
  /// held one; flush (no header) ends the held one. Ending a step reports its tokens.
  enum class step_mode : std::int32_t { plain = 0, hold = 1, chain = 2, flush = 3 };
  /// Stage 0: queue a step whose encoded header came from the coordinator.
  void submit(std::vector<std::byte> header_bytes, step_mode mode = step_mode::plain);
  /// A neighbour died: stops the compute thread, forgets queued steps and activations not yet
  /// taken, and closes the channel(s) to the dead neighbour, so wire() can open new ones to its
  /// replacement. Blocking (joins the thread); not on an actor thread.
  void detach(bool drop_upstream, bool drop_downstream);
  void stop();
  stage_timings timings() const;
  /// Activation frames to the next stage and from the previous one (metrics, issue 9).
  hop_counters hop_metrics() const { return hops_.read(); }

 private:
  stage_runtime() = default;
  std::string load_note_;
  void loop();
  bool next_input(transport::frame& out, step_mode& mode);
  status run_step(transport::frame& in);
  /// Queued steps: begin `in` (chained to the held step or not) and hold it.
  status begin_step(const transport::frame& in, bool chain);
  /// Ends the oldest held step and reports its tokens (or its failure).
  void end_held();
  /// Reports that this stage could not run step `step` of microbatch `mb`, and why.
  void fail_step(std::uint64_t mb, std::uint64_t step, const std::string& why);

  stage_runtime_options options_;
  std::unique_ptr<engine::tp_stage> stage_;
  std::unique_ptr<transport::ucx_context> ucx_;
  std::unique_ptr<transport::channel> upstream_, downstream_;
  tokens_callback on_tokens_;
  failure_callback on_failure_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::vector<std::byte>, step_mode>> inbox_;  ///< stage 0's steps
  /// Queued steps begun and not ended (at most two: the held one and the one chained to it), with
  /// what their tokens need and, with step_delay, when the emulated device finishes each.
  struct held_step {
    engine::step_plan plan;
    std::uint64_t microbatch = 0, step = 0;
    std::chrono::steady_clock::time_point ready_at;
  };
  std::deque<held_step> held_;
  std::chrono::steady_clock::time_point queued_since_;  ///< when held_ last became non-empty
  struct pending_send {
    transport::staging_pool::buffer staging;  ///< the frame's payload, back to the pool when sent
    transport::send_handle handle;
  };
  /// Reused (pinned on a GPU stage) buffers for outgoing activations, and the receive-side
  /// conversion buffer for frames in another dtype than this stage computes in.
  std::unique_ptr<transport::staging_pool> staging_;
  std::vector<std::byte> convert_in_;
  std::deque<pending_send> sends_;
  std::atomic<bool> stopping_{false};
  std::atomic<std::uint64_t> busy_ns_{0}, idle_ns_{0}, steps_{0};
  hop_meter hops_;
  std::thread thread_;
};

}  // namespace conveyor::stage
