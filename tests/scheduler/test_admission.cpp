// Admission control (queue caps, job tickets) and deadlines: a request turned away hears why at
// once, an accepted one always finishes, and one past its deadline gives every block back.
#include <gtest/gtest.h>

#include <future>

#include "conveyor/service/local_inference_service.hpp"
#include "scheduler_fixture.hpp"

namespace conveyor::scheduler {
namespace {

using testing::collecting_sink;
using testing::scheduler_test;
using namespace std::chrono_literals;

std::string message_of(const result<std::uint64_t>& r) { return r.ok() ? std::string("(accepted)") : r.err().message; }

TEST_F(scheduler_test, job_queue_size_caps_waiting_requests) {
  opts_.policy.job_queue_size = 2;
  batch_scheduler s(opts_);
  std::vector<std::shared_ptr<collecting_sink>> sinks;
  for (int i = 0; i < 2; ++i) {
    sinks.push_back(std::make_shared<collecting_sink>());
    ASSERT_TRUE(s.add(greedy(1), sinks.back()).ok());
  }
  auto third = s.add(greedy(2), std::make_shared<collecting_sink>());
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.err().code, errc::overloaded);
  EXPECT_NE(third.err().message.find("job_queue_size = 2"), std::string::npos) << third.err().message;
  EXPECT_NE(third.err().message.find("retry"), std::string::npos) << third.err().message;
  EXPECT_EQ(s.counters().rejected, 1);
  // Once they have started, the queue has room again.
  ASSERT_TRUE(step(s, 0));
  sinks.push_back(std::make_shared<collecting_sink>());
  ASSERT_TRUE(s.add(greedy(1), sinks.back()).ok()) << "the queue should have room once the first two started";
  drain(s);
  for (auto& sink : sinks) EXPECT_EQ(sink->tokens, golden_.prompts[1].greedy);
  EXPECT_EQ(s.counters().finished, 3);
}

TEST_F(scheduler_test, max_queued_tokens_caps_the_backlog_not_one_prompt) {
  opts_.policy.max_queued_tokens = 40;
  batch_scheduler s(opts_);
  // An empty queue takes a prompt longer than the cap.
  ASSERT_TRUE(s.add(greedy(3), std::make_shared<collecting_sink>()).ok());  // 100 tokens
  auto r = s.add(greedy(1), std::make_shared<collecting_sink>());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.err().code, errc::overloaded);
  EXPECT_NE(r.err().message.find("max_queued_tokens = 40"), std::string::npos) << r.err().message;
  drain(s);
  ASSERT_TRUE(s.add(greedy(2), std::make_shared<collecting_sink>()).ok()) << "33 tokens";
  ASSERT_TRUE(s.add(greedy(1), std::make_shared<collecting_sink>()).ok()) << "33 + 7 = 40 tokens";
  EXPECT_FALSE(s.add(greedy(0), std::make_shared<collecting_sink>()).ok()) << "41 tokens";
  drain(s);
}

TEST_F(scheduler_test, job_tickets_reject_what_cannot_start_at_once) {
  opts_.chunks = 1;
  opts_.max_seqs_per_step = 2;
  opts_.policy.use_job_ticket = true;
  batch_scheduler s(opts_);
  std::vector<std::shared_ptr<collecting_sink>> accepted;
  for (int i = 0; i < 2; ++i) {
    accepted.push_back(std::make_shared<collecting_sink>());
    ASSERT_TRUE(s.add(greedy(1), accepted.back()).ok());
  }
  // Both slots are promised to the two waiting requests.
  auto r = s.add(greedy(1), std::make_shared<collecting_sink>());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.err().code, errc::overloaded);
  EXPECT_NE(r.err().message.find("use_job_ticket"), std::string::npos) << r.err().message;
  ASSERT_TRUE(step(s, 0));
  EXPECT_FALSE(s.add(greedy(1), std::make_shared<collecting_sink>()).ok()) << "both slots are running";
  drain(s);
  for (auto& sink : accepted) EXPECT_EQ(sink->tokens, golden_.prompts[1].greedy);
  accepted.push_back(std::make_shared<collecting_sink>());
  EXPECT_TRUE(s.add(greedy(1), accepted.back()).ok()) << "the slots are free again";
  drain(s);
  EXPECT_EQ(s.counters().rejected, 2);
  EXPECT_EQ(s.counters().finished, 3);
}

