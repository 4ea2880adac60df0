// Tensor parallelism (CPU collective, ranks as threads) reproduces the HF goldens for every degree
// the fixture's heads allow, alone and combined with pipeline stages.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "conveyor/engine/local_pipeline.hpp"
#include "conveyor/kernels/cpu_backend.hpp"
#include "conveyor/transport/cpu_collective.hpp"
#include "golden.hpp"

namespace conveyor::engine {
namespace {

struct tp_case {
  std::string fixture;
  int tp;
  int stages;
};

std::string name_of(const ::testing::TestParamInfo<tp_case>& info) {
  return testing::test_name(info.param.fixture + "_tp" + std::to_string(info.param.tp) + "_pp" +
                           std::to_string(info.param.stages));
}

std::vector<tp_case> cases() {
  std::vector<tp_case> out;
  for (const auto& f : testing::fixture_names()) {
    auto cfg = load_model_config(testing::fixture_dir(f));
    if (!cfg) continue;
    for (int tp : {2, 4}) {
      if (!make_tp_layout(*cfg, 0, tp).ok()) continue;
      out.push_back({f, tp, 1});
      out.push_back({f, tp, 2});
    }
  }
  return out;
}

class tensor_parallel : public ::testing::TestWithParam<tp_case> {};

TEST_P(tensor_parallel, logits_and_greedy_tokens_match_goldens) {
  const auto& c = GetParam();
  const auto golden = testing::load_golden(c.fixture);
  std::vector<std::unique_ptr<kernels::backend>> owned;
  std::vector<kernels::backend*> backends;
  for (int r = 0; r < c.tp; ++r) {
    owned.push_back(kernels::make_cpu_backend({1}));
    backends.push_back(owned.back().get());
  }
  executor_options o;
  o.kv_blocks = 64;
  o.max_step_tokens = 512;
  o.max_seqs = 8;
  auto make_group = [](int size) -> result<std::vector<std::unique_ptr<kernels::collective>>> {
    return transport::cpu_group(size, std::chrono::seconds(30)).all_ranks();
  };
  auto pipe = local_pipeline::create(backends, golden.dir, c.stages, o, make_group);
  ASSERT_TRUE(pipe.ok()) << pipe.err().message;
  ASSERT_EQ((*pipe)->tp(), c.tp);
  const int vocab = (*pipe)->config().vocab_size;
  for (std::size_t i = 0; i < golden.prompts.size(); ++i) {
    const auto& p = golden.prompts[i];
    ASSERT_TRUE((*pipe)->blocks().reserve(1, static_cast<int>(p.input_ids.size())).ok());
    step_plan plan;
    sequence_step s;
    s.seq_id = 1;
    s.tokens = p.input_ids;
    s.block_table = (*pipe)->blocks().table(1);
    s.logits = logits_mode::all;
    s.sample = false;
    plan.seqs.push_back(s);
    auto out = (*pipe)->step(plan);
    (*pipe)->blocks().release(1);
    ASSERT_TRUE(out.ok()) << out.err().message;
    ASSERT_EQ(out->logits.size(), p.logits.size());
    float worst = 0.0f;
    for (std::size_t k = 0; k < p.logits.size(); ++k) worst = std::max(worst, std::fabs(out->logits[k] - p.logits[k]));
    EXPECT_LE(worst, 1e-4f) << "prompt " << i;
    generation_request r;
    r.prompt = p.input_ids;
    r.max_new_tokens = static_cast<int>(p.greedy.size());
    r.stop_at_eos = false;
    auto gen = (*pipe)->generate({r});
    ASSERT_TRUE(gen.ok()) << gen.err().message;
    EXPECT_EQ((*gen)[0].tokens, p.greedy) << "prompt " << i;
    (void)vocab;
  }
}

INSTANTIATE_TEST_SUITE_P(fixtures, tensor_parallel, ::testing::ValuesIn(cases()), name_of);

TEST(tensor_parallel_layout, rejects_degrees_the_heads_do_not_allow) {
  auto cfg = load_model_config(testing::fixture_dir("tiny-qwen2"));  // 8 heads, 2 KV heads
  ASSERT_TRUE(cfg.ok());
  auto bad = make_tp_layout(*cfg, 0, 3);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.err().message.find("allowed: 1, 2, 4, 8"), std::string::npos) << bad.err().message;
  auto rep = make_tp_layout(*cfg, 3, 4);  // 4 ranks, 2 KV heads: each pair of ranks shares one
  ASSERT_TRUE(rep.ok());
  EXPECT_EQ(rep->kv_heads, 1);
  EXPECT_EQ(rep->kv_head_begin, 1);
  EXPECT_EQ(rep->head_begin, 6);
}

}  // namespace
}  // namespace conveyor::engine
