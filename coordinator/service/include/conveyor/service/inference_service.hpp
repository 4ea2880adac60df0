#pragma once
// What a frontend (Cap'n Proto RPC, HTTP) asks of the serving side, in plain C++: no CAF, no Cap'n
// Proto. The coordinator implements it with actors; `local_inference_service` implements it over an
// in-process engine. Callbacks may arrive on any thread: a frontend marshals them to its own loop.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "conveyor/base/result.hpp"
#include "conveyor/kernels/backend.hpp"

namespace conveyor::service {

/// The name of an error code in result lines, metrics labels and messages, e.g. "deadline_exceeded".
inline std::string_view errc_name(errc code) {
  switch (code) {
    case errc::invalid_argument: return "invalid_argument";
    case errc::not_found: return "not_found";
    case errc::bad_format: return "bad_format";
    case errc::unsupported: return "unsupported";
    case errc::out_of_memory: return "out_of_memory";
    case errc::io: return "io";
    case errc::internal: return "internal";
    case errc::overloaded: return "overloaded";
    case errc::deadline_exceeded: return "deadline_exceeded";
  }
  return "internal";
}

struct generate_request {
  std::vector<std::int32_t> prompt;
  int max_new_tokens = 16;
  kernels::sample_params sampling;     ///< step is set per token by the scheduler
  std::vector<std::int32_t> stop_ids;  ///< extra ids that end the sequence (besides the model's EOS)
  bool ignore_eos = false;
  double deadline_s = 0.0;  ///< seconds from submission; 0 = the server's default (serving.response_timeout_s).
                            ///< Past it the request is cancelled and fails with errc::deadline_exceeded.
};

struct generate_summary {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  std::string finish_reason;  ///< "length" | "stop" | "cancelled"
  double queue_s = 0.0;       ///< submission to first scheduled step
  double first_token_s = 0.0; ///< submission to first token
  double total_s = 0.0;
};

/// Receives one request's tokens. on_tokens may be called many times, then on_done exactly once
/// (with the summary, or an error saying why the request failed). Called from service threads.
class token_sink {
 public:
  virtual ~token_sink() = default;
  virtual void on_tokens(std::span<const std::int32_t> tokens) = 0;
  virtual void on_done(result<generate_summary> summary) = 0;
};

struct stage_health {
  int stage = 0;
  int tp_rank = 0;
  std::string state;  ///< "starting" | "loading" | "ready" | "failed" | "stopped"
  std::string detail; ///< e.g. load progress or the failure
};

struct health_report {
  bool ready = false;  ///< the canary token has passed every stage
  std::vector<stage_health> stages;
};

/// Activation frames on one pipeline hop, as one stage worker saw them: the frames it sent to the next
/// stage and those it received from the previous one. Counters since the worker started.
struct frame_hop_report {
  int stage = 0;       ///< the reporting stage
  int tp_rank = 0;     ///< its rank in the stage's tensor-parallel group (rank 0 carries activations)
  std::string host;    ///< the host it runs on (the placement's name, else the worker's hostname)
  std::int64_t frames_sent = 0, bytes_sent = 0;          ///< to stage + 1
  std::int64_t frames_received = 0, bytes_received = 0;  ///< from stage - 1
  int sends_in_flight = 0;  ///< frames handed to the transport that it has not finished sending
  /// Send latency (send issued until the transport completed it) as a histogram: upper bounds in
  /// seconds, counts per bucket (not cumulative) with +Inf last, and the sum of all latencies.
  std::vector<double> send_latency_bounds;
  std::vector<std::uint64_t> send_latency_counts;
  double send_latency_sum_s = 0.0;
};

struct stats_report {
  std::int64_t requests_running = 0;
  std::int64_t requests_waiting = 0;
  std::int64_t requests_finished = 0;
  std::int64_t requests_failed = 0;
  std::int64_t tokens_generated = 0;
  int kv_blocks_total = 0;
  int kv_blocks_free = 0;
  std::int64_t requests_rejected = 0;  ///< turned away as overloaded (queue caps, job tickets)
  std::int64_t requests_expired = 0;   ///< cancelled at their deadline (also in requests_failed)
  std::int64_t preemptions = 0;        ///< times a sequence gave its KV blocks back under pressure
  int kv_blocks_cached = 0;            ///< blocks naming a prompt prefix that later prompts can share
  std::int64_t prefix_cache_queried_tokens = 0;  ///< prompt tokens looked up in the prefix cache
  std::int64_t prefix_cache_hit_tokens = 0;      ///< of those, found cached: their prefill was skipped
  std::int64_t spec_steps = 0;            ///< speculative decoding: sequence steps that carried drafts
  std::int64_t spec_draft_tokens = 0;     ///< draft tokens verified
  std::int64_t spec_accepted_tokens = 0;  ///< of them kept (acceptance rate = accepted / draft)
  std::int64_t spec_emitted_tokens = 0;   ///< tokens those steps produced (per step: the speed-up bound)
  std::vector<double> stage_busy_s;  ///< per stage: time spent computing
  std::vector<double> stage_idle_s;  ///< per stage: time waiting for work (the pipeline bubble)
  /// Every error the service answered a request with, by kind (errc_name): admission control's
  /// rejections (invalid_argument, overloaded) and failures of accepted requests (deadline_exceeded,
  /// internal, ...).
  std::map<std::string, std::int64_t> errors_by_kind;
  int microbatches = 0;            ///< microbatch slots (parallel.chunks)
  int microbatches_in_flight = 0;  ///< of those, with a step on the stages now
  /// Steps planned behind the step in flight and chained on the stage (serving.queued_steps).
  std::int64_t steps_queued_ahead = 0;
  std::vector<std::int64_t> stage_steps;  ///< per stage: steps it ran
  std::vector<frame_hop_report> hops;     ///< per stage worker (a cluster's; empty in one process)
};

struct model_info {
  std::string model_dir;
  std::string model_type;
  int vocab_size = 0;
  int num_layers = 0;
  int hidden_size = 0;
  int stages = 0;
  int tp = 1;
  int chunks = 1;
  int max_context = 0;
};

class inference_service {
 public:
  virtual ~inference_service() = default;
  /// Queues a request; returns its id (for cancel). Invalid requests reach the sink as errors.
  virtual std::uint64_t submit(generate_request request, std::shared_ptr<token_sink> sink) = 0;
  /// Cancels a request: its KV is freed on every stage and its sink gets finish_reason "cancelled".
  virtual void cancel(std::uint64_t id) = 0;
  virtual void health(std::function<void(health_report)> reply) = 0;
  virtual void stats(std::function<void(stats_report)> reply) = 0;
  virtual model_info info() const = 0;
  /// No more requests are coming for now (e.g. an offline batch has submitted its last line): batching
  /// modes that wait to fill a batch start what they have. A no-op where batches never wait.
  virtual void flush() {}
};

}  // namespace conveyor::service
