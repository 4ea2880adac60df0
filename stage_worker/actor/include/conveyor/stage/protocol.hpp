#pragma once
// The control-plane protocol between the coordinator and its stage workers (CAF messages). Included
// only by the actor TUs: CAF stays out of widely included headers. Both processes must register the
// same types (register_protocol), or CAF's handshake fails.
//
//   worker -> coordinator   join(token, stage, rank, pid, worker)           -> assignment reply
//   worker -> coordinator   progress(stage, rank, text)                     while loading
//   worker -> coordinator   loaded(stage, rank, ucx address, weight bytes, kv blocks)  or failed(stage, rank, why)
//                           kv blocks: the KV pool it allocated (sized from its free memory where
//                           the assignment's kv_blocks is 0; the coordinator schedules the least)
//   coordinator -> worker   wire(upstream address, downstream address)     -> wired(stage)
//   coordinator -> stage 0  step(microbatch, encoded frame header)
//   coordinator -> stage 0  qstep(microbatch, mode, encoded frame header)   queued steps (one stage,
//                           serving.queued_steps): `hold` begins a step and keeps it
//                           queued; `chain` begins the next one with the ids the held one draws,
//                           then ends the held one (its tokens go back as done); `flush` (no
//                           header) ends the held one. Every hold or chain is followed by exactly
//                           one chain or flush.
//   last stage -> coordin.  done(microbatch, step, tokens) / step_failed(microbatch, step, why)
//                           tokens: per plan sequence, one (-1 if not sampled), or sample_rows of
//                           them for a speculative verification step (engine::flat_sampled_tokens)
//   coordinator -> worker   ping -> pong(busy_s, idle_s, steps)            the liveness check
//   coordinator -> worker   reset(n, drop upstream, drop downstream)      -> reset_done(stage, n)
//                           a neighbour died: stop the compute thread, drop its channel
//   coordinator -> worker   wire(...) again with the new neighbour's address (empty = keep)
//   coordinator -> worker   metrics -> (metrics, stage_metrics)            activation frames, per heartbeat
//   coordinator -> worker   stop
// Every worker -> coordinator message is sent as the worker actor (also from its threads, with
// send_as), so the coordinator can check that it comes from the joined worker of that stage.
#include <cstdint>
#include <string>
#include <vector>

#include "caf/all.hpp"

