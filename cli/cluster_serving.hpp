#pragma once
// What `conveyor serve` and `conveyor launch` share: the cluster's settings from a deployment, and
// running the cluster behind the RPC frontend (and the HTTP gateway) until SIGINT or SIGTERM.
#include <optional>
#include <string>

#include "conveyor/base/result.hpp"
#include "conveyor/config/deployment.hpp"
#include "conveyor/coordinator/cluster.hpp"

namespace conveyor::cli {

/// The cluster's settings from the deployment: every stage's worker on this host, its GPUs
/// round-robin over placement.device_ids (launch then sets where each stage runs). Reads
/// cluster.token_file.
result<coordinator::cluster_options> cluster_options_of(const config::deployment& d);

/// Catches SIGINT and SIGTERM (one arriving during start-up aborts it), starts the cluster and the frontends (`http` overrides
/// frontend.http_listen), prints "<command>: listening on HOST:PORT ..." on stdout for scripts, and
/// serves until a signal, then stops everything it started. Returns the exit code.
int serve_cluster(const std::string& command, const config::deployment& d, const coordinator::cluster_options& o,
                  const std::optional<std::string>& http);

}  // namespace conveyor::cli
