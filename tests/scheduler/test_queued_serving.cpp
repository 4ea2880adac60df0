// Queued steps in serving (batch_scheduler::next_step_ahead): the step after the one in flight is
// planned before its tokens are known and chained on the stage (stage_executor::begin with chain), as
// the coordinator does for a one-stage cluster. Results must equal HF's goldens and the plain loop's;
// a stop token, a cancel or an arrival must not lose or leak anything.
#include <gtest/gtest.h>

#include <deque>

#include "conveyor/engine/speculative_sampling.hpp"
#include "scheduler_fixture.hpp"

namespace conveyor::scheduler {
namespace {

using testing::collecting_sink;
using testing::scheduler_test;

class queued_serving_test : public scheduler_test {
 protected:
  void SetUp() override {
    scheduler_test::SetUp();
    one_ = pipeline(1);  // one stage: steps can queue
    ASSERT_NE(one_, nullptr);
    opts_.chunks = 1;
  }

  /// One turn of the coordinator's loop for a one-stage cluster: plan (and begin) a step when none
  /// is in flight, queue the chained one behind it where the scheduler allows, then end the oldest
  /// queued step and complete it. `before_end` runs between the two (cancels, arrivals).
  bool turn(batch_scheduler& s, const std::function<void()>& before_end = {}) {
    if (!s.in_flight(0)) {
      auto plan = s.next_step(0);
      if (!plan) return false;
      EXPECT_TRUE(one_->begin_step(*plan, false).ok());
      held_.push_back(std::move(*plan));
    }
    if (held_.size() == 1) {
      if (auto ahead = s.next_step_ahead(0)) {
        auto st = one_->begin_step(*ahead, true);
        EXPECT_TRUE(st.ok()) << st.err().message;
        held_.push_back(std::move(*ahead));
        ++chained_;
      }
    }
    if (before_end) before_end();
    auto out = one_->end_step();
    EXPECT_TRUE(out.ok()) << out.err().message;
    if (!out.ok()) return false;
    s.complete(0, engine::flat_sampled_tokens(held_.front(), *out));
    held_.pop_front();
    return true;
  }

  void drain_queued(batch_scheduler& s) {
    for (int guard = 0; s.has_work() && guard < 10000; ++guard) {
      if (!turn(s)) break;
    }
    EXPECT_FALSE(s.has_work()) << "the scheduler did not drain";
    EXPECT_TRUE(held_.empty());
  }

