// The batch scheduler driving the real engine: microbatches, chunked prefill, cancel, bad requests.
#include <gtest/gtest.h>

#include <future>

#include "conveyor/service/local_inference_service.hpp"
#include "scheduler_fixture.hpp"

namespace conveyor::scheduler {
namespace {

using testing::collecting_sink;
using testing::scheduler_test;

TEST_F(scheduler_test, microbatches_with_chunked_prefill_reproduce_goldens) {
  batch_scheduler s(opts_);
  std::vector<std::shared_ptr<collecting_sink>> sinks;
  for (int rep = 0; rep < 3; ++rep) {
    for (std::size_t p = 0; p < golden_.prompts.size(); ++p) {
      sinks.push_back(std::make_shared<collecting_sink>());
      ASSERT_TRUE(s.add(greedy(p), sinks.back()).ok());
    }
  }
  drain(s);
  for (std::size_t i = 0; i < sinks.size(); ++i) {
    ASSERT_TRUE(sinks[i]->done.has_value());
    ASSERT_TRUE(sinks[i]->done->ok()) << sinks[i]->done->err().message;
    EXPECT_EQ(sinks[i]->tokens, golden_.prompts[i % golden_.prompts.size()].greedy) << "request " << i;
    EXPECT_EQ((*sinks[i]->done)->finish_reason, "length");
    EXPECT_EQ((*sinks[i]->done)->completion_tokens, 24);
  }
  EXPECT_EQ(s.blocks().free_blocks(), 64) << "blocks leaked";
  EXPECT_EQ(s.counters().finished, 12);
}

// A cluster whose stages size their KV pools from memory starts the scheduler with none and sizes
// it once they have loaded: only while nothing is queued, since held block ids would dangle.
TEST_F(scheduler_test, the_kv_pool_is_sized_only_while_empty) {
  auto o = opts_;
  o.kv_blocks = 0;
  batch_scheduler s(o);
  auto sink = std::make_shared<collecting_sink>();
  EXPECT_FALSE(s.add(greedy(0), sink).ok()) << "no blocks: every request is too long";
  ASSERT_TRUE(s.set_kv_blocks(48));
  EXPECT_EQ(s.blocks().num_blocks(), 48);
  EXPECT_EQ(s.blocks().free_blocks(), 48);
  ASSERT_TRUE(s.add(greedy(0), sink).ok());
  EXPECT_FALSE(s.set_kv_blocks(96)) << "a queued request";
  drain(s);
  ASSERT_TRUE(sink->done.has_value() && sink->done->ok());
  EXPECT_EQ(sink->tokens, golden_.prompts[0].greedy);
  EXPECT_TRUE(s.set_kv_blocks(96));
  EXPECT_EQ(s.blocks().num_blocks(), 96);
}

TEST_F(scheduler_test, invalid_requests_are_rejected_with_reasons) {
  batch_scheduler s(opts_);
  auto sink = std::make_shared<collecting_sink>();
  auto expect = [&](service::generate_request r, const std::string& needle) {
    auto id = s.add(std::move(r), sink);
    ASSERT_FALSE(id.ok());
    EXPECT_NE(id.err().message.find(needle), std::string::npos) << id.err().message;
  };
  auto r = greedy(1);
  r.prompt.clear();
  expect(r, "empty");
  r = greedy(1);
  r.prompt[2] = 1024;
  expect(r, "vocabulary");
  r = greedy(1);
  r.max_new_tokens = 0;
  expect(r, "max_new_tokens");
  r = greedy(1);
  r.sampling.top_p = 0.0f;
  expect(r, "top_p");
  r = greedy(1);
  r.max_new_tokens = 5000;
  r.prompt.assign(600, 1);
  expect(r, "context");
  EXPECT_FALSE(s.has_work());
}

TEST_F(scheduler_test, cancel_frees_blocks_and_reports_cancelled) {
  batch_scheduler s(opts_);
  auto a = std::make_shared<collecting_sink>();
  auto b = std::make_shared<collecting_sink>();
  auto id_a = s.add(greedy(3), a);
  ASSERT_TRUE(s.add(greedy(1), b).ok());
  auto plan = s.next_step(0);
  ASSERT_TRUE(plan.has_value());
  s.cancel(*id_a);  // in flight: retired when the step completes
  EXPECT_FALSE(a->done.has_value());
  auto out = pipe_->step(*plan);
  ASSERT_TRUE(out.ok());
  s.complete(0, out->tokens);
  ASSERT_TRUE(a->done.has_value());
  EXPECT_EQ((*a->done)->finish_reason, "cancelled");
  drain(s);
  EXPECT_EQ(b->tokens, golden_.prompts[1].greedy);
  EXPECT_EQ(s.blocks().free_blocks(), 64);
  EXPECT_EQ(s.counters().cancelled, 1);
}

TEST_F(scheduler_test, eos_and_stop_ids_end_a_sequence) {
  batch_scheduler s(opts_);
  auto sink = std::make_shared<collecting_sink>();
  auto r = greedy(1);
  r.stop_ids = {golden_.prompts[1].greedy[3]};
  ASSERT_TRUE(s.add(r, sink).ok());
  drain(s);
  ASSERT_TRUE(sink->done.has_value() && sink->done->ok());
  EXPECT_EQ((*sink->done)->finish_reason, "stop");
  EXPECT_EQ(sink->tokens, std::vector<std::int32_t>(golden_.prompts[1].greedy.begin(), golden_.prompts[1].greedy.begin() + 4));
}

TEST_F(scheduler_test, waits_for_kv_blocks_instead_of_failing) {
  opts_.kv_blocks = 3;  // room for one 40-token budget at a time
  batch_scheduler s(opts_);
  std::vector<std::shared_ptr<collecting_sink>> sinks;
  for (int i = 0; i < 3; ++i) {
    sinks.push_back(std::make_shared<collecting_sink>());
    ASSERT_TRUE(s.add(greedy(1), sinks.back()).ok());
  }
  EXPECT_EQ(s.counters().waiting, 3);
  drain(s);
  for (auto& sink : sinks) EXPECT_EQ(sink->tokens, golden_.prompts[1].greedy);
}

TEST(local_inference_service, serves_concurrent_requests_from_threads) {
  auto golden = conveyor::testing::load_golden("tiny-qwen2");
  service::local_service_options o;
  o.stages = 3;
  o.warm_up_batches = {100};  // more than max_seqs_per_step: the warm-up names it
  auto refused = service::make_local_inference_service(golden.dir, o);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.err().message.find("warm-up decode batch 100"), std::string::npos) << refused.err().message;
  o.warm_up_batches = {1, 3, 8};  // throwaway steps first; the requests below still give HF's tokens
  auto svc = service::make_local_inference_service(golden.dir, o);
  ASSERT_TRUE(svc.ok()) << svc.err().message;
  std::vector<std::shared_ptr<collecting_sink>> sinks;
  for (int i = 0; i < 8; ++i) {
    service::generate_request r;
    r.prompt = golden.prompts[i % 2].input_ids;
    r.max_new_tokens = 24;
    r.ignore_eos = true;
    sinks.push_back(std::make_shared<collecting_sink>());
    (*svc)->submit(r, sinks.back());
  }
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(sinks[i]->wait());
    EXPECT_EQ(sinks[i]->tokens, golden.prompts[i % 2].greedy);
  }
  auto bad = std::make_shared<collecting_sink>();
  (*svc)->submit(service::generate_request{}, bad);
  ASSERT_TRUE(bad->wait());
  EXPECT_FALSE(bad->done->ok());
  std::promise<service::stats_report> stats;
  (*svc)->stats([&](service::stats_report r) { stats.set_value(r); });
  auto st = stats.get_future().get();
  EXPECT_EQ(st.requests_finished, 8);
  EXPECT_EQ(st.kv_blocks_free, st.kv_blocks_total);
}

}  // namespace
}  // namespace conveyor::scheduler