namespace conveyor::stage {

using join_atom = caf::atom_constant<caf::atom("join")>;
using assign_atom = caf::atom_constant<caf::atom("assign")>;
using progress_atom = caf::atom_constant<caf::atom("progress")>;
using loaded_atom = caf::atom_constant<caf::atom("loaded")>;
using failed_atom = caf::atom_constant<caf::atom("failed")>;
using wire_atom = caf::atom_constant<caf::atom("wire")>;
using wired_atom = caf::atom_constant<caf::atom("wired")>;
using step_atom = caf::atom_constant<caf::atom("step")>;
using done_atom = caf::atom_constant<caf::atom("done")>;
using step_fail_atom = caf::atom_constant<caf::atom("stepfail")>;
using ping_atom = caf::atom_constant<caf::atom("ping")>;
using pong_atom = caf::atom_constant<caf::atom("pong")>;
using stop_atom = caf::atom_constant<caf::atom("stop")>;
using reset_atom = caf::atom_constant<caf::atom("reset")>;
using reset_done_atom = caf::atom_constant<caf::atom("resetdone")>;
using metrics_atom = caf::atom_constant<caf::atom("metrics")>;
using qstep_atom = caf::atom_constant<caf::atom("qstep")>;

/// qstep's mode (stage_runtime::step_mode's values).
enum class qstep_mode : std::int32_t { hold = 1, chain = 2, flush = 3 };

/// Protocol version, checked at join. 4: max_frame_bytes in the assignment, reset (stage recovery);
/// 5: the metrics request; 6: stage_assignment.quant, quant_lm_head; 7: frames carry sampleRows and
/// `done` may hold several tokens per sequence (speculative decoding); 8: stage_assignment.batch_invariant;
/// 9: qstep (queued steps); 10: stage_assignment.kv_fraction and kv_min_blocks, loaded's kv blocks;
/// 11: stage_assignment.warm_up_batches, loaded's note (the warm-up's report).
constexpr std::int32_t protocol_version = 11;

/// What the coordinator tells a worker to load (a plain struct, sent as a CAF message).
struct stage_assignment {
  std::string model_dir;
  std::int32_t stage = 0;
  std::int32_t num_stages = 1;
  std::int32_t first_layer = 0;
  std::int32_t last_layer = 0;
  std::int32_t kv_blocks = 0;      ///< 0 = as many as kv_fraction of the memory left after weights holds
  double kv_fraction = 0.9;        ///< serving.kv_memory_fraction (kv_blocks 0 only)
  std::int32_t kv_min_blocks = 1;  ///< kv_blocks 0: fail the load unless this many fit (one longest sequence)
  std::int32_t kv_block_size = 16;
  std::int32_t max_step_tokens = 512;
  std::int32_t max_seqs = 64;
  std::string ucx_tls = "auto";
  std::int64_t step_delay_us = 0;  ///< test only
  std::string device = "cpu";      ///< cpu | cuda (the worker's CUDA_VISIBLE_DEVICES names its GPU)
  std::string dtype = "f32";       ///< f32 | bf16 (cuda only)
  std::int32_t tp = 1;             ///< tensor-parallel ranks of the stage (threads of the worker; GPUs 0..tp-1)
  std::int64_t max_frame_bytes = std::int64_t{256} << 20;  ///< transport.max_frame_bytes
  std::string quant = "none";      ///< none | int8 | fp8: the linear layers' weights, quantized at load
  bool quant_lm_head = false;      ///< the LM head quantized too
  bool batch_invariant = false;    ///< cuda bf16: row-invariant kernels (speculative verification = decode)
  /// Decode batch sizes of the warm-up steps run at load, after a 16-token prefill (engine::warm_up);
  /// empty = no warm-up.
  std::vector<std::int32_t> warm_up_batches;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, stage_assignment& x) {
  return f(caf::meta::type_name("stage_assignment"), x.model_dir, x.stage, x.num_stages, x.first_layer,
           x.last_layer, x.kv_blocks, x.kv_fraction, x.kv_min_blocks, x.kv_block_size, x.max_step_tokens, x.max_seqs, x.ucx_tls, x.step_delay_us, x.device, x.dtype, x.tp, x.max_frame_bytes, x.quant,
           x.quant_lm_head, x.batch_invariant, x.warm_up_batches);
}

/// A worker's activation-frame counters (stage_runtime::hop_metrics, hop_meter.hpp), as a CAF message.
struct stage_metrics {
  std::string host;  ///< the worker's hostname
  std::int32_t tp_rank = 0;
  std::int64_t frames_sent = 0, bytes_sent = 0, frames_received = 0, bytes_received = 0;
  std::int32_t sends_in_flight = 0;
  std::vector<std::uint64_t> latency_counts;  ///< per bucket of hop_latency_bounds(), +Inf last
  double latency_sum_s = 0.0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, stage_metrics& x) {
  return f(caf::meta::type_name("stage_metrics"), x.host, x.tp_rank, x.frames_sent, x.bytes_sent, x.frames_received,
           x.bytes_received, x.sends_in_flight, x.latency_counts, x.latency_sum_s);
}

inline void register_protocol(caf::actor_system_config& cfg) {
  cfg.add_message_type<stage_assignment>("stage_assignment");
  cfg.add_message_type<stage_metrics>("stage_metrics");
  cfg.add_message_type<std::vector<std::int32_t>>("i32_vector");
}

/// Settings both processes use: the sharing scheduler and no middleman worker pool cut a request's
/// round trip from ~400 µs to ~100 µs (STACK.md).
inline void tune_actor_system(caf::actor_system_config& cfg) {
  cfg.set("scheduler.policy", caf::atom("sharing"));
  cfg.set("middleman.workers", size_t{0});
  cfg.set("logger.verbosity", caf::atom("quiet"));
}

}  // namespace conveyor::stage
