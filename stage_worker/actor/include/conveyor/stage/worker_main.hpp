#pragma once
// Entry point of a stage-worker process (`conveyor worker`): joins the coordinator, loads its
// layers, wires to its neighbours and serves steps until told to stop or the coordinator goes away.
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
};

/// Runs until the worker stops; returns the process exit code.
int run_worker(const worker_options& options);

}  // namespace conveyor::stage
