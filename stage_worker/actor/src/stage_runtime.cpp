#include "conveyor/stage/stage_runtime.hpp"

#include <algorithm>
#include <climits>
#include <cstring>
#include <thread>
#include <utility>

#include "conveyor/engine/checkpoint.hpp"
#include "conveyor/engine/tensor_parallel.hpp"
#include "conveyor/engine/speculative_sampling.hpp"
#include "conveyor/stage/plan_convert.hpp"
#include "conveyor/transport/frame_codec.hpp"

namespace conveyor::stage {

namespace {
using steady = std::chrono::steady_clock;
std::uint64_t ns_since(steady::time_point t) {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(steady::now() - t).count());
}
constexpr std::uint64_t whole_stage = UINT64_MAX;

/// KV blocks every rank can hold: the least of the ranks' memory plans, each for its slice of the
/// heads and FFN (the embedding and head are counted whole, which only errs towards fewer blocks).
result<int> kv_blocks_from_memory(const std::vector<kernels::backend*>& rank_backends, const engine::model_config& config,
                                  const stage_runtime_options& o) {
  int blocks = INT_MAX;
  const int tp = static_cast<int>(rank_backends.size());
  for (int r = 0; r < tp; ++r) {
    CONVEYOR_TRY_ASSIGN(layout, engine::make_tp_layout(config, r, tp));
    engine::model_config slice = config;
    slice.num_heads = layout.heads;
    slice.num_kv_heads = layout.kv_heads;
    slice.intermediate_size = layout.ffn;
    auto plan = engine::plan_memory(*rank_backends[static_cast<std::size_t>(r)], slice, {o.range}, o.executor, o.kv_plan);
    if (!plan) return make_error(plan.err().code, "stage " + std::to_string(o.stage) + (tp > 1 ? " rank " + std::to_string(r) : "") +
                                                      ": " + plan.err().message + " (serving.kv_memory_fraction)");
    blocks = std::min(blocks, plan->kv_blocks);
  }
  return blocks;
}
}  // namespace

result<std::unique_ptr<stage_runtime>> stage_runtime::create(const std::vector<kernels::backend*>& rank_backends,
                                                             const stage_runtime_options& o,
                                                             const engine::tp_group_factory& make_group) {
  std::unique_ptr<stage_runtime> rt(new stage_runtime());
  rt->options_ = o;
  CONVEYOR_TRY_ASSIGN(config, engine::load_model_config(o.model_dir));
  CONVEYOR_TRY_ASSIGN(ckpt, engine::checkpoint::open(o.model_dir));
  if (o.executor.kv_blocks == 0) {
    CONVEYOR_TRY_ASSIGN(blocks, kv_blocks_from_memory(rank_backends, config, o));
    rt->options_.executor.kv_blocks = blocks;
  }
  CONVEYOR_TRY_ASSIGN(stage, engine::tp_stage::create(rank_backends, ckpt, config, o.range, rt->options_.executor,
                                                      make_group));
  rt->stage_ = std::move(stage);
  if (!o.warm_up.decode_batches.empty()) {
    auto warm = engine::warm_up(*rt->stage_, o.warm_up);
    if (!warm) {
      return make_error(warm.err().code, "stage " + std::to_string(o.stage) + ": warm-up at load: " +
                                             warm.err().message + " (serving.warm_up = false skips it)");
    }
    rt->load_note_ = warm->describe();
  }
  // Page-locked staging only where a device copies into it: on a CPU stage it would only pin memory
  // (and create a CUDA context) for nothing.
  bool device = !rank_backends.empty() && !rank_backends[0]->caps().host_memory;
  rt->staging_ = std::make_unique<transport::staging_pool>(static_cast<std::size_t>(o.max_sends_in_flight) + 2, device);
  CONVEYOR_TRY_ASSIGN(ucx, transport::ucx_context::create(o.ucx));
  rt->ucx_ = std::move(ucx);
  return rt;
}

stage_runtime::~stage_runtime() { stop(); }

status stage_runtime::wire(const std::optional<transport::worker_address>& upstream,
                           const std::optional<transport::worker_address>& downstream, tokens_callback on_tokens,
                           failure_callback on_failure) {
  // Channel k joins stage k-1 to stage k; both ends name it the same way.
  auto open = [&](const transport::worker_address& peer, int channel) -> result<std::unique_ptr<transport::channel>> {
    transport::channel_options co;
    co.channel_id = static_cast<std::uint64_t>(channel);
    co.max_payload_bytes = options_.max_frame_bytes;
    return ucx_->connect(peer, co);
  };
  if (thread_.joinable()) return make_error(errc::internal, "wire: the stage is running; detach it first");
  if (upstream && !upstream_) {
    CONVEYOR_TRY_ASSIGN(ch, open(*upstream, options_.stage));
    upstream_ = std::move(ch);
  }
  if (downstream && !downstream_) {
    CONVEYOR_TRY_ASSIGN(ch, open(*downstream, options_.stage + 1));
    downstream_ = std::move(ch);
  }
  on_tokens_ = std::move(on_tokens);
  on_failure_ = std::move(on_failure);
  thread_ = std::thread([this] { loop(); });
  return ok_status();
}

