// The demo model (models/demo, made by tools/train_demo_model.py) against what HF transformers
// computed from that same directory on the GPU machine right after training (hf_golden.*, float32,
// eager attention, CPU): the tokenizer's ids for each prompt text, the logits at the last prompt
// position, and the greedy continuation with its text, in one stage and split in two.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "conveyor/engine/local_pipeline.hpp"
#include "conveyor/engine/safetensors.hpp"
#include "conveyor/kernels/cpu_backend.hpp"
#include "conveyor/tokenizer/tokenizer.hpp"
#include "../engine/golden.hpp"

namespace conveyor {
namespace {

// HF reads the bf16 weights into float32 as we do; what is left is the order of float32 sums
// (OpenBLAS vs PyTorch). Measured: max |diff| ~2e-5 on logits of magnitude ~20.
constexpr float logit_tol = 2e-4f;

struct golden_prompt {
  std::string text;
  std::vector<std::int32_t> input_ids;
  std::vector<float> last_logits;  ///< [vocab], at the last prompt position
  std::vector<std::int32_t> greedy;
  std::string greedy_text;  ///< HF's tokenizer.decode(greedy)
};


std::vector<golden_prompt> load_golden() {
  std::ifstream in(CONVEYOR_DEMO_GOLDEN ".json");
  const auto doc = nlohmann::json::parse(in);
  auto file = engine::safetensors_file::open(CONVEYOR_DEMO_GOLDEN ".safetensors");
  if (!file) throw std::runtime_error(file.err().message);
  std::vector<golden_prompt> out;
  for (std::size_t i = 0; i < doc.at("prompts").size(); ++i) {
    const auto& p = doc["prompts"][i];
    const std::string key = "p" + std::to_string(i) + ".";
    golden_prompt g;
    g.text = p.at("text").get<std::string>();
    g.greedy_text = p.at("greedy_text").get<std::string>();
    g.input_ids = testing::read_tensor<std::int32_t>(*file, key + "input_ids");
    g.last_logits = testing::read_tensor<float>(*file, key + "last_logits");
    g.greedy = testing::read_tensor<std::int32_t>(*file, key + "greedy");
    out.push_back(std::move(g));
  }
  return out;
}

class demo_model : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    golden_ = load_golden();
    ASSERT_FALSE(golden_.empty());
    backend_ = kernels::make_cpu_backend({});
    engine::executor_options o;
    o.kv_block_size = 16;
    o.kv_blocks = 64;
    o.max_step_tokens = 256;
    o.max_seqs = 8;
    auto p = engine::local_pipeline::create(*backend_, CONVEYOR_DEMO_MODEL, GetParam(), o);
    ASSERT_TRUE(p.ok()) << p.err().message;
    pipe_ = std::move(p).value();
    auto t = tokenizer::load_tokenizer(CONVEYOR_DEMO_MODEL);
    ASSERT_TRUE(t.ok()) << t.err().message;
    tok_ = std::move(t).value();
  }

  std::vector<golden_prompt> golden_;
  std::unique_ptr<kernels::backend> backend_;
  std::unique_ptr<engine::local_pipeline> pipe_;
  std::unique_ptr<tokenizer::tokenizer> tok_;
};

TEST_P(demo_model, tokenizer_gives_hf_ids_for_the_prompt_texts) {
  for (const auto& g : golden_) {
    auto ids = tok_->encode(g.text);
    ASSERT_TRUE(ids.ok()) << ids.err().message;
    EXPECT_EQ(*ids, g.input_ids) << g.text;
    EXPECT_EQ(tok_->decode(g.greedy), g.greedy_text) << g.text;
  }
}

TEST_P(demo_model, last_prompt_logits_match_hf) {
  const int vocab = pipe_->config().vocab_size;
  for (const auto& g : golden_) {
    const int t = static_cast<int>(g.input_ids.size());
    auto logits = testing::sequence_logits(*pipe_, g.input_ids);
    ASSERT_TRUE(logits.ok()) << logits.err().message;
    ASSERT_EQ(logits->size(), static_cast<std::size_t>(t) * vocab);
    ASSERT_EQ(g.last_logits.size(), static_cast<std::size_t>(vocab));
    const float* last = logits->data() + static_cast<std::size_t>(t - 1) * vocab;
    float scale = 0.0f;
    for (float x : g.last_logits) scale = std::max(scale, std::fabs(x));
    EXPECT_LE(testing::max_abs_diff(last, g.last_logits.data(), vocab), logit_tol) << g.text << " (largest |logit| " << scale << ")";
  }
}

TEST_P(demo_model, greedy_text_is_hf_text) {
  for (const auto& g : golden_) {
    engine::generation_request r;
    r.prompt = g.input_ids;
    r.max_new_tokens = static_cast<int>(g.greedy.size());
    r.stop_at_eos = false;
    auto res = pipe_->generate({r});
    ASSERT_TRUE(res.ok()) << res.err().message;
    EXPECT_EQ((*res)[0].tokens, g.greedy) << g.text;
    EXPECT_EQ(tok_->decode((*res)[0].tokens), g.greedy_text) << g.text;
  }
}

INSTANTIATE_TEST_SUITE_P(stages, demo_model, ::testing::Values(1, 2),
                         [](const auto& info) { return std::to_string(info.param) + "_stages"; });

}  // namespace
}  // namespace conveyor
