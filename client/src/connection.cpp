#include <capnp/rpc-twoparty.h>
#include <kj/async-io.h>

#include <future>
#include <mutex>
#include <thread>

#include "conveyor/client/client.hpp"
#include "token_receiver.hpp"
#include "wire_codec.hpp"

namespace conveyor::client {

namespace {

namespace wire = conveyor::schema::rpc;

/// The RPC session over one socket; lives on the I/O thread.
struct session {
  session(kj::Own<kj::AsyncIoStream> s, capnp::ReaderOptions limits)
      : stream(kj::mv(s)),
        network(*stream, capnp::rpc::twoparty::Side::CLIENT, limits),
        rpc(capnp::makeRpcClient(network)),
        inference(bootstrap()) {}

  wire::Inference::Client bootstrap() {
    capnp::word scratch[4] = {};
    capnp::MallocMessageBuilder message(scratch);
    auto vat = message.getRoot<capnp::rpc::twoparty::VatId>();
    vat.setSide(capnp::rpc::twoparty::Side::SERVER);
    return rpc.bootstrap(vat).castAs<wire::Inference>();
  }

  kj::Own<kj::AsyncIoStream> stream;
  capnp::TwoPartyVatNetwork network;
  capnp::RpcSystem<capnp::rpc::twoparty::VatId> rpc;
  wire::Inference::Client inference;
};

kj::Duration seconds(double s) { return static_cast<std::int64_t>(s * 1e6) * kj::MICROSECONDS; }

class connection_impl final : public connection {
 public:
  connection_impl(std::string address, connect_options options)
      : address_(std::move(address)), options_(std::move(options)) {}

  ~connection_impl() noexcept override {
    if (!thread_.joinable()) return;
    stop_->fulfill();
    thread_.join();
  }

  status start() {
    std::promise<status> started;
    auto ready = started.get_future();
    // The thread owns the promise: set_value may still run after get() returns here.
    thread_ = std::thread([this, started = std::move(started)]() mutable { run(started); });
    auto s = ready.get();
    if (!s) thread_.join();
    return s;
  }

  result<generate_summary> generate(const generate_request& request, const token_callback& on_tokens) override {
    const int prompt_tokens = static_cast<int>(request.prompt.size());
    return call<generate_summary>([&]() -> kj::Promise<result<generate_summary>> {
      auto g = std::make_shared<generation>();
      g->on_tokens = &on_tokens;
      auto cancel = kj::newPromiseAndFulfiller<void>();
      g->cancel = kj::mv(cancel.fulfiller);
      auto req = session_->inference.generateRequest();
      wire_codec::encode_request(request, req.initRequest());
      req.setSink(kj::heap<token_receiver>(g));
      auto cancelled = cancel.promise.then([g, prompt_tokens]() -> result<generate_summary> {
        generate_summary s;
        s.prompt_tokens = prompt_tokens;
        s.completion_tokens = g->received;
        s.finish_reason = "cancelled";
        return s;
      });
      // exclusiveJoin drops the call when the callback cancels: the server then cancels the request.
      // The callback is detached here, on the I/O thread, before the caller wakes up and may destroy it.
      return req.send()
          .then([](auto response) { return wire_codec::decode_summary(response.getSummary()); })
          .exclusiveJoin(kj::mv(cancelled))
          .then(
              [g](result<generate_summary> r) {
                g->on_tokens = nullptr;
                return r;
              },
              [this, g](kj::Exception&& e) -> result<generate_summary> {
                g->on_tokens = nullptr;
                return to_error(e);
              });
    });
  }

  result<health_report> health() override {
    return call<health_report>([this] {
      return with_timeout(session_->inference.healthRequest().send().then(
          [](auto r) { return result<health_report>(wire_codec::decode_health(r.getHealth())); }));
    });
  }

  result<stats_report> stats() override {
    return call<stats_report>([this] {
      return with_timeout(session_->inference.statsRequest().send().then(
          [](auto r) { return result<stats_report>(wire_codec::decode_stats(r.getStats())); }));
    });
  }

  result<model_info> info() override {
    return call<model_info>([this] {
      return with_timeout(session_->inference.infoRequest().send().then(
          [](auto r) { return result<model_info>(wire_codec::decode_info(r.getInfo())); }));
    });
  }

  const server_version& server() const override { return version_; }

 private:
  /// Runs `make` (which returns a kj::Promise<result<T>>) on the I/O thread and waits for it here; a
  /// kj exception becomes an error value that names the server.
  template <class T, class F>
  result<T> call(F&& make) {
    try {
      return executor_->executeSync([&]() -> kj::Promise<result<T>> {
        return make().catch_([this](kj::Exception&& e) -> result<T> { return to_error(e); });
      });
    } catch (const kj::Exception& e) {
      return to_error(e);  // the I/O thread is gone
    }
  }