void stage_runtime::submit(std::vector<std::byte> header_bytes, step_mode mode) {
  {
    std::lock_guard lock(mu_);
    inbox_.emplace_back(std::move(header_bytes), mode);
  }
  cv_.notify_one();
}

void stage_runtime::detach(bool drop_upstream, bool drop_downstream) {
  stopping_ = true;
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  {
    std::lock_guard lock(mu_);
    inbox_.clear();  // steps of before the failure: the coordinator plans them again
  }
  // Closing a channel fails what is still pending on it, so its sends end at once.
  if (drop_downstream) downstream_.reset();
  if (drop_upstream) upstream_.reset();
  for (auto& s : sends_) (void)s.handle.wait(transport::after(std::chrono::seconds(2)));
  sends_.clear();
  stopping_ = false;
}

void stage_runtime::stop() {
  stopping_ = true;
  hops_.stop();
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (auto& s : sends_) (void)s.handle.wait(transport::after(std::chrono::seconds(2)));
  sends_.clear();
}

stage_timings stage_runtime::timings() const {
  return {static_cast<double>(busy_ns_.load()) * 1e-9, static_cast<double>(idle_ns_.load()) * 1e-9, steps_.load()};
}

bool stage_runtime::next_input(transport::frame& out, step_mode& mode) {
  const auto t0 = steady::now();
  mode = step_mode::plain;
  while (!stopping_) {
    if (upstream_) {
      // Into the loop's frame: a small frame lands in the buffers of the one before (no allocation).
      const status got = upstream_->receive_into(out, transport::clock::duration(std::chrono::milliseconds(200)));
      if (got.ok()) {
        hops_.received(out.payload.size());
        idle_ns_ += ns_since(t0);  // (a stage that receives frames never holds queued steps)
        return true;
      }
      if (!upstream_->health().ok()) {
        on_failure_(whole_stage, whole_stage, "stage " + std::to_string(options_.stage) + " lost stage " +
                                     std::to_string(options_.stage - 1) + " upstream: " + upstream_->health().err().message);
        return false;
      }
      if (got.err().code != errc::io && got.err().message.find("deadline") == std::string::npos) {
        // A malformed frame: the channel stays usable, but the step it carried is lost.
        fail_step(whole_stage, whole_stage, got.err().message);
      }
      continue;
    }
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, std::chrono::milliseconds(200), [&] { return stopping_ || !inbox_.empty(); })) continue;
    if (stopping_) break;
    auto [bytes, m] = std::move(inbox_.front());
    inbox_.pop_front();
    lock.unlock();
    mode = m;
    // Idle is the time with nothing to do: not while a queued step runs on the device.
    if (held_.empty()) idle_ns_ += ns_since(t0);
    if (mode == step_mode::flush) return true;  // no step of its own: ends the held one
    auto header = transport::decode_header(bytes);
    if (!header) {
      fail_step(whole_stage, whole_stage, "bad step from the coordinator: " + header.err().message);
      continue;
    }
    out.header = std::move(header).value();
    out.header_bytes = std::move(bytes);
    return true;
  }
  return false;
}

status stage_runtime::run_step(transport::frame& in) {
  const engine::step_plan plan = to_step_plan(in.header);
  const kernels::dtype act = stage_->act_dtype();
  const std::int64_t hidden_size = stage_->rank0().config().hidden_size;
  const std::size_t values = static_cast<std::size_t>(plan.num_tokens()) * static_cast<std::size_t>(hidden_size);
  const void* hidden_in = nullptr;
  if (!options_.range.has_embedding) {
    // The frame is external input: its shape and dtype decide how many bytes the device reads.
    const auto& t = in.header.tensor;
    if (t.shape.size() != 2 || t.shape[1] != hidden_size ||
        (t.type != kernels::dtype::f32 && t.type != kernels::dtype::bf16)) {
      return make_error(errc::bad_format, "activation frame of microbatch " + std::to_string(in.header.microbatch_id) +
                                              " is not [tokens, " + std::to_string(hidden_size) + "] f32/bf16");
    }
    hidden_in = in.payload.data();
    if (t.type != act) {  // the sender's wire dtype differs from what this stage computes in
      convert_in_.resize(values * kernels::dtype_size(act));
      CONVEYOR_TRY(transport::convert_activations(in.payload.data(), t.type, convert_in_.data(), act, values));
      hidden_in = convert_in_.data();
    }
  }
  // The executor copies the output activations straight into a reused staging buffer.
  transport::staging_pool::buffer staging;
  if (!options_.range.has_head) {
    CONVEYOR_TRY_ASSIGN(b, staging_->acquire(values * kernels::dtype_size(act)));
    staging = std::move(b);
  }
  const auto t0 = steady::now();
  if (options_.step_delay.count() > 0) std::this_thread::sleep_for(options_.step_delay);
  auto out = stage_->run_raw(plan, hidden_in, staging.data());
  busy_ns_ += ns_since(t0);
  ++steps_;
  if (!out) return out.err();
  if (options_.range.has_head) {
    // One token per sequence, or sample_rows of them for a speculative verification step.
    on_tokens_(in.header.microbatch_id, in.header.step, engine::flat_sampled_tokens(plan, *out));
    return ok_status();
  }
  // Keep at most max_sends_in_flight activation buffers alive until the next stage took them. The
  // device copy of this microbatch above ran while earlier frames were still being sent.
  while (static_cast<int>(sends_.size()) >= options_.max_sends_in_flight ||
         (!sends_.empty() && sends_.front().handle.done())) {
    CONVEYOR_TRY(sends_.front().handle.wait(transport::after(std::chrono::seconds(30))));
    sends_.pop_front();
  }
  const kernels::dtype wire = options_.wire_dtype.value_or(act);
  if (wire != act) {
    CONVEYOR_TRY_ASSIGN(converted, staging_->acquire(values * kernels::dtype_size(wire)));
    CONVEYOR_TRY(transport::convert_activations(staging.data(), act, converted.data(), wire, values));
    staging = std::move(converted);
  }
  transport::frame_header h = std::move(in.header);
  h.kind = transport::frame_kind::activations;
  h.tensor = {wire, {plan.num_tokens(), hidden_size}};
  pending_send p{std::move(staging), {}};
  const auto issued = steady::now();
  CONVEYOR_TRY_ASSIGN(handle, downstream_->send(h, {p.staging.data(), p.staging.size()}));
  p.handle = std::move(handle);
  hops_.sent(p.handle, p.staging.size(), issued);
  sends_.push_back(std::move(p));
  return ok_status();
}

