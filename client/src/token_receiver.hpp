#pragma once
// The client's TokenSink: hands streamed ids to the caller's callback on the connection's I/O thread.
// The server may call it after the generate call ended (a cancelled call races with tokens in
// flight), so the callback is reached through a shared `generation` that the call closes when it
// returns, after which late tokens are dropped.
#include <kj/async.h>

#include <memory>
#include <vector>

#include "conveyor/client/client.hpp"
#include "conveyor/schemas/inference.capnp.h"

namespace conveyor::client {

/// One generate call's view of its tokens; touched only on the I/O thread.
struct generation {
  const token_callback* on_tokens = nullptr;  ///< null once the call returned
  kj::Own<kj::PromiseFulfiller<void>> cancel;  ///< fulfilled when on_tokens asks to stop
  int received = 0;
};

class token_receiver final : public schema::rpc::TokenSink::Server {
 public:
  explicit token_receiver(std::shared_ptr<generation> g) : g_(std::move(g)) {}

 protected:
  kj::Promise<void> tokens(TokensContext context) override {
    if (g_->on_tokens == nullptr) return kj::READY_NOW;
    auto ids = context.getParams().getIds();
    std::vector<std::int32_t> copy;
    copy.reserve(ids.size());
    for (auto id : ids) copy.push_back(id);
    g_->received += static_cast<int>(copy.size());
    const auto& on_tokens = *g_->on_tokens;
    if (on_tokens && !on_tokens(copy) && g_->cancel->isWaiting()) {
      g_->on_tokens = nullptr;
      g_->cancel->fulfill();
    }
    return kj::READY_NOW;
  }
  kj::Promise<void> flush(FlushContext) override { return kj::READY_NOW; }

 private:
  std::shared_ptr<generation> g_;
};

}  // namespace conveyor::client
