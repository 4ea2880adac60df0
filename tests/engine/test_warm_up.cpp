// engine::warm_up: the throwaway steps a worker runs at load (a prefill, then decode steps of several
// sequence counts on the first KV blocks) leave nothing behind that a real request could see: after
// them, greedy generation gives HF's tokens on every fixture, on one stage and on two (the second
// stage takes zero activations). Counts the stage cannot take are errors that name them; counts
// the KV pool cannot hold are skipped and reported.
#include <gtest/gtest.h>

#include "conveyor/engine/local_pipeline.hpp"
#include "conveyor/engine/warm_up.hpp"
#include "conveyor/kernels/cpu_backend.hpp"
#include "golden.hpp"

namespace conveyor {
namespace {

class warm_up_test : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    golden_ = testing::load_golden(GetParam());
    backend_ = kernels::make_cpu_backend({});
  }
  std::unique_ptr<engine::local_pipeline> make(int stages, int kv_blocks = 64) {
    engine::executor_options o;
    o.kv_block_size = 16;
    o.kv_blocks = kv_blocks;
    o.max_step_tokens = 512;
    o.max_seqs = 16;
    auto p = engine::local_pipeline::create(*backend_, golden_.dir, stages, o);
    EXPECT_TRUE(p.ok()) << (p.ok() ? "" : p.err().message);
    return p.ok() ? std::move(p).value() : nullptr;
  }
  testing::golden_fixture golden_;
  std::unique_ptr<kernels::backend> backend_;
};

TEST_P(warm_up_test, generation_after_warm_up_matches_hf) {
  for (int stages : {1, 2}) {
    auto pipe = make(stages);
    ASSERT_TRUE(pipe);
    engine::warm_up_options o;
    o.prefill_tokens = 40;  // three blocks of sequence 0
    o.decode_batches = {1, 2, 3, 16};
    for (auto& stage : pipe->stages()) {
      auto r = engine::warm_up(*stage, o);
      ASSERT_TRUE(r.ok()) << r.err().message;
      EXPECT_EQ(r->steps, 5);
      EXPECT_TRUE(r->skipped.empty());
      EXPECT_NE(r->describe().find("5 steps"), std::string::npos) << r->describe();
    }
    std::vector<engine::generation_request> reqs;
    for (const auto& p : golden_.prompts) {
      engine::generation_request r;
      r.prompt = p.input_ids;
      r.max_new_tokens = static_cast<int>(p.greedy.size());
      r.stop_at_eos = false;
      reqs.push_back(r);
    }
    auto res = pipe->generate(reqs);
    ASSERT_TRUE(res.ok()) << res.err().message;
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ((*res)[i].tokens, golden_.prompts[i].greedy) << "prompt " << i << ", " << stages << " stages";
    }
  }
}

TEST_P(warm_up_test, counts_the_stage_cannot_take_are_errors_and_a_small_pool_skips) {
  auto pipe = make(1, 4);
  ASSERT_TRUE(pipe);
  engine::tp_stage& stage = *pipe->stages()[0];
  for (int bad : {0, -1, 17}) {
    engine::warm_up_options o;
    o.decode_batches = {1, bad};
    auto r = engine::warm_up(stage, o);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.err().message.find("warm-up decode batch " + std::to_string(bad)), std::string::npos)
        << r.err().message;
  }
  engine::warm_up_options neg;
  neg.prefill_tokens = -3;
  auto r = engine::warm_up(stage, neg);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.err().message.find("prefill tokens"), std::string::npos) << r.err().message;
  engine::warm_up_options small;  // 4 blocks: batch 8 and 16 do not fit, the prefill is capped at 64 tokens
  small.prefill_tokens = 500;
  small.decode_batches = {1, 8, 4, 16};
  auto s = engine::warm_up(stage, small);
  ASSERT_TRUE(s.ok()) << s.err().message;
  EXPECT_EQ(s->steps, 3);
  EXPECT_EQ(s->skipped, (std::vector<int>{8, 16}));
  EXPECT_NE(s->describe().find("skipped decode batches 8,16"), std::string::npos) << s->describe();
}

INSTANTIATE_TEST_SUITE_P(fixtures, warm_up_test, ::testing::ValuesIn(testing::fixture_names()),
                         [](const auto& info) { return testing::test_name(info.param); });

}  // namespace
}  // namespace conveyor
