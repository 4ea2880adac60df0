// A bad step plan is an error value; the executor stays usable afterwards.
#include <gtest/gtest.h>

#include "conveyor/engine/local_pipeline.hpp"
#include "conveyor/kernels/cpu_backend.hpp"
#include "golden.hpp"

namespace conveyor::engine {
namespace {

class executor_errors : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = kernels::make_cpu_backend({});
    executor_options o;
    o.kv_blocks = 4;
    o.kv_block_size = 4;
    o.max_step_tokens = 8;
    o.max_seqs = 2;
    auto p = local_pipeline::create(*backend_, testing::fixture_dir("tiny-llama"), 2, o);
    ASSERT_TRUE(p.ok()) << p.err().message;
    pipe_ = std::move(p).value();
  }

  static step_plan one(std::vector<std::int32_t> tokens, std::vector<std::int32_t> blocks, int start = 0) {
    step_plan plan;
    sequence_step s;
    s.seq_id = 3;
    s.tokens = std::move(tokens);
    s.block_table = std::move(blocks);
    s.start_pos = start;
    plan.seqs.push_back(s);
    return plan;
  }

  std::string error_of(const step_plan& plan) {
    auto out = pipe_->step(plan);
    return out.ok() ? std::string() : out.err().message;
  }

  std::unique_ptr<kernels::backend> backend_;
  std::unique_ptr<local_pipeline> pipe_;
};

// Options that size the workspace, the KV pool or the recorded steps must be positive.
TEST_F(executor_errors, rejects_options_that_are_not_positive) {
  for (int which = 0; which < 5; ++which) {
    executor_options o;
    o.kv_blocks = 4;
    int* field[] = {&o.max_step_tokens, &o.max_seqs, &o.kv_blocks, &o.kv_block_size, &o.max_recorded_steps};
    *field[which] = 0;
    auto p = local_pipeline::create(*backend_, testing::fixture_dir("tiny-llama"), 1, o);
    ASSERT_FALSE(p.ok()) << "option " << which;
    EXPECT_NE(p.err().message.find("must be positive"), std::string::npos) << p.err().message;
  }
}

TEST_F(executor_errors, rejects_bad_plans_with_reasons) {
  EXPECT_NE(error_of(step_plan{}).find("at least one sequence"), std::string::npos);
  EXPECT_NE(error_of(one({1, 2}, {})).find("KV blocks"), std::string::npos);
  EXPECT_NE(error_of(one({5000}, {0})).find("vocabulary"), std::string::npos);
  EXPECT_NE(error_of(one({-1}, {0})).find("vocabulary"), std::string::npos);
  EXPECT_NE(error_of(one({1}, {9})).find("KV block 9"), std::string::npos);
  EXPECT_NE(error_of(one({1, 2, 3, 4, 5, 6, 7, 8, 9}, {0, 1, 2})).find("workspace"), std::string::npos);
  EXPECT_NE(error_of(one({1}, {0, 1, 2, 3}, 16)).find("context limit"), std::string::npos);
  EXPECT_NE(error_of(one({}, {0})).find("no new tokens"), std::string::npos);
  auto three = one({1}, {0});
  three.seqs.push_back(three.seqs[0]);
  three.seqs.push_back(three.seqs[0]);
  EXPECT_NE(error_of(three).find("sequences"), std::string::npos);
  // Speculative verification: sample_rows must fit the new tokens and go with sampling.
  auto rows = one({1, 2, 3}, {0});
  rows.seqs[0].sampling.step = 3;
  rows.seqs[0].sample_rows = 4;
  EXPECT_NE(error_of(rows).find("samples 4 rows of 3"), std::string::npos);
  rows.seqs[0].sample_rows = 0;
  EXPECT_NE(error_of(rows).find("samples 0 rows"), std::string::npos);
  rows.seqs[0].sample_rows = 2;
  rows.seqs[0].logits = logits_mode::all;
  EXPECT_NE(error_of(rows).find("sample_rows > 1"), std::string::npos);
  rows.seqs[0].logits = logits_mode::none;
  rows.seqs[0].sample = false;
  EXPECT_NE(error_of(rows).find("sample_rows > 1"), std::string::npos);
  // Still works after the errors.
  auto ok = pipe_->step(one({1, 2, 3}, {0}));
  ASSERT_TRUE(ok.ok()) << ok.err().message;
  EXPECT_GE(ok->tokens[0], 0);
}

TEST_F(executor_errors, later_stage_checks_activation_size) {
  auto& stage1 = pipe_->stages()[1]->rank0();
  std::vector<float> wrong(5, 0.0f);
  auto out = stage1.run(one({1}, {0}), wrong);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.err().message.find("activations"), std::string::npos);
}

TEST(local_pipeline_errors, bad_model_dir_and_stage_count) {
  auto backend = kernels::make_cpu_backend({});
  auto missing = local_pipeline::create(*backend, "/nonexistent/model", 1, {});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.err().message.find("/nonexistent/model"), std::string::npos);
  auto too_many = local_pipeline::create(*backend, testing::fixture_dir("tiny-llama"), 5, {});
  ASSERT_FALSE(too_many.ok());
  EXPECT_NE(too_many.err().message.find("stages"), std::string::npos);
}

}  // namespace
}  // namespace conveyor::engine