  std::unique_ptr<engine::local_pipeline> one_;
  std::deque<engine::step_plan> held_;
  int chained_ = 0;
};

TEST_F(queued_serving_test, chained_steps_reproduce_goldens) {
  batch_scheduler s(opts_);
  std::vector<std::shared_ptr<collecting_sink>> sinks;
  for (std::size_t p = 0; p < golden_.prompts.size(); ++p) {
    sinks.push_back(std::make_shared<collecting_sink>());
    ASSERT_TRUE(s.add(greedy(p), sinks.back()).ok());
  }
  drain_queued(s);
  for (std::size_t i = 0; i < sinks.size(); ++i) {
    ASSERT_TRUE(sinks[i]->ok());
    EXPECT_EQ(sinks[i]->tokens, golden_.prompts[i].greedy) << "request " << i;
    EXPECT_EQ((*sinks[i]->done)->finish_reason, "length");
  }
  // 24 tokens each: after the prefill steps nearly every decode step is chained.
  EXPECT_GE(chained_, 15);
  EXPECT_EQ(s.blocks().free_blocks(), 64) << "blocks leaked";
}

TEST_F(queued_serving_test, a_stop_token_drops_the_queued_token) {
  batch_scheduler s(opts_);
  auto sink = std::make_shared<collecting_sink>();
  auto r = greedy(1);
  r.stop_ids = {golden_.prompts[1].greedy[5]};
  ASSERT_TRUE(s.add(r, sink).ok());
  drain_queued(s);
  ASSERT_TRUE(sink->ok());
  EXPECT_EQ((*sink->done)->finish_reason, "stop");
  EXPECT_EQ((*sink->done)->completion_tokens, 6);
  EXPECT_EQ(sink->tokens, std::vector<std::int32_t>(golden_.prompts[1].greedy.begin(), golden_.prompts[1].greedy.begin() + 6));
  EXPECT_GE(chained_, 5);  // the stop came while a chained step was queued behind it
  EXPECT_EQ(s.blocks().free_blocks(), 64);
}

TEST_F(queued_serving_test, nothing_is_chained_past_the_length_limit) {
  batch_scheduler s(opts_);
  auto sink = std::make_shared<collecting_sink>();
  auto r = greedy(2);
  r.max_new_tokens = 3;
  ASSERT_TRUE(s.add(r, sink).ok());
  drain_queued(s);
  ASSERT_TRUE(sink->ok());
  EXPECT_EQ(sink->tokens, std::vector<std::int32_t>(golden_.prompts[2].greedy.begin(), golden_.prompts[2].greedy.begin() + 3));
  // Steps: prefill (draws 1), chained (2), chained (3): the third draw ends it, so nothing after.
  EXPECT_EQ(chained_, 2);
  EXPECT_EQ(s.blocks().free_blocks(), 64);
}

TEST_F(queued_serving_test, cancel_and_arrival_while_a_step_is_queued) {
  batch_scheduler s(opts_);
  auto a = std::make_shared<collecting_sink>();
  auto b = std::make_shared<collecting_sink>();
  auto c = std::make_shared<collecting_sink>();
  auto id_a = s.add(greedy(3), a);
  ASSERT_TRUE(id_a.ok());
  ASSERT_TRUE(s.add(greedy(1), b).ok());
  // Until a chained step is outstanding after a turn (the prompts' prefill steps come first).
  for (int i = 0; i < 40 && held_.size() != 1; ++i) ASSERT_TRUE(turn(s));
  ASSERT_EQ(held_.size(), 1u);
  // Cancel a while two of its steps are in flight: it is retired once the second one completes.
  ASSERT_TRUE(turn(s, [&] {
    EXPECT_TRUE(s.ahead(0));
    s.cancel(*id_a);
  }));
  EXPECT_FALSE(a->done.has_value()) << "retired while a step still writes its KV";
  // An arrival: the chain breaks for one plain step that admits it, then resumes.
  ASSERT_TRUE(s.add(greedy(0), c).ok());
  const int before = chained_;
  drain_queued(s);
  EXPECT_GT(chained_, before);
  ASSERT_TRUE(a->ok());
  EXPECT_EQ((*a->done)->finish_reason, "cancelled");
  ASSERT_TRUE(b->ok());
  EXPECT_EQ(b->tokens, golden_.prompts[1].greedy);
  ASSERT_TRUE(c->ok());
  EXPECT_EQ(c->tokens, golden_.prompts[0].greedy);
  EXPECT_EQ(s.blocks().free_blocks(), 64);
  EXPECT_EQ(s.counters().cancelled, 1);
}

TEST_F(queued_serving_test, a_prompt_waiting_for_blocks_does_not_stop_the_chain) {
  opts_.kv_blocks = 3;  // 48 tokens: the 40-token prompt cannot enter while the first request holds a block
  auto longer = greedy(2);
  longer.prompt.resize(40, 5);
  longer.max_new_tokens = 8;
  // The plain loop's tokens for the long prompt (no golden has it).
  std::vector<std::int32_t> expected;
  {
    batch_scheduler plain(opts_);
    auto sink = std::make_shared<collecting_sink>();
    ASSERT_TRUE(plain.add(longer, sink).ok());
    drain(plain);
    expected = sink->tokens;
    ASSERT_EQ(expected.size(), 8u);
  }
  batch_scheduler s(opts_);
  auto a = std::make_shared<collecting_sink>();
  auto b = std::make_shared<collecting_sink>();
  ASSERT_TRUE(s.add(greedy(1), a).ok());
  ASSERT_TRUE(s.add(longer, b).ok());
  drain_queued(s);
  EXPECT_EQ(a->tokens, golden_.prompts[1].greedy);
  EXPECT_EQ(b->tokens, expected);
  // The first request's 24 draws: all but the prefill's and the last one's next step are chained
  // although the second waits the whole time; then the second's decode steps chain too.
  EXPECT_GE(chained_, 22 + 5);
  EXPECT_EQ(s.blocks().free_blocks(), 3);
}

TEST_F(queued_serving_test, refuses_what_it_cannot_chain) {
  batch_scheduler s(opts_);
  EXPECT_FALSE(s.next_step_ahead(0).has_value());  // nothing in flight
  auto sink = std::make_shared<collecting_sink>();
  auto r = greedy(3);  // a prompt longer than one step's 24 tokens? then its first step does not draw
  r.prompt.resize(40, 5);
  ASSERT_TRUE(s.add(r, sink).ok());
  auto first = s.next_step(0);
  ASSERT_TRUE(first.has_value());
  EXPECT_FALSE(s.next_step_ahead(0).has_value()) << "a prefill chunk that does not draw cannot be chained";
  auto out = one_->step(*first);
  ASSERT_TRUE(out.ok());
  s.complete(0, out->tokens);
  auto second = s.next_step(0);  // the rest of the prompt: it draws
  ASSERT_TRUE(second.has_value());
  ASSERT_TRUE(one_->begin_step(*second, false).ok());
  auto ahead = s.next_step_ahead(0);
  ASSERT_TRUE(ahead.has_value());
  EXPECT_EQ(ahead->seqs.size(), 1u);
  EXPECT_EQ(ahead->seqs[0].start_pos, 40);
  EXPECT_FALSE(s.next_step_ahead(0).has_value()) << "one queued step at a time";
  ASSERT_TRUE(one_->begin_step(*ahead, true).ok());
  for (int i = 0; i < 2; ++i) {
    auto o = one_->end_step();
    ASSERT_TRUE(o.ok());
    s.complete(0, o->tokens);
  }
  EXPECT_EQ(sink->tokens.size(), 2u);
  s.cancel(1);
  EXPECT_EQ(s.blocks().free_blocks(), 64);
}

}  // namespace
}  // namespace conveyor::scheduler
