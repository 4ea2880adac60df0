// KV pressure and prefix caching: blocks are taken step by step, the newest sequences give theirs
// back when they run out and re-prefill later, and full prompt blocks are shared between requests.
// Tokens never change: greedy ones match the HF goldens, seeded samples match an unpressured run.
#include <gtest/gtest.h>

#include <future>

#include "conveyor/service/local_inference_service.hpp"
#include "scheduler_fixture.hpp"

namespace conveyor::scheduler {
namespace {

using testing::collecting_sink;
using testing::scheduler_test;

struct run_result {
  std::vector<std::vector<std::int32_t>> tokens;
  scheduler_counters counters;
};

class kv_pressure_test : public scheduler_test {
 protected:
  /// Runs `reps` copies of every golden prompt (greedy, or sampled with a per-request seed).
  run_result run(const scheduler_options& o, int reps, bool sampled, bool pipelined) {
    batch_scheduler s(o);
    std::vector<std::shared_ptr<collecting_sink>> sinks;
    for (int rep = 0; rep < reps; ++rep) {
      for (std::size_t p = 0; p < golden_.prompts.size(); ++p) {
        auto r = greedy(p);
        if (sampled) {
          r.sampling.temperature = 0.9f;
          r.sampling.top_k = 40;
          r.sampling.seed = 1000 + sinks.size();
        }
        sinks.push_back(std::make_shared<collecting_sink>());
        EXPECT_TRUE(s.add(r, sinks.back()).ok());
      }
    }
    if (pipelined) {
      drain_pipelined(s);
    } else {
      drain(s);
    }
    run_result out;
    for (auto& sink : sinks) {
      EXPECT_TRUE(sink->ok()) << (sink->done && !sink->done->ok() ? sink->done->err().message : "not done");
      out.tokens.push_back(sink->tokens);
    }
    out.counters = s.counters();
    EXPECT_EQ(s.blocks().free_blocks(), o.kv_blocks) << "blocks leaked";
    return out;
  }

