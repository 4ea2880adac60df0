// Quantized weights on the GPU, whole model: every fixture with int8 and FP8 weights on the CUDA
// backend against the CPU backend with the same quantization (the same codes and scales: this
// isolates the CUDA kernels). Prefill rows (the dequantize + cuBLAS path, and the fused GEMV for
// prompts of ≤ 16 tokens) and teacher-forced decode steps through the KV cache (the fused GEMV, in
// CUDA graphs) are compared. Also prints the GPU's error against the HF goldens (unquantized).
// Skips with the reason where no GPU is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "conveyor/engine/local_pipeline.hpp"
#include "conveyor/kernels/cpu_backend.hpp"
#include "cuda_test_util.hpp"
#include "../engine/golden.hpp"

namespace conveyor {
namespace {

using kernels::dtype;
using kernels::weight_quant;

struct model_case {
  std::string fixture;
  dtype type;
  weight_quant kind;
};

engine::executor_options options_for(weight_quant k) {
  engine::executor_options o;
  o.kv_block_size = 16;
  o.kv_blocks = 64;
  o.max_step_tokens = 512;
  o.max_seqs = 8;
  o.quant.kind = k;
  return o;
}

/// Logits of positions T-1 .. T+22 of prompt + greedy tokens: one prefill of the prompt, then one
/// decode step per golden greedy token (teacher forcing), [24, vocab].
std::vector<float> decode_logits(engine::local_pipeline& pipe, const testing::golden_prompt& p) {
  std::vector<std::int32_t> feed = p.input_ids;
  std::vector<float> all;
  int cached = 0;
  for (std::size_t k = 0; k < p.greedy.size(); ++k) {
    EXPECT_TRUE(pipe.blocks().reserve(3, static_cast<int>(feed.size())).ok());
    engine::step_plan plan;
    engine::sequence_step s;
    s.seq_id = 3;
    s.tokens.assign(feed.begin() + cached, feed.end());
    s.start_pos = cached;
    s.block_table = pipe.blocks().table(3);
    s.logits = engine::logits_mode::last;
    plan.seqs.push_back(s);
    auto out = pipe.step(plan);
    EXPECT_TRUE(out.ok()) << (out.ok() ? "" : out.err().message);
    if (!out.ok()) break;
    all.insert(all.end(), out->logits.begin(), out->logits.end());
    cached = static_cast<int>(feed.size());
    feed.push_back(p.greedy[k]);
  }
  pipe.blocks().release(3);
  return all;
}

/// Logits of every prompt position in one prefill, [T, vocab].
std::vector<float> prompt_logits(engine::local_pipeline& pipe, const testing::golden_prompt& p) {
  auto logits = testing::sequence_logits(pipe, p.input_ids);
  EXPECT_TRUE(logits.ok()) << (logits.ok() ? "" : logits.err().message);
  return logits.ok() ? std::move(logits).value() : std::vector<float>{};
}

double top1(const std::vector<float>& a, const std::vector<float>& b, int vocab) {
  std::size_t agree = 0, rows = a.size() / vocab;
  for (std::size_t r = 0; r < rows; ++r) {
    const float* x = a.data() + r * vocab;
    const float* y = b.data() + r * vocab;
    agree += std::max_element(x, x + vocab) - x == std::max_element(y, y + vocab) - y;
  }
  return rows ? static_cast<double>(agree) / rows : 0.0;
}

class cuda_quant_model : public ::testing::TestWithParam<model_case> {};

TEST_P(cuda_quant_model, matches_the_cpu_twin) {
  const auto& c = GetParam();
  std::string why;
  auto gpu = testing::try_cuda_backend(c.type, why);
  if (!gpu) GTEST_SKIP() << "no CUDA device: " << why;
  if (c.kind == weight_quant::fp8 && !gpu->caps().fp8_weights) GTEST_SKIP() << "no FP8 on this GPU";
  const auto golden = testing::load_golden(c.fixture);
  auto cpu = kernels::make_cpu_backend({1});
  auto gp = engine::local_pipeline::create(*gpu, golden.dir, 1, options_for(c.kind));
  auto cp = engine::local_pipeline::create(*cpu, golden.dir, 1, options_for(c.kind));
  ASSERT_TRUE(gp.ok()) << gp.err().message;
  ASSERT_TRUE(cp.ok()) << cp.err().message;
  const int vocab = (*gp)->config().vocab_size;
  const std::string tag = "[quant-gpu] " + c.fixture + " " + std::string(kernels::weight_quant_name(c.kind)) + " " +
                          std::string(kernels::dtype_name(c.type));
  for (std::size_t i = 0; i < golden.prompts.size(); ++i) {
    const auto& p = golden.prompts[i];
    for (bool decode : {false, true}) {
      const auto got = decode ? decode_logits(**gp, p) : prompt_logits(**gp, p);
      const auto want = decode ? decode_logits(**cp, p) : prompt_logits(**cp, p);
      const std::vector<float>& hf = decode ? p.greedy_logits : p.logits;
      ASSERT_EQ(got.size(), want.size());
      ASSERT_EQ(got.size(), hf.size());
      const auto e = testing::compare(got, want);
      const auto e_hf = testing::compare(got, hf);
      const std::string what = (decode ? "decode " : "prompt ") + std::to_string(i);
      std::printf("%s %-9s vs cpu twin: rel %.3e max_abs %.3e top1 %.3f | vs HF: rel %.3e top1 %.3f\n", tag.c_str(),
                  what.c_str(), e.rel, e.max_abs, top1(got, want, vocab), e_hf.rel, top1(got, hf, vocab));
      EXPECT_EQ(e.non_finite, 0u) << what;
      // bf16: activations rounded at every op (cuda_model's tolerance vs HF); f32: summation order.
      if (c.type == dtype::bf16) {
        EXPECT_LE(e.rel, 2e-2) << what;
      } else {
        EXPECT_LE(e.max_abs, 1e-3) << what;
      }
    }
  }
}

std::vector<model_case> cases() {
  std::vector<model_case> out;
  for (const auto& f : testing::fixture_names()) {
    for (auto k : {weight_quant::int8, weight_quant::fp8}) {
      for (dtype t : {dtype::bf16, dtype::f32}) out.push_back({f, t, k});
    }
  }
  return out;
}

std::string name_of(const ::testing::TestParamInfo<model_case>& info) {
  return testing::test_name(info.param.fixture + "_" + std::string(kernels::weight_quant_name(info.param.kind)) + "_" +
                           std::string(kernels::dtype_name(info.param.type)));
}

INSTANTIATE_TEST_SUITE_P(fixtures, cuda_quant_model, ::testing::ValuesIn(cases()), name_of);

}  // namespace
}  // namespace conveyor
