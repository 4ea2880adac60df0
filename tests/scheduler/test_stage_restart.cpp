// reprefill_all, the scheduler's part of stage-failure recovery: steps in flight are forgotten, every
// running sequence re-prefills its history (prompt + generated) into stages that lost all KV, and the
// tokens equal a run without the fault.
#include <gtest/gtest.h>

#include "scheduler_fixture.hpp"

namespace conveyor::scheduler {
namespace {

using testing::collecting_sink;
using testing::scheduler_test;

class stage_restart_test : public scheduler_test {
 protected:
  /// New stages with an empty KV cache, as after a restart (stricter than the real case, where only
  /// one stage is new: here no stale KV anywhere can hide a missing re-prefill).
  void replace_stages() { make_pipeline(); }
};

TEST_F(stage_restart_test, running_sequences_reprefill_and_keep_their_greedy_tokens) {
  for (bool caching : {false, true}) {
    SCOPED_TRACE(caching ? "prefix caching" : "no caching");
    opts_.policy.prefix_caching = caching;
    batch_scheduler s(opts_);
    std::vector<std::shared_ptr<collecting_sink>> sinks;
    for (int rep = 0; rep < 2; ++rep) {
      for (std::size_t p = 0; p < golden_.prompts.size(); ++p) {
        sinks.push_back(std::make_shared<collecting_sink>());
        ASSERT_TRUE(s.add(greedy(p), sinks.back()).ok());
      }
    }
    // Run until some sequences have generated tokens and others are mid-prefill.
    for (int round = 0; round < 6; ++round) {
      for (int m = 0; m < s.chunks(); ++m) step(s, m);
    }
    std::size_t generated = 0;
    for (auto& sink : sinks) generated += sink->tokens.size();
    ASSERT_GT(generated, 0u);
    // Every microbatch has a step in flight when a stage dies: their results never arrive.
    int planned = 0;
    for (int m = 0; m < s.chunks(); ++m) planned += s.next_step(m).has_value();
    ASSERT_GT(planned, 0);
    s.reprefill_all();
    for (int m = 0; m < s.chunks(); ++m) EXPECT_FALSE(s.in_flight(m));
    EXPECT_EQ(s.blocks().free_blocks(), opts_.kv_blocks) << "running sequences kept KV blocks";
    EXPECT_EQ(s.blocks().cached_blocks(), 0) << "the prefix cache names KV that is gone";
    replace_stages();
    drain(s);
    for (std::size_t i = 0; i < sinks.size(); ++i) {
      ASSERT_TRUE(sinks[i]->ok()) << "request " << i;
      EXPECT_EQ(sinks[i]->tokens, golden_.prompts[i % golden_.prompts.size()].greedy) << "request " << i;
    }
    EXPECT_EQ(s.blocks().free_blocks(), opts_.kv_blocks) << "blocks leaked";
  }
}

TEST_F(stage_restart_test, cancelled_sequence_in_a_lost_step_is_retired) {
  batch_scheduler s(opts_);
  auto sink = std::make_shared<collecting_sink>();
  auto id = s.add(greedy(0), sink);
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(s.next_step(0).has_value());
  s.cancel(*id);  // part of the step in flight: retired when the step ends, which it never will
  EXPECT_FALSE(sink->done.has_value());
  s.reprefill_all();
  ASSERT_TRUE(sink->ok());
  EXPECT_EQ((*sink->done)->finish_reason, "cancelled");
  EXPECT_FALSE(s.has_work());
  EXPECT_EQ(s.blocks().free_blocks(), opts_.kv_blocks);
}

}  // namespace
}  // namespace conveyor::scheduler
