#pragma once
// One `generate` RPC in progress on the server: pumps tokens from the service (through a
// token_bridge) into the client's TokenSink, respecting the stream's flow control. Destroying it
// before the service finished (the client dropped the call or disconnected, or the server stops)
// cancels the request in the service.
#include <cstdint>
#include <memory>

#include "conveyor/schemas/inference.capnp.h"
#include "server_state.hpp"
#include "token_bridge.hpp"

namespace conveyor::frontend {

class generate_call {
 public:
  generate_call(server_state& state, schema::rpc::TokenSink::Client sink);
  ~generate_call();
  generate_call(const generate_call&) = delete;
  generate_call& operator=(const generate_call&) = delete;

  /// Submits the request; the promise resolves with the service's outcome after every token has
  /// been delivered to the sink (the sink's `flush` returned).
  kj::Promise<result<service::generate_summary>> run(service::generate_request request);
  /// Tokens sent to the sink so far.
  int streamed() const { return streamed_; }

 private:
  kj::Promise<result<service::generate_summary>> pump();

  server_state& state_;
  schema::rpc::TokenSink::Client sink_;
  std::shared_ptr<token_bridge> bridge_ = std::make_shared<token_bridge>();
  std::uint64_t ticket_ = 0;
  bool submitted_ = false;
  bool finished_ = false;  // the service reported the outcome: nothing left to cancel
  int streamed_ = 0;
};

}  // namespace conveyor::frontend
