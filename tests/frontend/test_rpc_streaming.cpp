// Streaming and flow control with a scripted service (no model): every token arrives once and in
// order, a slow client gets bigger batches instead of stalling the service, and the numbers that
// matter for a frontend (tokens/s streamed, round trip of a small call) are printed.
#include <gtest/gtest.h>

#include <algorithm>

#include "rpc_test_util.hpp"

namespace conveyor::testing {
namespace {

using clock_type = std::chrono::steady_clock;

double since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

void expect_sequence(const std::vector<std::int32_t>& got, int n) {
  ASSERT_EQ(static_cast<int>(got.size()), n);
  for (int i = 0; i < n; ++i) {
    if (got[i] != i % 1000) FAIL() << "token " << i << " is " << got[i];
  }
}

TEST(RpcStreaming, EveryTokenArrivesInOrderAndFast) {
  scripted_service svc;
  auto server = frontend::start_rpc_server(svc, {});
  ASSERT_TRUE(server.ok());
  auto c = connect_or_die((*server)->address());
  ASSERT_TRUE(c);
  constexpr int kTokens = 300000;
  const auto t0 = clock_type::now();
  auto r = run_generate(*c, {.prompt = {1}, .max_new_tokens = kTokens});
  const double s = since(t0);
  ASSERT_TRUE(r.summary.ok()) << r.summary.err().message;
  expect_sequence(r.tokens, kTokens);
  EXPECT_EQ(r.summary->completion_tokens, kTokens);
  std::printf("streamed %d tokens (one on_tokens call each on the service side) in %.3f s: %.0f tokens/s, "
              "%d batches (%.1f tokens per batch)\n",
              kTokens, s, kTokens / s, r.batches, double(kTokens) / r.batches);
}

TEST(RpcStreaming, SlowClientGetsBiggerBatchesAndNeverStallsTheService) {
  scripted_service svc;
  auto server = frontend::start_rpc_server(svc, {});
  ASSERT_TRUE(server.ok());
  auto c = connect_or_die((*server)->address());
  ASSERT_TRUE(c);
  constexpr int kTokens = 20000;
  std::vector<std::int32_t> got;
  int batches = 0;
  auto summary = c->generate({.prompt = {1}, .max_new_tokens = kTokens}, [&](std::span<const std::int32_t> ids) {
    got.insert(got.end(), ids.begin(), ids.end());
    ++batches;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // a client that reads slowly
    return true;
  });
  ASSERT_TRUE(summary.ok()) << summary.err().message;
  expect_sequence(got, kTokens);
  // At 2 ms per batch, one token per batch would take 40 s; the service's 20000 calls take ~ms.
  EXPECT_LT(batches, kTokens / 10);
  EXPECT_LT(summary->total_s, 1.0) << "the service waited for the client";
  std::printf("slow client: %d tokens in %d batches; the service finished in %.4f s\n", kTokens, batches,
              summary->total_s);
}

TEST(RpcStreaming, ManyConcurrentStreamsOnOneConnection) {
  scripted_service svc;
  auto server = frontend::start_rpc_server(svc, {});
  ASSERT_TRUE(server.ok());
  auto c = connect_or_die((*server)->address());
  ASSERT_TRUE(c);
  constexpr int kCalls = 16;
  std::vector<generation_result> got(kCalls);
  std::vector<std::thread> threads;
  for (int i = 0; i < kCalls; ++i) {
    threads.emplace_back([&, i] { got[i] = run_generate(*c, {.prompt = {1}, .max_new_tokens = 1000 + 100 * i}); });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kCalls; ++i) {
    ASSERT_TRUE(got[i].summary.ok());
    expect_sequence(got[i].tokens, 1000 + 100 * i);
  }
}

TEST(RpcStreaming, RoundTripOfSmallCalls) {
  scripted_service svc;  // replies to health() on the server's own thread: that path must work too
  auto server = frontend::start_rpc_server(svc, {});
  ASSERT_TRUE(server.ok());
  auto c = connect_or_die((*server)->address());
  ASSERT_TRUE(c);
  for (const char* what : {"health", "info"}) {
    std::vector<double> us;
    for (int i = 0; i < 2000; ++i) {
      const auto t0 = clock_type::now();
      const bool ok = std::string(what) == "health" ? c->health().ok() : c->info().ok();
      us.push_back(since(t0) * 1e6);
      ASSERT_TRUE(ok);
    }
    std::sort(us.begin(), us.end());
    std::printf("%s round trip through the client: median %.0f us, p99 %.0f us\n", what, us[us.size() / 2],
                us[us.size() * 99 / 100]);
  }
  // Time to first token of an empty generation, the cheapest generate.
  std::vector<double> us;
  for (int i = 0; i < 500; ++i) {
    const auto t0 = clock_type::now();
    ASSERT_TRUE(run_generate(*c, {.prompt = {1}, .max_new_tokens = 1}).summary.ok());
    us.push_back(since(t0) * 1e6);
  }
  std::sort(us.begin(), us.end());
  std::printf("generate of 1 token (scripted service) round trip: median %.0f us, p99 %.0f us\n", us[us.size() / 2],
              us[us.size() * 99 / 100]);
}

}  // namespace
}  // namespace conveyor::testing
