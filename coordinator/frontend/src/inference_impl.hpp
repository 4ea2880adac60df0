#pragma once
// The server side of schemas/inference.capnp's `Inference`: one instance per rpc_server, shared by
// every connection, living on the server's kj thread.
#include "conveyor/schemas/inference.capnp.h"
#include "server_state.hpp"

namespace conveyor::frontend {

/// Oldest client protocol version this server accepts (schemas/inference.capnp: versioning).
constexpr std::uint32_t min_protocol_version = 1;

class inference_impl final : public schema::rpc::Inference::Server {
 public:
  explicit inference_impl(server_state& state) : state_(state) {}

 protected:
  kj::Promise<void> handshake(HandshakeContext context) override;
  kj::Promise<void> generate(GenerateContext context) override;
  kj::Promise<void> health(HealthContext context) override;
  kj::Promise<void> stats(StatsContext context) override;
  kj::Promise<void> info(InfoContext context) override;

 private:
  server_state& state_;
};

}  // namespace conveyor::frontend