  void expect_goldens(const run_result& r) {
    for (std::size_t i = 0; i < r.tokens.size(); ++i) {
      EXPECT_EQ(r.tokens[i], golden_.prompts[i % golden_.prompts.size()].greedy) << "request " << i;
    }
  }
};

// The longest request (100 prompt + 24 new tokens) needs 8 blocks of 16: a pool of 8 holds one
// such sequence at a time, so twelve requests must preempt each other again and again.
TEST_F(kv_pressure_test, preemption_under_a_tiny_pool_reproduces_goldens) {
  for (bool caching : {false, true}) {
    for (bool pipelined : {false, true}) {
      SCOPED_TRACE(std::string(caching ? "prefix caching" : "no caching") + (pipelined ? ", pipelined" : ""));
      opts_.kv_blocks = 8;
      opts_.policy.prefix_caching = caching;
      auto r = run(opts_, 3, false, pipelined);
      expect_goldens(r);
      EXPECT_GT(r.counters.preempted, 0) << "the pool is too big to test preemption";
    }
  }
}

TEST_F(kv_pressure_test, seeded_samples_survive_preemption) {
  opts_.policy.prefix_caching = false;
  auto roomy = run(opts_, 2, true, false);
  EXPECT_EQ(roomy.counters.preempted, 0);
  opts_.kv_blocks = 9;
  auto tight = run(opts_, 2, true, true);
  EXPECT_GT(tight.counters.preempted, 0);
  EXPECT_EQ(tight.tokens, roomy.tokens) << "a re-prefilled sequence must draw the same tokens";
}

TEST_F(kv_pressure_test, a_repeated_prompt_skips_its_cached_prefill) {
  batch_scheduler s(opts_);
  auto first = std::make_shared<collecting_sink>();
  ASSERT_TRUE(s.add(greedy(3), first).ok());
  drain(s);
  const auto before = s.counters();
  EXPECT_EQ(before.prefix.hit_blocks, 0);
  EXPECT_GE(before.kv_blocks_cached, 6) << "the prompt's full blocks stay cached after it finished";
  // The same 100-token prompt: its first 6 full blocks (96 tokens) are found; only the last 4
  // tokens are prefilled.
  auto second = std::make_shared<collecting_sink>();
  ASSERT_TRUE(s.add(greedy(3), second).ok());
  auto plan = s.next_step(0);
  ASSERT_TRUE(plan.has_value());
  ASSERT_EQ(plan->seqs.size(), 1u);
  EXPECT_EQ(plan->seqs[0].start_pos, 96);
  EXPECT_EQ(plan->seqs[0].tokens.size(), 4u);
  auto out = pipe_->step(*plan);
  ASSERT_TRUE(out.ok());
  s.complete(0, out->tokens);
  drain(s);
  EXPECT_EQ(first->tokens, golden_.prompts[3].greedy);
  EXPECT_EQ(second->tokens, golden_.prompts[3].greedy);
  EXPECT_EQ(s.counters().prefix.hit_blocks, 6);
}

TEST_F(kv_pressure_test, running_sequences_share_a_common_prefix) {
  // A prompt that extends the 100-token one shares its first 6 blocks while both run; without the
  // cache both prefill everything. The tokens must be the same either way.
  std::vector<std::vector<std::int32_t>> results_;
  std::vector<std::int64_t> hits_;
  auto run_pair = [&](bool caching) {
    opts_.policy.prefix_caching = caching;
    opts_.chunks = 1;
    batch_scheduler s(opts_);
    auto a = std::make_shared<collecting_sink>();
    auto b = std::make_shared<collecting_sink>();
    ASSERT_TRUE(s.add(greedy(3), a).ok());
    while (a->tokens.empty()) ASSERT_TRUE(step(s, 0));  // the prompt's blocks are full and published
    auto longer = greedy(3);
    longer.prompt.insert(longer.prompt.end(), {5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22});
    ASSERT_TRUE(s.add(longer, b).ok());
    drain(s);
    EXPECT_EQ(a->tokens, golden_.prompts[3].greedy);
    results_.push_back(b->tokens);
    hits_.push_back(s.counters().prefix.hit_blocks);
  };
  run_pair(false);
  run_pair(true);
  ASSERT_EQ(results_.size(), 2u);
  EXPECT_EQ(results_[1], results_[0]) << "a shared prefix must not change the tokens";
  EXPECT_EQ(hits_[0], 0);
  EXPECT_EQ(hits_[1], 6);
}

TEST_F(kv_pressure_test, cached_blocks_are_evicted_when_new_ones_are_needed) {
  opts_.kv_blocks = 10;
  opts_.chunks = 1;
  batch_scheduler s(opts_);
  auto a = std::make_shared<collecting_sink>();
  ASSERT_TRUE(s.add(greedy(3), a).ok());
  drain(s);
  EXPECT_GT(s.counters().kv_blocks_cached, 0);
  EXPECT_EQ(s.blocks().free_blocks(), 10) << "cached blocks nobody holds count as free";
  // Three 33-token prompts need 9 blocks at once: most of the cached ones must go.
  std::vector<std::shared_ptr<collecting_sink>> others;
  for (int i = 0; i < 3; ++i) {
    others.push_back(std::make_shared<collecting_sink>());
    ASSERT_TRUE(s.add(greedy(2), others.back()).ok());
  }
  drain(s);
  for (auto& o : others) EXPECT_EQ(o->tokens, golden_.prompts[2].greedy);
  EXPECT_GT(s.counters().prefix.evicted_blocks, 0);
  // The evicted prefix is simply prefilled again.
  auto again = std::make_shared<collecting_sink>();
  ASSERT_TRUE(s.add(greedy(3), again).ok());
  drain(s);
  EXPECT_EQ(again->tokens, golden_.prompts[3].greedy);
}

TEST(kv_block_pool, reference_counts_lru_eviction_and_collisions) {
  kv_block_pool pool(3, 2, true);
  const std::vector<std::int32_t> t1 = {1, 2}, t2 = {3, 4};
  const auto h1 = kv_block_pool::chain_hash(0, t1);
  const auto h2 = kv_block_pool::chain_hash(h1, t2);
  EXPECT_NE(h1, kv_block_pool::chain_hash(0, t2));
  EXPECT_NE(h2, kv_block_pool::chain_hash(0, t2)) << "the same block after another prefix is another block";
  auto b1 = pool.allocate(), b2 = pool.allocate();
  ASSERT_TRUE(b1 && b2);
  pool.publish(*b1, h1, t1);
  pool.publish(*b2, h2, t2);
  EXPECT_EQ(pool.lookup(h1, t1), b1) << "a hit holds the block once more";
  EXPECT_FALSE(pool.lookup(h1, t2).has_value()) << "same name, other tokens: a collision is a miss";
  pool.release(*b1);
  EXPECT_EQ(pool.free_blocks(), 1) << "b1 is still held by its first owner";
  pool.release(*b1);
  pool.release(*b2);
  EXPECT_EQ(pool.free_blocks(), 3);
  EXPECT_EQ(pool.cached_blocks(), 2);
  // b1 was released first: least recently used, evicted first once the plain free block is gone.
  auto c1 = pool.allocate();
  auto c2 = pool.allocate();
  ASSERT_TRUE(c1 && c2);
  EXPECT_EQ(*c2, *b1);
  EXPECT_FALSE(pool.lookup(h1, t1).has_value());
  EXPECT_EQ(pool.lookup(h2, t2), b2);
  EXPECT_FALSE(pool.allocate().has_value()) << "every block is held";
  // A second block with a name already taken stays private.
  pool.publish(*c1, h2, t2);
  EXPECT_EQ(pool.cached_blocks(), 1);
  EXPECT_EQ(pool.counters().hit_blocks, 2);
  EXPECT_EQ(pool.counters().evicted_blocks, 1);
}

TEST(local_inference_service, stats_show_prefix_cache_hits) {
  auto golden = conveyor::testing::load_golden("tiny-llama");
  service::local_service_options o;
  o.threads = 1;
  auto svc = service::make_local_inference_service(golden.dir, o);
  ASSERT_TRUE(svc.ok()) << svc.err().message;
  for (int i = 0; i < 2; ++i) {
    service::generate_request r;
    r.prompt = golden.prompts[3].input_ids;
    r.max_new_tokens = 24;
    r.ignore_eos = true;
    auto sink = std::make_shared<collecting_sink>();
    (*svc)->submit(r, sink);
    ASSERT_TRUE(sink->wait());
    EXPECT_EQ(sink->tokens, golden.prompts[3].greedy);
  }
  std::promise<service::stats_report> stats;
  (*svc)->stats([&](service::stats_report r) { stats.set_value(r); });
  auto st = stats.get_future().get();
  EXPECT_EQ(st.prefix_cache_hit_tokens, 96);
  EXPECT_GE(st.prefix_cache_queried_tokens, 96);
  EXPECT_GT(st.kv_blocks_cached, 0);
}

}  // namespace
}  // namespace conveyor::scheduler
