// The engine against HF transformers' outputs (tests/fixtures/*/golden.safetensors).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "conveyor/engine/local_pipeline.hpp"
#include "conveyor/kernels/cpu_backend.hpp"
#include "golden.hpp"

namespace conveyor {
namespace {

using engine::local_pipeline;

constexpr float logit_tol = 1e-4f;

using testing::max_abs_diff;

class golden_test : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    golden_ = testing::load_golden(GetParam());
    backend_ = kernels::make_cpu_backend({});
  }

  std::unique_ptr<local_pipeline> make(int stages, int max_step_tokens = 512) {
    engine::executor_options o;
    o.kv_block_size = 16;
    o.kv_blocks = 64;
    o.max_step_tokens = max_step_tokens;
    o.max_seqs = 16;
    auto p = local_pipeline::create(*backend_, golden_.dir, stages, o);
    EXPECT_TRUE(p.ok()) << (p.ok() ? "" : p.err().message);
    return p.ok() ? std::move(p).value() : nullptr;
  }

  engine::generation_request greedy_request(const testing::golden_prompt& p) const {
    engine::generation_request r;
    r.prompt = p.input_ids;
    r.max_new_tokens = static_cast<int>(p.greedy.size());
    r.stop_at_eos = false;
    return r;
  }

  testing::golden_fixture golden_;
  std::unique_ptr<kernels::backend> backend_;
};

TEST_P(golden_test, prompt_logits_and_hidden_states_match) {
  auto pipe = make(1);
  ASSERT_TRUE(pipe);
  const auto& cfg = pipe->config();
  for (std::size_t i = 0; i < golden_.prompts.size(); ++i) {
    const auto& p = golden_.prompts[i];
    const int t = static_cast<int>(p.input_ids.size());
    std::vector<float> hidden(static_cast<std::size_t>(cfg.num_layers + 1) * t * cfg.hidden_size, NAN);
    pipe->stages()[0]->rank0().set_observer([&](int index, std::span<const float> h) {
      ASSERT_EQ(h.size(), static_cast<std::size_t>(t) * cfg.hidden_size);
      std::copy(h.begin(), h.end(), hidden.begin() + static_cast<std::size_t>(index) * h.size());
    });
    auto logits = testing::sequence_logits(*pipe, p.input_ids);
    ASSERT_TRUE(logits.ok()) << logits.err().message;
    ASSERT_EQ(logits->size(), p.logits.size());
    EXPECT_LE(max_abs_diff(logits->data(), p.logits.data(), p.logits.size()), logit_tol) << "prompt " << i;
    for (int layer = 0; layer <= cfg.num_layers; ++layer) {
      const std::size_t n = static_cast<std::size_t>(t) * cfg.hidden_size;
      EXPECT_LE(max_abs_diff(hidden.data() + layer * n, p.hidden_states.data() + layer * n, n), 1e-4f)
          << "prompt " << i << " hidden state " << layer;
    }
    pipe->stages()[0]->rank0().set_observer(nullptr);
  }
}

TEST_P(golden_test, greedy_tokens_match) {
  auto pipe = make(1);
  ASSERT_TRUE(pipe);
  for (const auto& p : golden_.prompts) {
    auto res = pipe->generate({greedy_request(p)});
    ASSERT_TRUE(res.ok()) << res.err().message;
    EXPECT_EQ((*res)[0].tokens, p.greedy);
  }
}

// Teacher-forced decoding through the KV cache: every step's logits equal HF's greedy_logits.
TEST_P(golden_test, decode_steps_through_kv_cache_match) {
  auto pipe = make(1);
  ASSERT_TRUE(pipe);
  const int vocab = pipe->config().vocab_size;
  for (std::size_t i = 0; i < golden_.prompts.size(); ++i) {
    const auto& p = golden_.prompts[i];
    std::vector<std::int32_t> feed = p.input_ids;
    int cached = 0;
    for (std::size_t k = 0; k < p.greedy.size(); ++k) {
      ASSERT_TRUE(pipe->blocks().reserve(7, static_cast<int>(feed.size())).ok());
      engine::step_plan plan;
      engine::sequence_step s;
      s.seq_id = 7;
      s.tokens.assign(feed.begin() + cached, feed.end());
      s.start_pos = cached;
      s.block_table = pipe->blocks().table(7);
      s.logits = engine::logits_mode::last;
      plan.seqs.push_back(s);
      auto out = pipe->step(plan);
      ASSERT_TRUE(out.ok()) << out.err().message;
      EXPECT_LE(max_abs_diff(out->logits.data(), p.greedy_logits.data() + k * vocab, vocab), logit_tol)
          << "prompt " << i << " decode step " << k;
      EXPECT_EQ(out->tokens[0], p.greedy[k]) << "prompt " << i << " decode step " << k;
      cached = static_cast<int>(feed.size());
      feed.push_back(p.greedy[k]);
    }
    pipe->blocks().release(7);
  }
}

TEST_P(golden_test, every_stage_split_gives_identical_tokens) {
  auto cfg = engine::load_model_config(golden_.dir);
  ASSERT_TRUE(cfg.ok());
  for (int stages = 1; stages <= cfg->num_layers; ++stages) {
    auto pipe = make(stages);
    ASSERT_TRUE(pipe);
    ASSERT_EQ(static_cast<int>(pipe->stages().size()), stages);
    for (const auto& p : golden_.prompts) {
      auto res = pipe->generate({greedy_request(p)});
      ASSERT_TRUE(res.ok()) << res.err().message;
      EXPECT_EQ((*res)[0].tokens, p.greedy) << stages << " stages";
    }
  }
}

// All prompts decoded together (mixed prefill/decode, chunked prefill with a small step budget)
// give each prompt's solo result.
TEST_P(golden_test, batch_of_all_prompts_gives_solo_results) {
  for (int budget : {512, 16}) {
    auto pipe = make(2, budget);  // every fixture has at least two layers
    ASSERT_TRUE(pipe);
    std::vector<engine::generation_request> reqs;
    for (const auto& p : golden_.prompts) reqs.push_back(greedy_request(p));
    auto res = pipe->generate(reqs);
    ASSERT_TRUE(res.ok()) << res.err().message;
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ((*res)[i].tokens, golden_.prompts[i].greedy) << "prompt " << i << " step budget " << budget;
    }
    EXPECT_EQ(pipe->blocks().free_blocks(), pipe->blocks().num_blocks()) << "KV blocks leaked";
  }
}

INSTANTIATE_TEST_SUITE_P(fixtures, golden_test, ::testing::ValuesIn(testing::fixture_names()),
                         [](const auto& info) { return testing::test_name(info.param); });

}  // namespace
}  // namespace conveyor
