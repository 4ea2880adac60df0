// Real RPC over TCP on 127.0.0.1 in front of the in-process engine: HF's greedy tokens arrive through
// the client for every fixture, and concurrent clients get exactly their solo results.
#include <gtest/gtest.h>

#include <algorithm>

#include "rpc_test_util.hpp"

namespace conveyor::testing {
namespace {

client::generate_request greedy_request(const std::vector<std::int32_t>& prompt, int n = 24) {
  client::generate_request r;
  r.prompt = prompt;
  r.max_new_tokens = n;
  r.ignore_eos = true;
  return r;
}

TEST(RpcGolden, TinyLlamaPromptGivesHfGreedyTokens) {
  auto s = start_local_server("tiny-llama");
  ASSERT_TRUE(s);
  auto c = connect_or_die(s->address());
  ASSERT_TRUE(c);
  EXPECT_EQ(c->server().protocol_version, 1u);
  const std::vector<std::int32_t> want = {371, 119, 801, 572, 692, 735, 572, 698, 641, 53,  1005, 620,
                                          931, 415, 46,  170, 897, 736, 36,  194, 330, 256, 635,  529};
  auto r = run_generate(*c, greedy_request({989, 229, 186, 822, 100, 504, 324}));
  ASSERT_TRUE(r.summary.ok()) << r.summary.err().message;
  EXPECT_EQ(r.tokens, want);
  EXPECT_EQ(r.summary->completion_tokens, 24);
  EXPECT_EQ(r.summary->prompt_tokens, 7);
  EXPECT_EQ(r.summary->finish_reason, "length");
  EXPECT_GE(r.summary->total_s, r.summary->first_token_s);
  EXPECT_GE(r.batches, 1);
}

TEST(RpcGolden, StopIdEndsTheStreamWithFinishReasonStop) {
  auto s = start_local_server("tiny-llama");
  ASSERT_TRUE(s);
  auto c = connect_or_die(s->address());
  ASSERT_TRUE(c);
  auto req = greedy_request({989, 229, 186, 822, 100, 504, 324});
  req.stop_ids = {692};  // the 5th greedy token
  auto r = run_generate(*c, req);
  ASSERT_TRUE(r.summary.ok()) << r.summary.err().message;
  EXPECT_EQ(r.tokens, (std::vector<std::int32_t>{371, 119, 801, 572, 692}));
  EXPECT_EQ(r.summary->finish_reason, "stop");
  EXPECT_EQ(r.summary->completion_tokens, 5);
}

TEST(RpcGolden, EveryFixturePromptThroughTheClient) {
  for (const auto& name : fixture_list()) {
    SCOPED_TRACE(name);
    auto s = start_local_server(name);
    ASSERT_TRUE(s);
    auto c = connect_or_die(s->address());
    ASSERT_TRUE(c);
    auto info = c->info();
    ASSERT_TRUE(info.ok()) << info.err().message;
    EXPECT_GT(info->vocab_size, 0);
    for (const auto& g : load_golden_json(name)) {
      auto r = run_generate(*c, greedy_request(g.prompt, static_cast<int>(g.greedy.size())));
      ASSERT_TRUE(r.summary.ok()) << r.summary.err().message;
      EXPECT_EQ(r.tokens, g.greedy) << "prompt of " << g.prompt.size() << " tokens";
    }
  }
}

TEST(RpcGolden, StageSplitsGiveTheSameTokens) {
  const auto golden = load_golden_json("tiny-llama");
  for (int stages = 2; stages <= 4; ++stages) {
    SCOPED_TRACE(std::to_string(stages) + " stages");
    auto s = start_local_server("tiny-llama", {}, stages);
    ASSERT_TRUE(s);
    auto c = connect_or_die(s->address());
    ASSERT_TRUE(c);
    auto info = c->info();
    ASSERT_TRUE(info.ok());
    EXPECT_EQ(info->stages, stages);
    for (const auto& g : golden) {
      auto r = run_generate(*c, greedy_request(g.prompt));
      ASSERT_TRUE(r.summary.ok()) << r.summary.err().message;
      EXPECT_EQ(r.tokens, g.greedy);
    }
  }
}

/// Requests of different lengths, budgets and sampling settings, so concurrent ones share steps at
/// different positions.
std::vector<client::generate_request> mixed_requests(int n) {
  auto golden = load_golden_json("tiny-llama");
  std::vector<client::generate_request> out;
  for (int i = 0; i < n; ++i) {
    auto r = greedy_request(golden[i % golden.size()].prompt, 4 + (i * 7) % 40);
    if (i % 3 == 1) {
      r.temperature = 0.8f;
      r.top_k = 40;
      r.top_p = 0.9f;
      r.seed = 1000 + i;
    }
    if (i % 5 == 2) r.prompt.resize(std::max<std::size_t>(1, r.prompt.size() / 2));
    out.push_back(r);
  }
  return out;
}

TEST(RpcGolden, ConcurrentClientsEqualTheirSoloResults) {
  auto s = start_local_server("tiny-llama");
  ASSERT_TRUE(s);
  constexpr int kClients = 32;
  const auto requests = mixed_requests(kClients);
  std::vector<std::vector<std::int32_t>> solo(kClients);
  {
    auto c = connect_or_die(s->address());
    ASSERT_TRUE(c);
    for (int i = 0; i < kClients; ++i) {
      auto r = run_generate(*c, requests[i]);
      ASSERT_TRUE(r.summary.ok()) << r.summary.err().message;
      solo[i] = r.tokens;
    }
  }
  std::vector<generation_result> got(kClients);
  std::vector<std::thread> threads;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      auto c = connect_or_die(s->address());
      if (c) got[i] = run_generate(*c, requests[i]);
    });
  }
  for (auto& t : threads) t.join();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::size_t total = 0;
  for (const auto& g : got) total += g.tokens.size();
  std::printf("%d concurrent clients (tiny-llama, CPU, 1 thread): %zu tokens in %.3f s = %.0f tokens/s\n", kClients,
              total, wall, total / wall);
  for (int i = 0; i < kClients; ++i) {
    ASSERT_TRUE(got[i].summary.ok()) << i << ": " << got[i].summary.err().message;
    EXPECT_EQ(got[i].tokens, solo[i]) << "client " << i;
    EXPECT_EQ(got[i].summary->completion_tokens, static_cast<int>(solo[i].size()));
  }
}

