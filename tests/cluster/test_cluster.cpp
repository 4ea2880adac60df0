// Real clusters: the coordinator actor in this process, stage workers as separate `conveyor worker`
// processes joined over CAF's middleman and wired over UCX; results against the HF goldens.
#include <gtest/gtest.h>

#include <signal.h>

#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>

#include "../engine/golden.hpp"
#include "conveyor/client/client.hpp"
#include "conveyor/coordinator/cluster.hpp"
#include "conveyor/engine/local_pipeline.hpp"
#include "conveyor/engine/memory_plan.hpp"
#include "conveyor/frontend/rpc_server.hpp"
#include "cluster_fixture.hpp"
#include "conveyor/kernels/cpu_backend.hpp"

namespace conveyor::coordinator {
namespace {

class cluster_stages : public ::testing::TestWithParam<int> {};

// Through the whole path a user takes: Cap'n Proto RPC client -> rpc_server -> coordinator actor ->
// stage-worker processes (UCX between them) -> tokens streamed back.
TEST_P(cluster_stages, every_fixture_prompt_gives_the_golden_tokens_through_rpc) {
  for (const std::string fixture : {"tiny-llama", "tiny-qwen2"}) {
    const auto golden = testing::load_golden(fixture);
    auto c = cluster::start(base_options(fixture, GetParam()));
    ASSERT_TRUE(c.ok()) << c.err().message;
    auto server = frontend::start_rpc_server((*c)->service(), frontend::rpc_server_options{});
    ASSERT_TRUE(server.ok()) << server.err().message;
    auto conn = client::connect((*server)->address());
    ASSERT_TRUE(conn.ok()) << conn.err().message;
    for (std::size_t i = 0; i < golden.prompts.size(); ++i) {
      const auto& p = golden.prompts[i];
      client::generate_request r;
      r.prompt = p.input_ids;
      r.max_new_tokens = static_cast<int>(p.greedy.size());
      r.ignore_eos = true;
      std::vector<std::int32_t> streamed;
      auto summary = (*conn)->generate(r, [&](std::span<const std::int32_t> ids) {
        streamed.insert(streamed.end(), ids.begin(), ids.end());
        return true;
      });
      ASSERT_TRUE(summary.ok()) << summary.err().message;
      EXPECT_EQ(streamed, p.greedy) << fixture << " prompt " << i << ", " << GetParam() << " stages";
      EXPECT_EQ(summary->finish_reason, "length");
    }
    auto health = (*conn)->health();
    ASSERT_TRUE(health.ok());
    EXPECT_TRUE(health->ready);
    EXPECT_EQ(static_cast<int>(health->stages.size()), GetParam());
    const auto st = stats_of((*c)->service());
    EXPECT_EQ(st.kv_blocks_free, st.kv_blocks_total);
    conn->reset();
    (*server)->stop();
    (*c)->shutdown();
  }
}

INSTANTIATE_TEST_SUITE_P(stages, cluster_stages, ::testing::Values(1, 2, 3, 4));

// Stages that are tensor-parallel groups (ranks as threads of each worker, CPU collective).
TEST(cluster, tensor_parallel_stages_give_the_golden_tokens) {
  for (const std::string fixture : {"tiny-llama", "tiny-qwen2"}) {
    const auto golden = testing::load_golden(fixture);
    auto o = base_options(fixture, 2);
    o.tp = 2;
    auto c = cluster::start(o);
    ASSERT_TRUE(c.ok()) << c.err().message;
    EXPECT_EQ((*c)->service().info().tp, 2);
    std::vector<std::shared_ptr<collecting_sink>> sinks;
    for (const auto& p : golden.prompts) {
      sinks.push_back(std::make_shared<collecting_sink>());
      (*c)->service().submit(greedy(p), sinks.back());
    }
    for (std::size_t i = 0; i < sinks.size(); ++i) {
      ASSERT_TRUE(sinks[i]->wait()) << fixture << " prompt " << i << " timed out";
      ASSERT_TRUE(sinks[i]->done->ok()) << sinks[i]->done->err().message;
      EXPECT_EQ(sinks[i]->tokens, golden.prompts[i].greedy) << fixture << " prompt " << i << ", 2 stages x tp 2";
    }
  }
  auto o = base_options("tiny-llama", 2);
  o.tp = 3;  // 4 heads, 2 KV heads: 3 divides neither
  auto bad = cluster::start(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.err().message.find("allowed: 1, 2, 4"), std::string::npos) << bad.err().message;
}

// Quantized weights (issue 12): the stage assignment carries the quantization to every worker, so
// 2 stages x tp 2 give the tokens of the same int8 model in one process; a bad value fails the start.
TEST(cluster, quantized_stages_give_the_in_process_quantized_tokens) {
  const auto golden = testing::load_golden("tiny-llama");
  auto backend = kernels::make_cpu_backend({1});
  engine::executor_options eo;
  eo.kv_blocks = 64;
  eo.quant.kind = kernels::weight_quant::int8;
  eo.quant.lm_head = true;
  auto pipe = engine::local_pipeline::create(*backend, golden.dir, 1, eo);
  ASSERT_TRUE(pipe.ok()) << pipe.err().message;
  auto o = base_options("tiny-llama", 2);
  o.tp = 2;
  o.quant = "int8";
  o.quant_lm_head = true;
  auto c = cluster::start(o);
  ASSERT_TRUE(c.ok()) << c.err().message;
  int differs_from_unquantized = 0;
  for (std::size_t i = 0; i < golden.prompts.size(); ++i) {
    engine::generation_request r;
    r.prompt = golden.prompts[i].input_ids;
    r.max_new_tokens = 24;
    r.stop_at_eos = false;
    auto want = (*pipe)->generate({r});
    ASSERT_TRUE(want.ok()) << want.err().message;
    auto sink = std::make_shared<collecting_sink>();
    (*c)->service().submit(greedy(golden.prompts[i]), sink);
    ASSERT_TRUE(sink->wait()) << "prompt " << i << " timed out";
    ASSERT_TRUE(sink->done->ok()) << sink->done->err().message;
    EXPECT_EQ(sink->tokens, (*want)[0].tokens) << "prompt " << i;
    differs_from_unquantized += sink->tokens != golden.prompts[i].greedy;
  }
  // Otherwise a worker that ignored the quantization would pass too.
  EXPECT_GT(differs_from_unquantized, 0);
  auto bad_o = base_options("tiny-llama", 1);
  bad_o.quant = "int4";
  auto bad = cluster::start(bad_o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.err().message.find("int4"), std::string::npos) << bad.err().message;
}

TEST(cluster, concurrent_requests_equal_their_solo_results) {
  const auto golden = testing::load_golden("tiny-llama");
  auto c = cluster::start(base_options("tiny-llama", 2));
  ASSERT_TRUE(c.ok()) << c.err().message;
  const auto before = stats_of((*c)->service());  // the start-up canary is one finished request
  std::vector<std::shared_ptr<collecting_sink>> sinks;
  std::vector<std::thread> clients;
  std::mutex mu;
  for (int i = 0; i < 32; ++i) {
    clients.emplace_back([&, i] {
      const auto& p = golden.prompts[i % golden.prompts.size()];
      auto r = greedy(p);
      r.max_new_tokens = 1 + (i * 7) % 24;  // different lengths: sequences finish at different steps
      auto sink = std::make_shared<collecting_sink>();
      {
        std::lock_guard l(mu);
        sinks.push_back(sink);
      }
      (*c)->service().submit(r, sink);
      ASSERT_TRUE(sink->wait());
      ASSERT_TRUE(sink->done->ok()) << sink->done->err().message;
      EXPECT_EQ(sink->tokens, std::vector<std::int32_t>(p.greedy.begin(), p.greedy.begin() + r.max_new_tokens))
          << "client " << i;
    });
  }
  for (auto& t : clients) t.join();
  const auto st = stats_of((*c)->service());
  EXPECT_EQ(st.requests_finished - before.requests_finished, 32);
  EXPECT_EQ(st.kv_blocks_free, st.kv_blocks_total);
}

TEST(cluster, cancel_frees_blocks) {
  auto c = cluster::start(base_options("tiny-llama", 2));
  ASSERT_TRUE(c.ok()) << c.err().message;
  auto sink = std::make_shared<collecting_sink>();
  service::generate_request r;
  r.prompt = {1, 2, 3};
  r.max_new_tokens = 400;
  r.ignore_eos = true;
  const auto id = (*c)->service().submit(r, sink);
  ASSERT_TRUE(sink->wait_tokens(3));
  (*c)->service().cancel(id);
  ASSERT_TRUE(sink->wait());
  ASSERT_TRUE(sink->done->ok());
  EXPECT_EQ((*sink->done)->finish_reason, "cancelled");
  EXPECT_LT(sink->tokens.size(), 400u);
  const auto st = stats_of((*c)->service());
  EXPECT_EQ(st.kv_blocks_free, st.kv_blocks_total);
}

// With stage recovery off (cluster.recover_stages = false), a dead stage takes the cluster down at once.
TEST(cluster, killed_worker_fails_requests_instead_of_hanging) {
  auto o = base_options("tiny-llama", 3);
  o.recover_stages = false;
  auto c = cluster::start(o);
  ASSERT_TRUE(c.ok()) << c.err().message;
  auto sink = std::make_shared<collecting_sink>();
  service::generate_request r;
  r.prompt = {1, 2, 3};
  r.max_new_tokens = 450;
  r.ignore_eos = true;
  (*c)->service().submit(r, sink);
  ASSERT_TRUE(sink->wait_tokens(2));
  const auto t0 = std::chrono::steady_clock::now();
  ::kill((*c)->worker_pids()[1], SIGKILL);
  ASSERT_TRUE(sink->wait(10)) << "request hung after its worker died";
  const double noticed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(sink->done->ok());
  EXPECT_NE(sink->done->err().message.find("stage 1"), std::string::npos) << sink->done->err().message;
  EXPECT_NE(sink->done->err().message.find("recovery is off"), std::string::npos) << sink->done->err().message;
  EXPECT_LT(noticed, 2.0);
  RecordProperty("failure_noticed_s", std::to_string(noticed));
  // New requests get a clear error too.
  auto late = std::make_shared<collecting_sink>();
  (*c)->service().submit(r, late);
  ASSERT_TRUE(late->wait(5));
  ASSERT_FALSE(late->done->ok());
  EXPECT_NE(late->done->err().message.find("down"), std::string::npos) << late->done->err().message;
}

TEST(cluster, pipelining_overlaps_microbatches) {
  // A per-step delay makes stage time dominate; with chunks = stages every stage has a microbatch.
  auto run = [](int chunks) {
    auto o = base_options("tiny-llama", 3);
    o.chunks = chunks;
    o.step_delay_us = 50000;  // large against the per-step messaging cost, so load on the machine matters little
    o.max_seqs_per_step = 4;
    auto c = cluster::start(o);
    EXPECT_TRUE(c.ok()) << c.err().message;
    std::vector<std::shared_ptr<collecting_sink>> sinks;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 12; ++i) {
      service::generate_request r;
      r.prompt = {1, 2, static_cast<std::int32_t>(3 + i)};
      r.max_new_tokens = 10;
      r.ignore_eos = true;
      sinks.push_back(std::make_shared<collecting_sink>());
      (*c)->service().submit(r, sinks.back());
    }
    for (auto& s : sinks) EXPECT_TRUE(s->wait());
    return 120.0 / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  const double one = run(1);
  const double three = run(3);
  RecordProperty("tokens_per_s_chunks1", std::to_string(one));
  RecordProperty("tokens_per_s_chunks3", std::to_string(three));
  EXPECT_GE(three, 0.8 * 3 * one) << "chunks=1: " << one << " tok/s, chunks=3: " << three << " tok/s";
}

// kv_blocks 0: each worker sizes its KV pool from a fraction of its free memory, split between the
// workers on the same device (both stages here share this host's RAM), and the scheduler hands out
// the least; the goldens come out of the sized pool. Too small a fraction fails the start-up with
// the plan's reason. (A CPU deployment's config keeps a fixed pool; this drives the GPU path's logic.)
TEST(cluster, the_kv_cache_is_sized_from_free_memory) {
  const auto golden = testing::load_golden("tiny-llama");
  auto o = base_options("tiny-llama", 2);
  o.kv_blocks = 0;
  o.max_context = 128;
  o.kv_memory_fraction = 2e-4;
  // What one of the two workers should plan: its half of the fraction, for its half of the layers.
  auto backend = kernels::make_cpu_backend({1});
  auto config = engine::load_model_config(o.model_dir);
  ASSERT_TRUE(config.ok());
  auto ranges = engine::split_even(*config, 2);
  ASSERT_TRUE(ranges.ok());
  engine::executor_options eo;
  eo.kv_block_size = o.kv_block_size;
  eo.max_step_tokens = o.max_step_tokens;
  eo.max_seqs = o.max_seqs_per_step;
  auto plan = engine::plan_memory(*backend, *config, {(*ranges)[0]}, eo, {o.kv_memory_fraction / 2, 1, 0});
  ASSERT_TRUE(plan.ok()) << plan.err().message;
  auto c = cluster::start(o);
  ASSERT_TRUE(c.ok()) << c.err().message;
  const auto st = stats_of((*c)->service());
  // Free memory moves while other tests run: within a factor that an unsplit fraction (2x) exceeds.
  EXPECT_GT(st.kv_blocks_total, plan->kv_blocks * 0.6) << "planned " << plan->kv_blocks;
  EXPECT_LT(st.kv_blocks_total, plan->kv_blocks * 1.6) << "planned " << plan->kv_blocks;
  for (std::size_t i = 0; i < golden.prompts.size(); ++i) {
    auto sink = std::make_shared<collecting_sink>();
    (*c)->service().submit(greedy(golden.prompts[i]), sink);
    ASSERT_TRUE(sink->wait());
    ASSERT_TRUE(sink->done->ok()) << sink->done->err().message;
    EXPECT_EQ(sink->tokens, golden.prompts[i].greedy) << "prompt " << i;
  }
  (*c)->shutdown();

  // Tensor parallel: each rank plans for its slice of the KV heads (one of two here), so a one-stage
  // group of two ranks holds about twice the blocks of one rank with every head.
  auto tp = base_options("tiny-llama", 1);
  tp.kv_blocks = 0;
  tp.max_context = 128;
  tp.kv_memory_fraction = 1e-4;
  tp.tp = 2;
  auto whole = engine::plan_memory(*backend, *config, {engine::whole_model(*config)}, eo,
                                   {tp.kv_memory_fraction, 1, 0});
  ASSERT_TRUE(whole.ok()) << whole.err().message;
  auto ct = cluster::start(tp);
  ASSERT_TRUE(ct.ok()) << ct.err().message;
  const auto tst = stats_of((*ct)->service());
  EXPECT_GT(tst.kv_blocks_total, whole->kv_blocks * 1.3) << "one rank with every head plans " << whole->kv_blocks;
  EXPECT_LT(tst.kv_blocks_total, whole->kv_blocks * 3.0) << "one rank with every head plans " << whole->kv_blocks;
  auto sink = std::make_shared<collecting_sink>();
  (*ct)->service().submit(greedy(golden.prompts[0]), sink);
  ASSERT_TRUE(sink->wait());
  ASSERT_TRUE(sink->done->ok()) << sink->done->err().message;
  EXPECT_EQ(sink->tokens, golden.prompts[0].greedy);
  (*ct)->shutdown();

  o.kv_memory_fraction = 1e-9;
  auto none = cluster::start(o);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.err().message.find("serving.kv_memory_fraction"), std::string::npos) << none.err().message;
  EXPECT_NE(none.err().message.find("KV cache does not fit"), std::string::npos) << none.err().message;
}

// serving.warm_up_batches: every stage (two of a pipeline; both ranks of a tensor-parallel stage)
// runs its warm-up steps at load, on KV blocks no request owns yet, and says so in its health detail
// ("warm-up: 4 steps in ..."): a prefill and batches 1, 2, 5. HF's tokens come out after it.
TEST(cluster, stages_warm_up_at_load_and_give_the_golden_tokens) {
  const auto golden = testing::load_golden("tiny-llama");
  for (const int tp : {1, 2}) {
    auto o = base_options("tiny-llama", tp == 1 ? 2 : 1);
    o.tp = tp;
    o.warm_up_batches = {1, 2, 5};
    auto c = cluster::start(o);
    ASSERT_TRUE(c.ok()) << c.err().message;
    auto p = std::make_shared<std::promise<service::health_report>>();
    auto f = p->get_future();
    (*c)->service().health([p](service::health_report r) { p->set_value(std::move(r)); });
    const service::health_report h = f.get();
    ASSERT_FALSE(h.stages.empty());
    for (const auto& s : h.stages) {
      EXPECT_NE(s.detail.find("warm-up: 4 steps in"), std::string::npos)
          << "stage " << s.stage << " rank " << s.tp_rank << ": " << s.detail;
    }
    for (std::size_t i = 0; i < golden.prompts.size(); ++i) {
      auto sink = std::make_shared<collecting_sink>();
      (*c)->service().submit(greedy(golden.prompts[i]), sink);
      ASSERT_TRUE(sink->wait());
      ASSERT_TRUE(sink->done->ok()) << sink->done->err().message;
      EXPECT_EQ(sink->tokens, golden.prompts[i].greedy) << "prompt " << i << ", tp " << tp;
    }
    (*c)->shutdown();
  }
  // A warm-up the stage cannot run fails the start-up, naming the stage, the warm-up and the way out.
  auto bad = base_options("tiny-llama", 1);
  bad.warm_up_batches = {bad.max_seqs_per_step + 1};
  auto c = cluster::start(bad);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.err().message.find("stage 0: warm-up at load: warm-up decode batch"), std::string::npos)
      << c.err().message;
  EXPECT_NE(c.err().message.find("serving.warm_up = false"), std::string::npos) << c.err().message;
}

