// Bad input reaches one client as an error that names the problem; the server keeps serving everyone.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>

#include "rpc_test_util.hpp"

namespace conveyor::testing {
namespace {

const std::vector<std::int32_t> kPrompt = {989, 229, 186, 822, 100, 504, 324};
const std::vector<std::int32_t> kGreedy5 = {371, 119, 801, 572, 692};

client::generate_request good_request() {
  client::generate_request r;
  r.prompt = kPrompt;
  r.max_new_tokens = 5;
  r.ignore_eos = true;
  return r;
}

void expect_still_serves(const std::string& address) {
  auto c = connect_or_die(address);
  ASSERT_TRUE(c);
  auto r = run_generate(*c, good_request());
  ASSERT_TRUE(r.summary.ok()) << r.summary.err().message;
  EXPECT_EQ(r.tokens, kGreedy5);
}

struct bad_case {
  const char* name;
  std::function<void(client::generate_request&)> spoil;
  const char* message;  ///< a substring of the error
};

TEST(RpcErrors, BadRequestsGetClearErrorsAndTheServerKeepsServing) {
  auto s = start_local_server("tiny-llama");
  ASSERT_TRUE(s);
  auto c = connect_or_die(s->address());
  ASSERT_TRUE(c);
  const std::vector<bad_case> cases = {
      {"empty prompt", [](auto& r) { r.prompt.clear(); }, "prompt is empty"},
      {"id beyond vocab", [](auto& r) { r.prompt[3] = 1024; }, "prompt id 1024 at position 3 is outside the vocabulary [0, 1024)"},
      {"negative id", [](auto& r) { r.prompt[0] = -5; }, "prompt id -5 at position 0"},
      {"negative max tokens", [](auto& r) { r.max_new_tokens = -1; }, "maxNewTokens must be at least 1, got -1"},
      {"zero max tokens", [](auto& r) { r.max_new_tokens = 0; }, "maxNewTokens must be at least 1, got 0"},
      {"top_p zero", [](auto& r) { r.top_p = 0.0f; }, "sampling.topP must be in (0, 1], got 0"},
      {"top_p above one", [](auto& r) { r.top_p = 1.5f; }, "sampling.topP must be in (0, 1], got 1.5"},
      {"top_p nan", [](auto& r) { r.top_p = std::nanf(""); }, "sampling.topP"},
      {"negative temperature", [](auto& r) { r.temperature = -1.0f; }, "sampling.temperature must be in [0, 100]"},
      {"negative top_k", [](auto& r) { r.top_k = -3; }, "sampling.topK must be >= 0"},
      {"context overflow", [](auto& r) { r.max_new_tokens = 100000; }, "exceeds the context limit"},
      {"stop id beyond vocab", [](auto& r) { r.stop_ids = {5, 4096}; }, "stop id 4096 at position 1"},
      {"negative deadline", [](auto& r) { r.deadline_s = -1; }, "deadlineS"},
  };
  for (const auto& bad : cases) {
    SCOPED_TRACE(bad.name);
    auto req = good_request();
    bad.spoil(req);
    auto r = run_generate(*c, req);
    ASSERT_FALSE(r.summary.ok());
    EXPECT_EQ(r.summary.err().code, errc::invalid_argument);
    EXPECT_NE(r.summary.err().message.find(bad.message), std::string::npos) << r.summary.err().message;
    EXPECT_TRUE(r.tokens.empty());
  }
  // The same connection still works, and so does a new one.
  auto r = run_generate(*c, good_request());
  ASSERT_TRUE(r.summary.ok()) << r.summary.err().message;
  EXPECT_EQ(r.tokens, kGreedy5);
  expect_still_serves(s->address());
  auto st = c->stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->kv_blocks_free, st->kv_blocks_total);
}

TEST(RpcErrors, OversizedMessageDropsOnlyThatClient) {
  frontend::rpc_server_options o;
  o.max_message_bytes = 1 << 20;
  auto s = start_local_server("tiny-llama", o);
  ASSERT_TRUE(s);
  auto bystander = connect_or_die(s->address());
  ASSERT_TRUE(bystander);
  auto c = connect_or_die(s->address());
  ASSERT_TRUE(c);
  auto req = good_request();
  req.prompt.assign(400000, 7);  // 1.6 MB of ids
  auto r = run_generate(*c, req);
  ASSERT_FALSE(r.summary.ok());
  // The server refuses the message from its segment table, before reading the body, and closes the
  // connection; the client sees the abort or the reset, depending on how far it got with sending.
  std::printf("oversized message: %s\n", r.summary.err().message.c_str());
  // That connection is gone; later calls on it fail fast instead of hanging.
  EXPECT_FALSE(c->health().ok());
  // Everyone else is served.
  auto b = run_generate(*bystander, good_request());
  ASSERT_TRUE(b.summary.ok()) << b.summary.err().message;
  EXPECT_EQ(b.tokens, kGreedy5);
  expect_still_serves(s->address());
}

TEST(RpcErrors, LargePromptWithinTheLimitIsAValueError) {
  // Under the message limit but over the context: the request is refused, the connection stays.
  auto s = start_local_server("tiny-llama");
  ASSERT_TRUE(s);
  auto c = connect_or_die(s->address());
  ASSERT_TRUE(c);
  auto req = good_request();
  req.prompt.assign(100000, 7);
  auto r = run_generate(*c, req);
  ASSERT_FALSE(r.summary.ok());
  EXPECT_NE(r.summary.err().message.find("exceeds the context limit"), std::string::npos);
  EXPECT_TRUE(c->health().ok());
}

TEST(RpcErrors, VersionMismatchFailsTheConnect) {
  auto s = start_local_server("tiny-llama");
  ASSERT_TRUE(s);
  client::connect_options o;
  o.protocol_version = 999;
  auto c = client::connect(s->address(), o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.err().code, errc::io);
  EXPECT_NE(c.err().message.find("protocol version mismatch: the client speaks conveyor RPC protocol 999"),
            std::string::npos)
      << c.err().message;
  EXPECT_NE(c.err().message.find("upgrade the server"), std::string::npos) << c.err().message;
  expect_still_serves(s->address());
}

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

TEST(RpcErrors, ConnectRefusedIsAnError) {
  const std::string addr = "127.0.0.1:" + std::to_string(free_port());
  auto c = client::connect(addr);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.err().message.find("cannot connect to " + addr), std::string::npos) << c.err().message;
}

