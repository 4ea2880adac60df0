#pragma once
// The Cap'n Proto RPC frontend: serves schemas/inference.capnp's `Inference` interface over TCP by
// calling an inference_service. It runs its own kj event loop on its own thread; nothing of Cap'n
// Proto or kj appears in this header, so the coordinator and the CLI include it without either.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "conveyor/base/result.hpp"
#include "conveyor/service/inference_service.hpp"

namespace conveyor::frontend {

struct rpc_server_options {
  /// HOST:PORT to listen on; exactly this address is bound (no wildcard unless you write one, e.g.
  /// "0.0.0.0:7600" or "[::]:7600"). Port 0 picks a free port: see rpc_server::port().
  std::string listen = "127.0.0.1:0";
  /// Largest message a client may send. A bigger one drops that client's connection with an error,
  /// before the server allocates for it (Cap'n Proto's traversal limit, checked on the segment table).
  std::size_t max_message_bytes = 64u << 20;
  /// Deepest struct/list nesting accepted in a message (our schema needs 4).
  int max_nesting = 16;
  /// `generate` calls in progress over all connections; beyond it a call fails with out_of_memory.
  int max_active_requests = 4096;
  /// Stop ids one request may carry.
  int max_stop_ids = 1024;
  /// Name and version reported by `handshake`.
  std::string server_name = "conveyor";
};

/// A running RPC server. Destroying it stops it (as stop() does).
class rpc_server {
 public:
  virtual ~rpc_server() = default;
  /// The port actually bound (useful with port 0).
  virtual int port() const = 0;
  /// The bound address as HOST:PORT, e.g. "127.0.0.1:41234".
  virtual std::string address() const = 0;
  /// Stops listening, drops every connection (cancelling their requests in the service), and joins the
  /// server thread. Idempotent; call from any thread but the server's own.
  virtual void stop() = 0;
};

/// Binds `options.listen` and starts serving on a new thread; returns once the socket is listening, or
/// an error naming the address when it can't be bound. `service` must outlive the server.
result<std::unique_ptr<rpc_server>> start_rpc_server(service::inference_service& service,
                                                     const rpc_server_options& options);

}  // namespace conveyor::frontend
