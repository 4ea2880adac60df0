#include "inference_impl.hpp"

#include <string>

#include "codec.hpp"
#include "conveyor/frontend/request_validation.hpp"
#include "generate_call.hpp"

namespace conveyor::frontend {

namespace wire = conveyor::schema::rpc;

namespace {

/// Hands a service reply (made on any thread) to the kj thread: the callback owns a cross-thread
/// fulfiller; if the service drops the callback unanswered, the promise rejects instead of hanging.
template <class T>
struct cross_thread_reply {
  kj::Promise<T> promise;
  std::function<void(T)> callback;
};

template <class T>
cross_thread_reply<T> make_cross_thread_reply() {
  auto paf = kj::newPromiseAndCrossThreadFulfiller<T>();
  auto holder = std::make_shared<kj::Own<kj::CrossThreadPromiseFulfiller<T>>>(kj::mv(paf.fulfiller));
  return {kj::mv(paf.promise), [holder](T value) { (*holder)->fulfill(std::move(value)); }};
}

}  // namespace

kj::Promise<void> inference_impl::handshake(HandshakeContext context) {
  const std::uint32_t client = context.getParams().getClientProtocolVersion();
  const std::uint32_t server = wire::INFERENCE_PROTOCOL_VERSION;
  if (client < min_protocol_version || client > server) {
    // A protocol failure, not a request failure: an exception is the one reply any old client reads.
    return kj::Exception(kj::Exception::Type::FAILED, __FILE__, __LINE__,
                         kj::str("protocol version mismatch: the client speaks conveyor RPC protocol ", client,
                                 ", this server speaks ",
                                 min_protocol_version == server ? kj::str(server)
                                                                : kj::str(min_protocol_version, " to ", server),
                                 client > server ? " (upgrade the server)" : " (upgrade the client)"));
  }
  auto out = context.getResults().initInfo();
  out.setProtocolVersion(server);
  out.setMinProtocolVersion(min_protocol_version);
  out.setServer(state_.options.server_name);
  return kj::READY_NOW;
}

kj::Promise<void> inference_impl::generate(GenerateContext context) {
  // Without this, Cap'n Proto 0.9 keeps running a call whose caller is gone.
  context.allowCancellation();
  auto params = context.getParams();
  auto request = codec::decode_request(params.getRequest());
  const int prompt_tokens = static_cast<int>(request.prompt.size());
  const auto model = state_.service.info();
  const request_limits limits{model.vocab_size, model.max_context, state_.options.max_stop_ids};
  if (auto ok = validate_request(request, limits); !ok) {
    codec::encode_error(ok.err(), prompt_tokens, 0, context.getResults().initSummary());
    return kj::READY_NOW;
  }
  if (state_.active_requests.load(std::memory_order_relaxed) >= state_.options.max_active_requests) {
    auto busy = make_error(errc::out_of_memory, "the server is busy: " +
                                                    std::to_string(state_.options.max_active_requests) +
                                                    " requests are in progress; retry later");
    codec::encode_error(busy, prompt_tokens, 0, context.getResults().initSummary());
    return kj::READY_NOW;
  }
  auto call = kj::heap<generate_call>(state_, params.getSink());
  auto& c = *call;
  context.releaseParams();
  return c.run(std::move(request))
      .then([context, &c, prompt_tokens](result<service::generate_summary> outcome) mutable {
        auto out = context.getResults().initSummary();
        if (outcome) {
          codec::encode_summary(*outcome, out);
        } else {
          codec::encode_error(outcome.err(), prompt_tokens, c.streamed(), out);
        }
      })
      .attach(kj::mv(call));
}

kj::Promise<void> inference_impl::health(HealthContext context) {
  auto reply = make_cross_thread_reply<service::health_report>();
  state_.service.health(std::move(reply.callback));
  return reply.promise.then([context](service::health_report h) mutable {
    codec::encode_health(h, context.getResults().initHealth());
  });
}

kj::Promise<void> inference_impl::stats(StatsContext context) {
  auto reply = make_cross_thread_reply<service::stats_report>();
  state_.service.stats(std::move(reply.callback));
  return reply.promise.then([this, context](service::stats_report s) mutable {
    auto out = context.getResults().initStats();
    codec::encode_stats(s, out);
    out.setRpcConnections(state_.connections.load(std::memory_order_relaxed));
    out.setRpcGenerateCalls(state_.active_requests.load(std::memory_order_relaxed));
  });
}

kj::Promise<void> inference_impl::info(InfoContext context) {
  codec::encode_info(state_.service.info(), context.getResults().initInfo());
  return kj::READY_NOW;
}

}  // namespace conveyor::frontend