  template <class T>
  kj::Promise<T> with_timeout(kj::Promise<T> p) {
    if (options_.call_timeout_s <= 0) return p;
    return timer_->timeoutAfter(seconds(options_.call_timeout_s), kj::mv(p));
  }

  error to_error(const kj::Exception& e) const {
    const std::string what = reason(e);
    if (e.getType() == kj::Exception::Type::DISCONNECTED) {
      return make_error(errc::io, "connection to " + address_ + " lost: " + what);
    }
    if (e.getType() == kj::Exception::Type::OVERLOADED && what.find("timed out") != std::string::npos) {
      return make_error(errc::io, address_ + " did not answer within " + std::to_string(options_.call_timeout_s) +
                                      " s");
    }
    return make_error(errc::internal, address_ + ": " + what);
  }

  /// What a user needs from a kj exception: the server's own words without the RPC layer's prefix, or
  /// for a failed system call its strerror text without kj's debugging detail.
  static std::string reason(const kj::Exception& e) {
    std::string what = e.getDescription().cStr();
    static const std::string remote = "remote exception: ";
    if (what.rfind(remote, 0) == 0) return what.substr(remote.size());
    // e.g. "connect(): Connection refused" or "DNS lookup failed.; params.host = x; gai_strerror(status) = ..."
    std::string detail;
    static const std::string gai = "gai_strerror(status) = ";
    if (auto at = what.find(gai); at != std::string::npos) detail = ": " + what.substr(at + gai.size());
    what = what.substr(0, what.find("; "));
    if (auto call = what.find("): "); call != std::string::npos) what = what.substr(call + 3);
    if (!what.empty() && what.back() == '.') what.pop_back();
    return what + detail;
  }

  void run(std::promise<status>& started) {
    auto io = kj::setupAsyncIo();
    auto stop = kj::newPromiseAndCrossThreadFulfiller<void>();
    timer_ = &io.provider->getTimer();
    capnp::ReaderOptions limits;
    limits.traversalLimitInWords = options_.max_message_bytes / sizeof(capnp::word);
    kj::Own<session> s;
    status outcome;
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&] {
      auto stream = io.provider->getTimer()
                        .timeoutAfter(seconds(options_.connect_timeout_s),
                                      io.provider->getNetwork().parseAddress(address_).then(
                                          [](kj::Own<kj::NetworkAddress> a) { return a->connect().attach(kj::mv(a)); }))
                        .wait(io.waitScope);
      s = kj::heap<session>(kj::mv(stream), limits);
      auto hello = s->inference.handshakeRequest();
      hello.setClientProtocolVersion(options_.protocol_version ? options_.protocol_version
                                                               : wire::INFERENCE_PROTOCOL_VERSION);
      hello.setClientName(options_.client_name);
      auto reply = io.provider->getTimer()
                       .timeoutAfter(seconds(options_.connect_timeout_s), hello.send())
                       .wait(io.waitScope);
      version_ = wire_codec::decode_version(reply.getInfo());
    })) {
      const bool timed_out = e->getType() == kj::Exception::Type::OVERLOADED;
      outcome = make_error(errc::io, "cannot connect to " + address_ + ": " +
                                         (timed_out ? "no answer within " + std::to_string(options_.connect_timeout_s) + " s"
                                                    : reason(*e)));
    }
    if (!outcome) {
      started.set_value(outcome);
      return;
    }
    session_ = s.get();
    executor_ = kj::getCurrentThreadExecutor().addRef();
    stop_ = kj::mv(stop.fulfiller);
    started.set_value(ok_status());
    stop.promise.wait(io.waitScope);
    session_ = nullptr;
    // `s` goes before `io`: dropping the session closes the socket and fails calls still pending.
  }

  std::string address_;
  connect_options options_;
  server_version version_;
  std::thread thread_;
  kj::Own<const kj::Executor> executor_;
  kj::Own<kj::CrossThreadPromiseFulfiller<void>> stop_;
  session* session_ = nullptr;  // on the I/O thread only
  kj::Timer* timer_ = nullptr;  // on the I/O thread only
};

}  // namespace

result<std::unique_ptr<connection>> connect(const std::string& host_port, const connect_options& options) {
  // kj would take a missing port as port 0; say what is expected instead.
  const auto colon = host_port.rfind(':');
  const bool has_port = colon != std::string::npos && colon + 1 < host_port.size() &&
                        host_port.find_first_not_of("0123456789", colon + 1) == std::string::npos &&
                        (host_port.front() != '[' || host_port[colon - 1] == ']');
  if (!has_port) {
    return make_error(errc::invalid_argument,
                      "\"" + host_port + "\" is not HOST:PORT (e.g. 127.0.0.1:7600 or [::1]:7600)");
  }
  auto c = std::make_unique<connection_impl>(host_port, options);
  CONVEYOR_TRY(c->start());
  return std::unique_ptr<connection>(std::move(c));
}

}  // namespace conveyor::client
