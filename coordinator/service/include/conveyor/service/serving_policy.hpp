#pragma once
// How the serving side forms batches, admits requests and bounds their time (issue 6), as one plain
// struct: the deployment's [serving] section maps onto it (cli), and the local service and the
// cluster hand it to the batch scheduler unchanged.
#include <cstdint>

namespace conveyor::service {

/// How a microbatch gets its sequences. TOML serving.batching: "continuous" | "dynamic" | "static".
enum class batching_mode {
  continuous,  ///< sequences join and leave the running batch at every step
  dynamic,     ///< collect up to max_batch_size requests or wait max_batch_delay_ms, then run them to the end
  fixed,       ///< TOML "static": wait for exactly max_batch_size requests, then run them to the end
};

struct serving_policy {
  batching_mode batching = batching_mode::continuous;
  int max_batch_delay_ms = 5;          ///< dynamic: the longest a request waits for company
  int job_queue_size = 0;              ///< requests waiting to start; beyond it "overloaded"; 0 = no cap
  std::int64_t max_queued_tokens = 0;  ///< prompt tokens waiting to start; 0 = no cap
  bool use_job_ticket = false;         ///< reject at once ("overloaded") a request that cannot start now
  double response_timeout_s = 0.0;     ///< a request older than this is cancelled everywhere; 0 = never
  bool prefix_caching = true;          ///< share full KV blocks between prompts with the same prefix
  /// A cluster of one stage (any tensor-parallel ranks; one microbatch, no draft) plans step n+1 before step
  /// n's tokens come back; the stage chains their ids on the device and starts it at once, so the
  /// tokens' round trip through the coordinator no longer idles the GPU. The same results.
  bool queued_steps = true;
};

}  // namespace conveyor::service
