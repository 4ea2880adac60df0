#pragma once
// Entry point of a stage-worker process (`conveyor worker`): joins the coordinator, loads its
// layers, wires to its neighbours and serves steps until told to stop or the coordinator goes away.
#include <chrono>
#include <cstdint>
#include <string>

namespace conveyor::stage {

struct worker_options {
  std::string coordinator_host = "127.0.0.1";
  std::uint16_t coordinator_port = 0;
  std::string token;  ///< the cluster token; the coordinator refuses workers without it
  int stage = 0;
  int rank = 0;
  int threads = 0;  ///< CPU threads for the matrix products
  /// UCX network devices for tcp (ucx_config::net_devices): the interface of the address the
  /// deployment names for this worker's host, so the worker advertises that address.
  std::string net_devices = "all";
  /// How long to keep trying to reach the coordinator (it may still be starting, or far away).
  std::chrono::milliseconds join_timeout{5000};
};

/// Runs until the worker stops; returns the process exit code.
int run_worker(const worker_options& options);

}  // namespace conveyor::stage
