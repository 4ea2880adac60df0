#pragma once
// What every connection of one rpc_server shares: the service, the options, and live counters.
#include <atomic>

#include "conveyor/frontend/rpc_server.hpp"

namespace conveyor::frontend {

struct server_state {
  service::inference_service& service;
  rpc_server_options options;
  std::atomic<int> connections{0};      ///< TCP clients connected now
  std::atomic<int> active_requests{0};  ///< generate calls in progress now
};

}  // namespace conveyor::frontend
