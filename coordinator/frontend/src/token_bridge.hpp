#pragma once
// The token_sink the service calls, from any of its threads, for one RPC generate call. It only
// collects tokens and the outcome under a mutex and wakes the kj thread through a cross-thread
// fulfiller (kj::Executor's machinery), so a service thread never waits for the network: while the
// client's stream is flow-controlled, tokens pile up here and leave as one bigger batch.
//
// Why not Executor::executeAsync: in 0.9.2 it needs an event loop on the calling thread (the promise
// it returns belongs there), and executeSync would block the service thread for a round trip.
#include <mutex>
#include <optional>
#include <vector>

#include <kj/async.h>

#include "conveyor/service/inference_service.hpp"

namespace conveyor::frontend {

class token_bridge final : public service::token_sink {
 public:
  token_bridge() = default;
  ~token_bridge() noexcept override;  // kj::Own's destructor may throw; a sink's may not

  // --- service side (any thread) ---
  void on_tokens(std::span<const std::int32_t> tokens) override;
  void on_done(result<service::generate_summary> summary) override;

  // --- kj side (the server thread) ---
  /// What arrived since the last take(): tokens in order, and the outcome once on_done was called.
  struct batch {
    std::vector<std::int32_t> tokens;
    std::optional<result<service::generate_summary>> done;
  };
  /// Resolves when take() would return something (at once if it already would).
  kj::Promise<void> when_ready();
  batch take();
  /// The RPC call is gone: later callbacks are dropped instead of buffered.
  void detach();

 private:
  void wake_locked();

  std::mutex mu_;
  std::vector<std::int32_t> pending_;
  std::optional<result<service::generate_summary>> done_;
  kj::Own<kj::CrossThreadPromiseFulfiller<void>> waiter_;  // set while the kj side waits
  bool finished_ = false;  // on_done was called: later callbacks are a service bug, ignored
  bool detached_ = false;
};

}  // namespace conveyor::frontend
