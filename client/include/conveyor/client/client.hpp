#pragma once
// A synchronous C++ client for Conveyor's Cap'n Proto RPC (schemas/inference.capnp). Nothing of Cap'n
// Proto or kj shows here: a connection runs its own I/O thread, and every call blocks the calling
// thread until the reply. Link `conveyor_client`.
//
//   auto conn = conveyor::client::connect("127.0.0.1:7600");
//   if (!conn) { report(conn.err().message); }
//   conveyor::client::generate_request req;
//   req.prompt = {1, 2, 3};
//   auto summary = (*conn)->generate(req, [](std::span<const std::int32_t> ids) {
//     for (int id : ids) std::printf("%d ", id);
//     return true;  // false cancels the request
//   });
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "conveyor/base/result.hpp"

namespace conveyor::client {

struct connect_options {
  double connect_timeout_s = 10.0;  ///< TCP connect + version handshake
  double call_timeout_s = 60.0;     ///< health, stats and info; 0 = wait forever (generate never times out here)
  std::string client_name = "conveyor-client";
  std::uint32_t protocol_version = 0;  ///< 0 = the version this library speaks (others: tests only)
  std::size_t max_message_bytes = 64u << 20;  ///< largest reply accepted from the server
};

struct generate_request {
  std::vector<std::int32_t> prompt;
  int max_new_tokens = 16;
  float temperature = 0.0f;  ///< 0 = greedy
  int top_k = 0;             ///< 0 = no limit
  float top_p = 1.0f;        ///< in (0, 1]
  std::uint64_t seed = 0;
  std::vector<std::int32_t> stop_ids;
  bool ignore_eos = false;
  double deadline_s = 0.0;  ///< 0 = the server's default
};

struct generate_summary {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  std::string finish_reason;  ///< "length" | "stop" | "cancelled" (by the server, or by on_tokens returning false)
  double queue_s = 0.0;
  double first_token_s = 0.0;
  double total_s = 0.0;
};

struct stage_health {
  int stage = 0;
  int tp_rank = 0;
  std::string state;
  std::string detail;
};

struct health_report {
  bool ready = false;
  std::vector<stage_health> stages;
};

struct stats_report {
  std::int64_t requests_running = 0;
  std::int64_t requests_waiting = 0;
  std::int64_t requests_finished = 0;
  std::int64_t requests_failed = 0;
  std::int64_t tokens_generated = 0;
  int kv_blocks_total = 0;
  int kv_blocks_free = 0;
  std::vector<double> stage_busy_s;
  std::vector<double> stage_idle_s;
  int rpc_connections = 0;
  int rpc_generate_calls = 0;
  std::int64_t requests_rejected = 0;  ///< turned away as overloaded (queue caps, job tickets)
  std::int64_t requests_expired = 0;   ///< cancelled at their deadline (also in requests_failed)
  std::int64_t preemptions = 0;        ///< KV blocks given back under pressure (re-prefilled later)
  int kv_blocks_cached = 0;            ///< blocks of the prefix cache
  std::int64_t prefix_cache_queried_tokens = 0;
  std::int64_t prefix_cache_hit_tokens = 0;
  std::map<std::string, std::int64_t> errors_by_kind;  ///< "overloaded", "deadline_exceeded", ...
  int microbatches = 0;
  int microbatches_in_flight = 0;
  std::int64_t spec_steps = 0;            ///< speculative decoding: sequence steps that carried drafts
  std::int64_t spec_draft_tokens = 0;     ///< draft tokens verified
  std::int64_t spec_accepted_tokens = 0;  ///< of them kept
  std::int64_t spec_emitted_tokens = 0;   ///< tokens those steps produced
  std::int64_t steps_queued_ahead = 0;    ///< steps chained on the stage before the step in flight ended
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

struct server_version {
  std::uint32_t protocol_version = 0;
  std::uint32_t min_protocol_version = 0;
  std::string server;
};

/// Receives new token ids as they arrive, on the connection's I/O thread; return false to cancel the
/// request (generate then returns finish_reason "cancelled"). Must not call the connection itself.
using token_callback = std::function<bool(std::span<const std::int32_t> tokens)>;

/// One connection to a server. Thread-safe: calls from many threads share the connection and run
/// concurrently. Destroy it only when no call is in progress.
class connection {
 public:
  virtual ~connection() = default;
  /// Streams one request's tokens to `on_tokens` and returns its summary, or the error that ended it
  /// (a rejected request: invalid_argument etc. with the server's message; a lost connection: io).
  virtual result<generate_summary> generate(const generate_request& request, const token_callback& on_tokens) = 0;
  virtual result<health_report> health() = 0;
  virtual result<stats_report> stats() = 0;
  virtual result<model_info> info() = 0;
  /// The server's versions, from the handshake at connect time.
  virtual const server_version& server() const = 0;
};

/// Connects to HOST:PORT (e.g. "127.0.0.1:7600", "[::1]:7600") and checks protocol versions; an error
/// says which address failed and why (refused, timed out, version mismatch).
result<std::unique_ptr<connection>> connect(const std::string& host_port, const connect_options& options = {});

}  // namespace conveyor::client
