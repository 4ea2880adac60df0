#include "generate_call.hpp"

namespace conveyor::frontend {

generate_call::generate_call(server_state& state, schema::rpc::TokenSink::Client sink)
    : state_(state), sink_(kj::mv(sink)) {
  state_.active_requests.fetch_add(1, std::memory_order_relaxed);
}

generate_call::~generate_call() {
  bridge_->detach();
  if (submitted_ && !finished_) state_.service.cancel(ticket_);
  state_.active_requests.fetch_sub(1, std::memory_order_relaxed);
}

kj::Promise<result<service::generate_summary>> generate_call::run(service::generate_request request) {
  ticket_ = state_.service.submit(std::move(request), bridge_);
  submitted_ = true;
  return pump();
}

kj::Promise<result<service::generate_summary>> generate_call::pump() {
  return bridge_->when_ready().then([this]() -> kj::Promise<result<service::generate_summary>> {
    auto batch = bridge_->take();
    kj::Promise<void> sent = kj::READY_NOW;
    if (!batch.tokens.empty()) {
      auto req = sink_.tokensRequest();
      auto ids = req.initIds(static_cast<unsigned>(batch.tokens.size()));
      for (unsigned i = 0; i < batch.tokens.size(); ++i) ids.set(i, batch.tokens[i]);
      streamed_ += static_cast<int>(batch.tokens.size());
      // Resolves when the stream's window has room for more, not when the client has the tokens.
      sent = req.send();
    }
    if (!batch.done) return sent.then([this] { return pump(); });
    finished_ = true;
    auto outcome = kj::heap<result<service::generate_summary>>(std::move(*batch.done));
    return sent.then([this] { return sink_.flushRequest().send().ignoreResult(); })
        .then([outcome = kj::mv(outcome)]() mutable { return std::move(*outcome); });
  });
}

}  // namespace conveyor::frontend