TEST_F(scheduler_test, job_tickets_count_kv_blocks) {
  opts_.chunks = 1;
  opts_.kv_blocks = 8;  // 128 tokens: the 100-token prompt, then nothing else
  opts_.policy.use_job_ticket = true;
  batch_scheduler s(opts_);
  ASSERT_TRUE(s.add(greedy(3), std::make_shared<collecting_sink>()).ok());
  auto r = s.add(greedy(2), std::make_shared<collecting_sink>());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.err().message.find("KV cache"), std::string::npos) << r.err().message;
  drain(s);
}

TEST_F(scheduler_test, a_waiting_request_past_its_deadline_is_told_why) {
  batch_scheduler s(opts_);
  auto sink = std::make_shared<collecting_sink>();
  auto r = greedy(2);
  r.deadline_s = 5;
  ASSERT_TRUE(s.add(r, sink).ok());
  s.tick(batch_scheduler::clock::now() + 1s);
  EXPECT_FALSE(sink->done.has_value()) << "not due yet";
  s.tick(batch_scheduler::clock::now() + 6s);
  ASSERT_EQ(sink->code(), errc::deadline_exceeded);
  EXPECT_NE(sink->done->err().message.find("before it started"), std::string::npos) << sink->done->err().message;
  EXPECT_FALSE(s.has_work());
  EXPECT_EQ(s.counters().expired, 1);
  EXPECT_EQ(s.counters().failed, 1);
}

TEST_F(scheduler_test, deadline_expiry_frees_the_blocks_of_a_running_request) {
  opts_.chunks = 1;
  opts_.policy.prefix_caching = false;  // so "free" means given back, not merely evictable
  batch_scheduler s(opts_);
  auto doomed = std::make_shared<collecting_sink>();
  auto other = std::make_shared<collecting_sink>();
  auto r = greedy(3);
  r.deadline_s = 30;
  ASSERT_TRUE(s.add(r, doomed).ok());
  ASSERT_TRUE(s.add(greedy(1), other).ok());
  while (doomed->tokens.size() < 3) ASSERT_TRUE(step(s, 0));
  const int other_blocks = 1;  // 7 prompt + 3 generated tokens
  EXPECT_EQ(s.blocks().free_blocks(), 64 - 7 - other_blocks);
  // In flight: retired when its step completes, never while the stages write its blocks.
  auto plan = s.next_step(0);
  ASSERT_TRUE(plan.has_value());
  ASSERT_EQ(plan->seqs.size(), 2u);
  s.tick(batch_scheduler::clock::now() + 60s);
  EXPECT_FALSE(doomed->done.has_value());
  auto out = pipe_->step(*plan);
  ASSERT_TRUE(out.ok());
  s.complete(0, out->tokens);
  ASSERT_EQ(doomed->code(), errc::deadline_exceeded);
  EXPECT_NE(doomed->done->err().message.find("3 of 24 tokens generated"), std::string::npos)
      << doomed->done->err().message;
  EXPECT_EQ(doomed->tokens.size(), 3u) << "no token after the deadline";
  EXPECT_EQ(s.blocks().free_blocks(), 64 - other_blocks);
  // The other request has no deadline: it runs on to its golden tokens.
  drain(s);
  EXPECT_EQ(other->tokens, golden_.prompts[1].greedy);
  EXPECT_EQ(s.blocks().free_blocks(), 64);
  EXPECT_EQ(s.counters().expired, 1);
}