TEST(RpcErrors, ConnectTimesOutOnAServerThatNeverAnswers) {
  // A socket that listens but never accepts: TCP connects (the kernel's backlog), the handshake hangs.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(listen(fd, 4), 0);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  client::connect_options o;
  o.connect_timeout_s = 0.3;
  const auto t0 = std::chrono::steady_clock::now();
  auto c = client::connect("127.0.0.1:" + std::to_string(ntohs(a.sin_port)), o);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  close(fd);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.err().message.find("no answer within"), std::string::npos) << c.err().message;
  EXPECT_LT(took, 3.0);
}

TEST(RpcErrors, BadAddressesAreErrors) {
  auto unknown = client::connect("no-such-host.invalid:1", {.connect_timeout_s = 5});
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.err().message.find("cannot connect to no-such-host.invalid:1: DNS lookup failed"),
            std::string::npos) << unknown.err().message;
  for (const char* bad : {"127.0.0.1", "127.0.0.1:", "127.0.0.1:x", "[::1]", ""}) {
    auto c = client::connect(bad);
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_EQ(c.err().code, errc::invalid_argument);
    EXPECT_NE(c.err().message.find("is not HOST:PORT"), std::string::npos) << c.err().message;
  }
  scripted_service svc;
  auto a = frontend::start_rpc_server(svc, {});
  ASSERT_TRUE(a.ok()) << a.err().message;
  frontend::rpc_server_options same;
  same.listen = (*a)->address();
  auto b = frontend::start_rpc_server(svc, same);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.err().message.find("cannot listen on " + same.listen), std::string::npos) << b.err().message;
  auto no_port = frontend::start_rpc_server(svc, {.listen = "127.0.0.1"});
  ASSERT_FALSE(no_port.ok());
  EXPECT_NE(no_port.err().message.find("is not HOST:PORT"), std::string::npos) << no_port.err().message;
}

TEST(RpcErrors, ServerBindsOnlyTheConfiguredAddress) {
  scripted_service svc;
  auto a = frontend::start_rpc_server(svc, {});  // default: 127.0.0.1, port 0
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)->address(), "127.0.0.1:" + std::to_string((*a)->port()));
  EXPECT_GT((*a)->port(), 0);
  // Linux routes all of 127/8 to lo, but a socket bound to 127.0.0.1 takes no calls to 127.0.0.2.
  auto other = client::connect("127.0.0.2:" + std::to_string((*a)->port()), {.connect_timeout_s = 2});
  EXPECT_FALSE(other.ok());
  EXPECT_TRUE(client::connect((*a)->address()).ok());
  (*a)->stop();
  (*a)->stop();  // idempotent
}

}  // namespace
}  // namespace conveyor::testing