TEST(RpcGolden, ThreadsSharingOneConnectionEqualTheirSoloResults) {
  auto s = start_local_server("tiny-llama");
  ASSERT_TRUE(s);
  constexpr int kCalls = 16;
  const auto requests = mixed_requests(kCalls);
  auto c = connect_or_die(s->address());
  ASSERT_TRUE(c);
  std::vector<std::vector<std::int32_t>> solo(kCalls);
  for (int i = 0; i < kCalls; ++i) solo[i] = run_generate(*c, requests[i]).tokens;
  std::vector<generation_result> got(kCalls);
  std::vector<std::thread> threads;
  for (int i = 0; i < kCalls; ++i) threads.emplace_back([&, i] { got[i] = run_generate(*c, requests[i]); });
  for (auto& t : threads) t.join();
  for (int i = 0; i < kCalls; ++i) {
    ASSERT_TRUE(got[i].summary.ok()) << got[i].summary.err().message;
    EXPECT_EQ(got[i].tokens, solo[i]) << "call " << i;
  }
}

TEST(RpcGolden, HealthStatsAndInfo) {
  auto s = start_local_server("tiny-llama");
  ASSERT_TRUE(s);
  auto c = connect_or_die(s->address());
  ASSERT_TRUE(c);
  auto h = c->health();
  ASSERT_TRUE(h.ok()) << h.err().message;
  EXPECT_TRUE(h->ready);
  EXPECT_EQ(h->stages.size(), 1u);
  auto i = c->info();
  ASSERT_TRUE(i.ok());
  EXPECT_EQ(i->model_type, "llama");
  EXPECT_EQ(i->vocab_size, 1024);
  EXPECT_EQ(i->num_layers, 4);
  EXPECT_GT(i->max_context, 0);
  ASSERT_TRUE(run_generate(*c, greedy_request({1, 2, 3}, 5)).summary.ok());
  auto st = c->stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->requests_finished, 1);
  EXPECT_EQ(st->tokens_generated, 5);
  EXPECT_EQ(st->kv_blocks_free, st->kv_blocks_total);
  EXPECT_EQ(st->rpc_connections, 1);
  EXPECT_EQ(st->rpc_generate_calls, 0);
}

}  // namespace
}  // namespace conveyor::testing