TEST_F(scheduler_test, response_timeout_bounds_every_request) {
  opts_.policy.response_timeout_s = 10;
  batch_scheduler s(opts_);
  auto a = std::make_shared<collecting_sink>();
  auto b = std::make_shared<collecting_sink>();
  auto longer = greedy(1);
  longer.deadline_s = 100;  // asks for more than the server allows
  auto shorter = greedy(1);
  shorter.deadline_s = 2;
  ASSERT_TRUE(s.add(longer, a).ok());
  ASSERT_TRUE(s.add(shorter, b).ok());
  s.tick(batch_scheduler::clock::now() + 5s);
  EXPECT_EQ(b->code(), errc::deadline_exceeded);
  EXPECT_FALSE(a->done.has_value());
  s.tick(batch_scheduler::clock::now() + 11s);
  EXPECT_EQ(a->code(), errc::deadline_exceeded);
  EXPECT_FALSE(s.has_work());
}

TEST(local_inference_service, overload_with_job_tickets_rejects_fast_and_completes_every_accepted_request) {
  auto golden = conveyor::testing::load_golden("tiny-llama");
  service::local_service_options o;
  o.max_seqs_per_step = 4;
  o.threads = 1;
  o.policy.use_job_ticket = true;
  auto svc = service::make_local_inference_service(golden.dir, o);
  ASSERT_TRUE(svc.ok()) << svc.err().message;
  std::vector<std::shared_ptr<collecting_sink>> sinks;
  for (int i = 0; i < 24; ++i) {
    service::generate_request r;
    r.prompt = golden.prompts[i % 4].input_ids;
    r.max_new_tokens = 24;
    r.ignore_eos = true;
    sinks.push_back(std::make_shared<collecting_sink>());
    (*svc)->submit(r, sinks.back());
  }
  int accepted = 0, rejected = 0;
  for (int i = 0; i < 24; ++i) {
    ASSERT_TRUE(sinks[i]->wait());
    if (sinks[i]->ok()) {
      ++accepted;
      EXPECT_EQ(sinks[i]->tokens, golden.prompts[i % 4].greedy) << "request " << i;
    } else {
      ++rejected;
      EXPECT_EQ(sinks[i]->code(), errc::overloaded) << sinks[i]->done->err().message;
      EXPECT_TRUE(sinks[i]->tokens.empty());
      // Rejected at admission: it never queued behind the running batch.
      EXPECT_EQ(sinks[i]->done->err().message.rfind("overloaded: ", 0), 0u) << sinks[i]->done->err().message;
    }
  }
  EXPECT_GE(accepted, 4);
  EXPECT_GT(rejected, 0);
  std::promise<service::stats_report> stats;
  (*svc)->stats([&](service::stats_report r) { stats.set_value(r); });
  auto st = stats.get_future().get();
  EXPECT_EQ(st.requests_rejected, rejected);
  EXPECT_EQ(st.requests_finished, accepted);
}

TEST(local_inference_service, a_deadline_ends_a_request_that_waits_for_a_static_batch) {
  auto golden = conveyor::testing::load_golden("tiny-llama");
  service::local_service_options o;
  o.max_seqs_per_step = 4;
  o.threads = 1;
  o.policy.batching = service::batching_mode::fixed;  // one request never fills a batch of 4
  auto svc = service::make_local_inference_service(golden.dir, o);
  ASSERT_TRUE(svc.ok()) << svc.err().message;
  service::generate_request r;
  r.prompt = golden.prompts[1].input_ids;
  r.deadline_s = 0.2;
  auto sink = std::make_shared<collecting_sink>();
  const auto t0 = std::chrono::steady_clock::now();
  (*svc)->submit(r, sink);
  ASSERT_TRUE(sink->wait(10)) << "the service loop must wake for the deadline by itself";
  EXPECT_EQ(sink->code(), errc::deadline_exceeded);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
}

}  // namespace
}  // namespace conveyor::scheduler