// serving.queued_steps on one stage: stage 0 starts step n+1 with step n's draws before the tokens
// go round through the coordinator. Same tokens as without it (and as HF), stop tokens and cancels
// included, and the steps were really queued (the counter), where the plain cluster queues none.
TEST(cluster, one_stage_queued_steps_give_the_same_tokens) {
  const auto golden = testing::load_golden("tiny-llama");
  // The last run: a stage of two tensor-parallel ranks, which queues steps on both (session 31).
  for (const auto [queued, tp] : {std::pair{true, 1}, std::pair{false, 1}, std::pair{true, 2}}) {
    auto o = base_options("tiny-llama", 1);
    o.policy.queued_steps = queued;
    o.tp = tp;
    auto c = cluster::start(o);
    ASSERT_TRUE(c.ok()) << c.err().message;
    std::vector<std::shared_ptr<collecting_sink>> sinks;
    std::vector<service::generate_request> reqs;
    for (int i = 0; i < 8; ++i) {
      const auto& p = golden.prompts[i % golden.prompts.size()];
      auto r = greedy(p);
      r.max_new_tokens = 4 + (i * 5) % 21;
      if (i == 3) r.stop_ids = {p.greedy[6]};  // ends with "stop" while a chained step may be queued
      reqs.push_back(r);
      sinks.push_back(std::make_shared<collecting_sink>());
      (*c)->service().submit(r, sinks.back());
    }
    auto long_one = std::make_shared<collecting_sink>();
    service::generate_request lr;
    lr.prompt = {1, 2, 3};
    lr.max_new_tokens = 400;
    lr.ignore_eos = true;
    const auto long_id = (*c)->service().submit(lr, long_one);
    for (int i = 0; i < 8; ++i) {
      ASSERT_TRUE(sinks[i]->wait());
      ASSERT_TRUE(sinks[i]->done->ok()) << sinks[i]->done->err().message;
      const auto& p = golden.prompts[i % golden.prompts.size()];
      const std::size_t n = i == 3 ? 7 : static_cast<std::size_t>(reqs[i].max_new_tokens);
      EXPECT_EQ(sinks[i]->tokens, std::vector<std::int32_t>(p.greedy.begin(), p.greedy.begin() + n))
          << "request " << i << (queued ? ", queued steps" : ", plain steps") << ", tp " << tp;
      EXPECT_EQ((*sinks[i]->done)->finish_reason, i == 3 ? "stop" : "length");
    }
    ASSERT_TRUE(long_one->wait_tokens(60));  // alone after the others: every step chained
    (*c)->service().cancel(long_id);
    ASSERT_TRUE(long_one->wait());
    EXPECT_EQ((*long_one->done)->finish_reason, "cancelled");
    const auto st = stats_of((*c)->service());
    EXPECT_EQ(st.kv_blocks_free, st.kv_blocks_total) << "blocks leaked";
    if (queued) {
      EXPECT_GT(st.steps_queued_ahead, 40) << "the steps were not queued, tp " << tp;
      // The count reaches RPC clients (`conveyor client stats`) as it stands in the service.
      auto server = frontend::start_rpc_server((*c)->service(), frontend::rpc_server_options{});
      ASSERT_TRUE(server.ok()) << server.err().message;
      auto conn = client::connect((*server)->address());
      ASSERT_TRUE(conn.ok()) << conn.err().message;
      auto rs = (*conn)->stats();
      ASSERT_TRUE(rs.ok()) << rs.err().message;
      EXPECT_EQ(rs->steps_queued_ahead, st.steps_queued_ahead);
      conn->reset();
      (*server)->stop();
    } else {
      EXPECT_EQ(st.steps_queued_ahead, 0);
    }
    (*c)->shutdown();
  }
}

TEST(cluster, bad_model_dir_fails_at_start) {
  auto o = base_options("tiny-llama", 2);
  o.model_dir = "/nonexistent/model";
  auto c = cluster::start(o);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.err().message.find("/nonexistent/model"), std::string::npos);
}

}  // namespace
}  // namespace conveyor::coordinator