status stage_runtime::begin_step(const transport::frame& in, bool chain) {
  if (!options_.range.has_embedding || !options_.range.has_head) {
    return make_error(errc::invalid_argument,
                      "a queued step needs a stage with the embedding and the head (serving.queued_steps)");
  }
  held_step h;
  h.plan = to_step_plan(in.header);
  h.microbatch = in.header.microbatch_id;
  h.step = in.header.step;
  const auto t0 = steady::now();
  CONVEYOR_TRY(stage_->begin(h.plan, chain));
  if (held_.empty()) queued_since_ = t0;  // busy from the first queued step until none is left (end_held)
  if (options_.step_delay.count() > 0) {
    // The emulated device runs queued steps one after the other, each step_delay long.
    const auto start = held_.empty() ? t0 : std::max(t0, held_.back().ready_at);
    h.ready_at = start + options_.step_delay;
  }
  held_.push_back(std::move(h));
  return ok_status();
}

void stage_runtime::fail_step(std::uint64_t mb, std::uint64_t step, const std::string& why) {
  on_failure_(mb, step, "stage " + std::to_string(options_.stage) + ": " + why);
}

void stage_runtime::end_held() {
  held_step h = std::move(held_.front());
  held_.pop_front();
  if (options_.step_delay.count() > 0) std::this_thread::sleep_until(h.ready_at);
  auto out = stage_->end();
  // Busy while any step is queued: counted up to now at every end, so a long chain shows up at once.
  const auto now = steady::now();
  busy_ns_ += static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(now - queued_since_).count());
  queued_since_ = now;
  ++steps_;
  if (!out) {
    fail_step(h.microbatch, h.step, out.err().message);
    return;
  }
  on_tokens_(h.microbatch, h.step, engine::flat_sampled_tokens(h.plan, *out));
}

void stage_runtime::loop() {
  transport::frame in;
  step_mode mode = step_mode::plain;
  while (next_input(in, mode)) {
    const std::uint64_t mb = in.header.microbatch_id, step = in.header.step;
    if (mode == step_mode::flush) {
      while (!held_.empty()) end_held();
      continue;
    }
    if (mode == step_mode::chain) {
      if (held_.empty()) {
        fail_step(mb, step, "a chained step with no step held before it");
        continue;
      }
      auto st = begin_step(in, true);
      end_held();  // the held step's tokens go back first, so the coordinator knows it before the failure
      if (!st.ok()) fail_step(mb, step, st.err().message);
      continue;
    }
    while (!held_.empty()) end_held();
    if (mode == step_mode::hold) {
      if (auto st = begin_step(in, false); !st.ok()) fail_step(mb, step, st.err().message);
      continue;
    }
    auto st = run_step(in);
    if (st.ok()) continue;
    if (downstream_ && !downstream_->health().ok()) {
      // Name the stage that is gone, not just ourselves: that is what the operator needs.
      on_failure_(whole_stage, whole_stage, "stage " + std::to_string(options_.stage) + " lost stage " +
                                   std::to_string(options_.stage + 1) + " downstream: " + downstream_->health().err().message);
      return;
    }
    fail_step(mb, step, st.err().message);
  }
  // Stopped or detached: steps still queued on the device are ended unreported (the coordinator
  // plans them again), so the executor takes plain steps after a re-wire.
  while (!held_.empty()) {
    held_.pop_front();
    (void)stage_->end();
  }
}

}  // namespace conveyor::stage
