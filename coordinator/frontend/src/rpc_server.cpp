#include "conveyor/frontend/rpc_server.hpp"

#include <capnp/rpc-twoparty.h>
#include <kj/async-io.h>

#include <cstdio>
#include <future>
#include <mutex>
#include <thread>

#include "inference_impl.hpp"
#include "server_state.hpp"

namespace conveyor::frontend {

namespace {

/// One client: its socket, the two-party network over it, and the RPC system serving it.
struct connection {
  connection(kj::Own<kj::AsyncIoStream> s, capnp::Capability::Client bootstrap, capnp::ReaderOptions limits)
      : stream(kj::mv(s)),
        network(*stream, capnp::rpc::twoparty::Side::SERVER, limits),
        rpc(capnp::makeRpcServer(network, kj::mv(bootstrap))) {}
  kj::Own<kj::AsyncIoStream> stream;
  capnp::TwoPartyVatNetwork network;
  capnp::RpcSystem<capnp::rpc::twoparty::VatId> rpc;
};

/// Connections end with an exception when a client misbehaves (e.g. an oversized message): say so
/// once, here, and keep serving everyone else. A plain disconnect is normal and not logged.
class connection_errors final : public kj::TaskSet::ErrorHandler {
 public:
  void taskFailed(kj::Exception&& e) override {
    if (e.getType() == kj::Exception::Type::DISCONNECTED) return;
    std::fprintf(stderr, "conveyor rpc: dropped a client: %s\n", e.getDescription().cStr());
  }
};

class rpc_server_impl final : public rpc_server {
 public:
  rpc_server_impl(service::inference_service& service, const rpc_server_options& options)
      : state_{service, options} {}

  ~rpc_server_impl() noexcept override { stop(); }

  /// Starts the thread; returns once it listens (or failed to).
  status start() {
    std::promise<result<int>> started;
    auto bound = started.get_future();
    // The thread owns the promise: set_value may still run after get() returns here.
    thread_ = std::thread([this, started = std::move(started)]() mutable { run(started); });
    auto port = bound.get();
    if (!port) {
      thread_.join();
      return port.err();
    }
    port_ = *port;
    return ok_status();
  }

  int port() const override { return port_; }

  std::string address() const override {
    // Replace the port of the configured address with the bound one (they differ with port 0).
    const std::string& a = state_.options.listen;
    return a.substr(0, a.rfind(':')) + ":" + std::to_string(port_);
  }

  void stop() override {
    std::lock_guard lock(stop_mu_);
    if (!thread_.joinable()) return;
    stop_fulfiller_->fulfill();
    thread_.join();
    stop_fulfiller_ = nullptr;
  }

 private:
  void run(std::promise<result<int>>& started) {
    auto io = kj::setupAsyncIo();
    auto stop_paf = kj::newPromiseAndCrossThreadFulfiller<void>();
    capnp::ReaderOptions limits;
    limits.traversalLimitInWords = state_.options.max_message_bytes / sizeof(capnp::word);
    limits.nestingLimit = state_.options.max_nesting;
    capnp::Capability::Client bootstrap = kj::heap<inference_impl>(state_);
    connection_errors errors;
    kj::Own<kj::ConnectionReceiver> listener;
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&] {
      auto addr = io.provider->getNetwork().parseAddress(state_.options.listen).wait(io.waitScope);
      listener = addr->listen();
    })) {
      started.set_value(make_error(errc::io, "cannot listen on " + state_.options.listen + ": " +
                                                 std::string(e->getDescription().cStr())));
      return;
    }
    {
      kj::TaskSet connections(errors);
      auto accepting = accept_loop(*listener, io.provider->getTimer(), bootstrap, limits, connections);
      stop_fulfiller_ = kj::mv(stop_paf.fulfiller);
      started.set_value(static_cast<int>(listener->getPort()));
      stop_paf.promise.wait(io.waitScope);
      // Leaving this scope cancels the accept loop, then every connection: their calls are cancelled,
      // which cancels their requests in the service.
    }
  }

  kj::Promise<void> accept_loop(kj::ConnectionReceiver& listener, kj::Timer& timer,
                                capnp::Capability::Client& bootstrap, capnp::ReaderOptions limits,
                                kj::TaskSet& connections) {
    return listener.accept()
        .then(
            [this, &bootstrap, limits, &connections](kj::Own<kj::AsyncIoStream> stream) -> kj::Promise<void> {
              auto c = kj::heap<connection>(kj::mv(stream), bootstrap, limits);
              state_.connections.fetch_add(1, std::memory_order_relaxed);
              auto& network = c->network;
              connections.add(network.onDisconnect().attach(
                  kj::mv(c), kj::defer([this] { state_.connections.fetch_sub(1, std::memory_order_relaxed); })));
              return kj::READY_NOW;
            },
            [&timer](kj::Exception&& e) {
              // e.g. out of file descriptors: keep the listener, try again shortly.
              std::fprintf(stderr, "conveyor rpc: accept failed: %s\n", e.getDescription().cStr());
              return timer.afterDelay(100 * kj::MILLISECONDS);
            })
        .then([this, &listener, &timer, &bootstrap, limits, &connections] {
          return accept_loop(listener, timer, bootstrap, limits, connections);
        });
  }

  server_state state_;
  int port_ = 0;
  std::thread thread_;
  std::mutex stop_mu_;
  kj::Own<kj::CrossThreadPromiseFulfiller<void>> stop_fulfiller_;  // set by the thread before it reports
};

}  // namespace

result<std::unique_ptr<rpc_server>> start_rpc_server(service::inference_service& service,
                                                     const rpc_server_options& options) {
  const auto& a = options.listen;
  const auto colon = a.rfind(':');
  if (colon == std::string::npos || colon + 1 == a.size() ||
      a.find_first_not_of("0123456789", colon + 1) != std::string::npos || (a.front() == '[' && a[colon - 1] != ']')) {
    return make_error(errc::invalid_argument,
                      "listen address \"" + a + "\" is not HOST:PORT (e.g. 127.0.0.1:7600; port 0 picks a free one)");
  }
  if (options.max_message_bytes < 4096) {
    return make_error(errc::invalid_argument, "max_message_bytes must be at least 4096, got " +
                                                  std::to_string(options.max_message_bytes));
  }
  auto server = std::make_unique<rpc_server_impl>(service, options);
  CONVEYOR_TRY(server->start());
  return std::unique_ptr<rpc_server>(std::move(server));
}

}  // namespace conveyor::frontend
