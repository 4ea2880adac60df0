// Dropping a generate call (a callback that says stop, a client that disconnects, a server that
// stops) cancels the request in the service, which frees its KV blocks.
#include <capnp/ez-rpc.h>
#include <gtest/gtest.h>

#include "conveyor/schemas/inference.capnp.h"
#include "rpc_test_util.hpp"

namespace conveyor::testing {
namespace {

client::generate_request long_request() {
  client::generate_request r;
  r.prompt = {989, 229, 186, 822, 100, 504, 324};
  r.max_new_tokens = 480;  // most of tiny-llama's 512 positions: far more than arrive before the cancel
  r.ignore_eos = true;
  return r;
}

bool service_idle(client::connection& c, std::int64_t* tokens_generated = nullptr) {
  auto st = c.stats();
  if (!st) return false;
  if (tokens_generated) *tokens_generated = st->tokens_generated;
  return st->requests_running == 0 && st->requests_waiting == 0 && st->kv_blocks_free == st->kv_blocks_total &&
         st->rpc_generate_calls == 0;
}

TEST(RpcCancel, CallbackThatStopsCancelsTheRequestAndFreesItsBlocks) {
  auto s = start_local_server("tiny-llama");
  ASSERT_TRUE(s);
  auto c = connect_or_die(s->address());
  ASSERT_TRUE(c);
  int seen = 0;
  auto summary = c->generate(long_request(), [&](std::span<const std::int32_t> ids) {
    seen += static_cast<int>(ids.size());
    return false;
  });
  ASSERT_TRUE(summary.ok()) << summary.err().message;
  EXPECT_EQ(summary->finish_reason, "cancelled");
  EXPECT_EQ(summary->completion_tokens, seen);
  std::int64_t generated = 0;
  EXPECT_TRUE(eventually([&] { return service_idle(*c, &generated); }));
  EXPECT_LT(generated, 480) << "the request ran to the end: it was not cancelled";
  // Tokens still in flight when the call was dropped never reach the callback (it is gone).
  auto r = run_generate(*c, {.prompt = {1, 2, 3}, .max_new_tokens = 3});
  EXPECT_TRUE(r.summary.ok());
}

/// A raw Cap'n Proto client on this thread: the test controls exactly when the connection goes away.
class counting_sink final : public schema::rpc::TokenSink::Server {
 public:
  explicit counting_sink(kj::Own<kj::PromiseFulfiller<void>> first) : first_(kj::mv(first)) {}

 protected:
  kj::Promise<void> tokens(TokensContext) override {
    if (first_->isWaiting()) first_->fulfill();
    return kj::READY_NOW;
  }
  kj::Promise<void> flush(FlushContext) override { return kj::READY_NOW; }

 private:
  kj::Own<kj::PromiseFulfiller<void>> first_;
};

void generate_then_disconnect(const std::string& address, int max_new_tokens) {
  capnp::EzRpcClient raw(address);
  auto inference = raw.getMain<schema::rpc::Inference>();
  auto first = kj::newPromiseAndFulfiller<void>();
  auto req = inference.generateRequest();
  auto ids = req.initRequest().initPromptIds(3);
  for (unsigned i = 0; i < 3; ++i) ids.set(i, 10 + i);
  req.getRequest().setMaxNewTokens(max_new_tokens);
  req.getRequest().setIgnoreEos(true);
  req.setSink(kj::heap<counting_sink>(kj::mv(first.fulfiller)));
  auto call = req.send();
  first.promise.wait(raw.getWaitScope());
  // Leaving the scope drops the call and closes the socket without a word.
}

TEST(RpcCancel, ClientThatDisconnectsMidStreamFreesItsBlocks) {
  auto s = start_local_server("tiny-llama");
  ASSERT_TRUE(s);
  generate_then_disconnect(s->address(), 480);
  auto c = connect_or_die(s->address());
  ASSERT_TRUE(c);
  std::int64_t generated = 0;
  EXPECT_TRUE(eventually([&] { return service_idle(*c, &generated); }));
  EXPECT_LT(generated, 480);
  auto st = c->stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->rpc_connections, 1);  // only this one
}

class throwing_sink final : public schema::rpc::TokenSink::Server {
 protected:
  kj::Promise<void> tokens(TokensContext) override { KJ_FAIL_REQUIRE("this client refuses tokens"); }
  kj::Promise<void> flush(FlushContext) override { return kj::READY_NOW; }
};

TEST(RpcCancel, SinkThatFailsEndsTheCallAndCancelsTheRequest) {
  scripted_service svc(std::chrono::microseconds(200));
  auto server = frontend::start_rpc_server(svc, {});
  ASSERT_TRUE(server.ok());
  {
    capnp::EzRpcClient raw((*server)->address());
    auto req = raw.getMain<schema::rpc::Inference>().generateRequest();
    req.initRequest().initPromptIds(1).set(0, 1);
    req.getRequest().setMaxNewTokens(1000000);
    req.setSink(kj::heap<throwing_sink>());
    auto outcome = req.send().then([](auto) { return std::string("returned"); },
                                   [](kj::Exception&& e) { return std::string(e.getDescription().cStr()); });
    const auto what = outcome.wait(raw.getWaitScope());
    EXPECT_NE(what.find("this client refuses tokens"), std::string::npos) << what;
  }
  EXPECT_TRUE(eventually([&] { return svc.cancelled.load() == 1 && svc.running.load() == 0; }));
  auto c = connect_or_die((*server)->address());
  ASSERT_TRUE(c);
  EXPECT_TRUE(c->health().ok());
}

TEST(RpcCancel, ScriptedServiceSeesTheCancel) {
  scripted_service svc(std::chrono::microseconds(200));
  auto server = frontend::start_rpc_server(svc, {});
  ASSERT_TRUE(server.ok());
  generate_then_disconnect((*server)->address(), 1000000);
  EXPECT_TRUE(eventually([&] { return svc.cancelled.load() == 1 && svc.running.load() == 0; }));
}

TEST(RpcCancel, StoppingTheServerFailsCallsAndCancelsTheirRequests) {
  scripted_service svc(std::chrono::microseconds(200));
  auto server = frontend::start_rpc_server(svc, {});
  ASSERT_TRUE(server.ok());
  auto c = connect_or_die((*server)->address());
  ASSERT_TRUE(c);
  std::atomic<int> seen{0};
  result<client::generate_summary> outcome = make_error(errc::internal, "not run");
  std::thread t([&] {
    outcome = c->generate({.prompt = {1}, .max_new_tokens = 1000000}, [&](std::span<const std::int32_t> ids) {
      seen += static_cast<int>(ids.size());
      return true;
    });
  });
  ASSERT_TRUE(eventually([&] { return seen.load() > 0; }));
  (*server)->stop();
  t.join();
  ASSERT_FALSE(outcome.ok());
  EXPECT_EQ(outcome.err().code, errc::io) << outcome.err().message;
  EXPECT_NE(outcome.err().message.find("lost"), std::string::npos) << outcome.err().message;
  EXPECT_TRUE(eventually([&] { return svc.cancelled.load() == 1; }));
  EXPECT_FALSE(c->health().ok());  // the connection is dead, and says so at once
}

}  // namespace
}  // namespace conveyor::testing
