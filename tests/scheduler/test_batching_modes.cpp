// Batching modes: continuous admits into the running batch at every step; dynamic collects up to
// max_batch_size requests or waits max_batch_delay_ms, then runs that batch to the end; fixed
// ("static") waits for exactly max_batch_size requests. Tokens never depend on the mode.
#include <gtest/gtest.h>

#include "scheduler_fixture.hpp"

namespace conveyor::scheduler {
namespace {

using testing::collecting_sink;
using testing::scheduler_test;
using namespace std::chrono_literals;
using clock = batch_scheduler::clock;

class batching_test : public scheduler_test {
 protected:
  void SetUp() override {
    scheduler_test::SetUp();
    opts_.chunks = 1;
    opts_.max_seqs_per_step = 3;
    opts_.policy.max_batch_delay_ms = 50;
  }

  std::shared_ptr<collecting_sink> add(batch_scheduler& s, std::size_t prompt) {
    auto sink = std::make_shared<collecting_sink>();
    EXPECT_TRUE(s.add(greedy(prompt), sink).ok());
    sinks_.push_back({sink, prompt});
    return sink;
  }

  void expect_goldens() {
    for (auto& [sink, prompt] : sinks_) {
      ASSERT_TRUE(sink->ok());
      EXPECT_EQ(sink->tokens, golden_.prompts[prompt].greedy) << "prompt " << prompt;
    }
  }

  std::vector<std::pair<std::shared_ptr<collecting_sink>, std::size_t>> sinks_;
};

TEST_F(batching_test, continuous_admits_into_the_running_batch) {
  batch_scheduler s(opts_);
  add(s, 1);
  auto first = s.next_step(0);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->seqs.size(), 1u);
  auto out = pipe_->step(*first);
  ASSERT_TRUE(out.ok());
  s.complete(0, out->tokens);
  add(s, 2);
  auto second = s.next_step(0);
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->seqs.size(), 2u) << "the newcomer joins the decoding sequence at once";
  out = pipe_->step(*second);
  ASSERT_TRUE(out.ok());
  s.complete(0, out->tokens);
  drain(s);
  expect_goldens();
}

TEST_F(batching_test, chunked_prefill_lets_running_sequences_decode_every_step) {
  batch_scheduler s(opts_);  // max_step_tokens = 24
  auto decoding = add(s, 1);
  while (decoding->tokens.size() < 2) ASSERT_TRUE(step(s, 0));
  add(s, 3);  // 100 prompt tokens: five steps of prefill
  for (int i = 0; i < 5; ++i) {
    const auto before = decoding->tokens.size();
    auto plan = s.next_step(0);
    ASSERT_TRUE(plan.has_value());
    ASSERT_EQ(plan->seqs.size(), 2u);
    EXPECT_EQ(plan->seqs[0].tokens.size(), 1u) << "the decoding sequence goes first";
    EXPECT_EQ(plan->seqs[1].tokens.size(), std::min<std::size_t>(23, 100 - 23 * i)) << "the prompt fills the rest";
    EXPECT_EQ(plan->seqs[1].sample, i == 4) << "only the prompt's last chunk samples";
    auto out = pipe_->step(*plan);
    ASSERT_TRUE(out.ok());
    s.complete(0, out->tokens);
    EXPECT_EQ(decoding->tokens.size(), before + 1) << "a token at every step of the long prefill";
  }
  drain(s);
  expect_goldens();
}

TEST_F(batching_test, dynamic_waits_for_company_then_runs_the_batch_to_the_end) {
  opts_.policy.batching = service::batching_mode::dynamic;
  batch_scheduler s(opts_);
  add(s, 1);
  add(s, 2);
  const auto t0 = clock::now();
  EXPECT_FALSE(s.next_step(0, t0).has_value()) << "two of three: waits for a third or the delay";
  auto wake = s.next_wakeup();
  ASSERT_TRUE(wake.has_value());
  EXPECT_LE(*wake, t0 + 50ms);
  auto plan = s.next_step(0, t0 + 60ms);
  ASSERT_TRUE(plan.has_value()) << "the delay has passed";
  EXPECT_EQ(plan->seqs.size(), 2u);
  auto out = pipe_->step(*plan);
  ASSERT_TRUE(out.ok());
  s.complete(0, out->tokens);
  // A newcomer waits until the running batch has finished, even after the delay.
  auto late = add(s, 0);
  int steps = 0;
  while (!sinks_[0].first->done || !sinks_[1].first->done) {
    auto p = s.next_step(0, clock::now() + 1s);
    ASSERT_TRUE(p.has_value());
    for (const auto& q : p->seqs) EXPECT_NE(q.seq_id, 3) << "admitted into a running dynamic batch";
    auto o = pipe_->step(*p);
    ASSERT_TRUE(o.ok());
    s.complete(0, o->tokens);
    ++steps;
  }
  EXPECT_TRUE(late->tokens.empty());
  drain(s);
  expect_goldens();
}

TEST_F(batching_test, dynamic_starts_a_full_batch_at_once) {
  opts_.policy.batching = service::batching_mode::dynamic;
  batch_scheduler s(opts_);
  for (std::size_t p : {1, 2, 0, 3}) add(s, p);
  auto plan = s.next_step(0, clock::now());
  ASSERT_TRUE(plan.has_value()) << "three of three: no waiting";
  // max_batch_size sequences join at once; their prompts are prefilled over the next steps.
  EXPECT_EQ(s.counters().running, 3);
  EXPECT_EQ(s.counters().waiting, 1);
  auto out = pipe_->step(*plan);
  ASSERT_TRUE(out.ok());
  s.complete(0, out->tokens);
  drain(s);
  expect_goldens();
}

TEST_F(batching_test, fixed_waits_for_exactly_max_batch_size) {
  opts_.policy.batching = service::batching_mode::fixed;
  batch_scheduler s(opts_);
  add(s, 1);
  add(s, 2);
  EXPECT_FALSE(s.next_step(0, clock::now() + 1h).has_value()) << "static batches never start short";
  EXPECT_FALSE(s.next_wakeup().has_value()) << "nothing to wake up for";
  add(s, 0);
  auto plan = s.next_step(0);
  ASSERT_TRUE(plan.has_value());
  EXPECT_EQ(s.counters().running, 3);
  auto out = pipe_->step(*plan);
  ASSERT_TRUE(out.ok());
  s.complete(0, out->tokens);
  drain(s);
  expect_goldens();
}

TEST_F(batching_test, flush_starts_a_short_batch_when_arrivals_have_ended) {
  opts_.policy.batching = service::batching_mode::fixed;
  batch_scheduler s(opts_);
  add(s, 3);
  EXPECT_FALSE(s.next_step(0).has_value());
  s.flush();
  drain(s);
  expect_goldens();
}

TEST_F(batching_test, modes_give_the_same_tokens_with_microbatches) {
  for (auto mode : {service::batching_mode::continuous, service::batching_mode::dynamic, service::batching_mode::fixed}) {
    opts_.chunks = 3;
    opts_.max_step_tokens = 24;
    opts_.policy.batching = mode;
    opts_.policy.max_batch_delay_ms = 0;
    batch_scheduler s(opts_);
    sinks_.clear();
    for (int rep = 0; rep < 3; ++rep) {
      for (std::size_t p = 0; p < golden_.prompts.size(); ++p) add(s, p);
    }
    s.flush();  // 12 requests do not fill the last static batch of 3 per microbatch evenly
    drain_pipelined(s);
    expect_goldens();
  }
}

}  // namespace
}  // namespace conveyor::scheduler
