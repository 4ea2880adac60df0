// Speculative decoding on the CUDA backend: the verification pass (k + 1 positions of a sequence on
// top of its KV) runs the prefill path, decode steps run recorded CUDA graphs; in float32 greedy
// output is the goldens' with any draft and stage split. In bf16 the two paths round differently,
// so a near-tie may flip: the agreement is printed, and a draft equal to the model must still be
// accepted almost always. Skips with the reason where no GPU is present.
#include <gtest/gtest.h>

#include <cctype>
#include <cstdio>
#include <string>

#include "../engine/golden.hpp"
#include "conveyor/engine/local_pipeline.hpp"
#include "conveyor/engine/speculative_decoder.hpp"
#include "cuda_test_util.hpp"

namespace conveyor {
namespace {

using kernels::dtype;

struct spec_case {
  std::string fixture;
  dtype type;
};

class cuda_speculative : public ::testing::TestWithParam<spec_case> {
 protected:
  void SetUp() override {
    std::string why;
    backend_ = testing::try_cuda_backend(GetParam().type, why);
    if (!backend_) GTEST_SKIP() << "no CUDA device: " << why;
    golden_ = testing::load_golden(GetParam().fixture);
  }
  std::unique_ptr<engine::local_pipeline> make(int stages, int keep_layers = 0) {
    engine::executor_options o;
    o.kv_block_size = 16;
    o.kv_blocks = 64;
    o.max_step_tokens = 512;
    o.max_seqs = 16;
    auto p = engine::local_pipeline::create(*backend_, golden_.dir, stages, o, keep_layers);
    EXPECT_TRUE(p.ok()) << (p.ok() ? "" : p.err().message);
    return p.ok() ? std::move(p).value() : nullptr;
  }
  std::vector<engine::generation_request> requests() const {
    std::vector<engine::generation_request> all;
    for (const auto& p : golden_.prompts) {
      engine::generation_request r;
      r.prompt = p.input_ids;
      r.max_new_tokens = static_cast<int>(p.greedy.size());
      r.stop_at_eos = false;
      all.push_back(r);
    }
    return all;
  }
  testing::golden_fixture golden_;
  std::unique_ptr<kernels::backend> backend_;
};

TEST_P(cuda_speculative, greedy_output_equals_plain_decoding) {
  const bool f32 = GetParam().type == dtype::f32;
  auto cfg = engine::load_model_config(golden_.dir);
  ASSERT_TRUE(cfg.ok());
  const auto reqs = requests();
  for (int stages : {1, 2}) {
    auto target = make(stages);
    ASSERT_TRUE(target);
    auto plain = target->generate(reqs);
    ASSERT_TRUE(plain.ok()) << plain.err().message;
    for (int keep : {1, cfg->num_layers}) {
      auto draft = make(1, keep);
      ASSERT_TRUE(draft);
      auto spec = engine::speculative_decoder::create(*target, *draft, {4});
      ASSERT_TRUE(spec.ok());
      auto res = (*spec)->generate(reqs);
      ASSERT_TRUE(res.ok()) << res.err().message;
      int same = 0, total = 0;
      for (std::size_t i = 0; i < reqs.size(); ++i) {
        const auto& a = (*res)[i].tokens;
        const auto& b = (*plain)[i].tokens;
        std::size_t n = 0;
        while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
        same += static_cast<int>(n);
        total += static_cast<int>(b.size());
        if (f32) {
          EXPECT_EQ(a, golden_.prompts[i].greedy) << "stages " << stages << " draft layers " << keep << " prompt " << i;
        }
      }
      const auto& st = (*spec)->stats();
      std::printf("[spec] %s %s stages %d draft layers %d: identical prefix %d/%d tokens, acceptance %.3f, "
                  "%.2f tokens per target step\n",
                  GetParam().fixture.c_str(), std::string(kernels::dtype_name(GetParam().type)).c_str(), stages, keep, same, total,
                  st.acceptance_rate(), st.tokens_per_target_step());
      if (keep == cfg->num_layers) EXPECT_GE(st.acceptance_rate(), f32 ? 0.999 : 0.9);
    }
  }
}

std::vector<spec_case> cases() {
  std::vector<spec_case> v;
  for (const auto& f : testing::fixture_names()) {
    v.push_back({f, dtype::f32});
    v.push_back({f, dtype::bf16});
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(fixtures, cuda_speculative, ::testing::ValuesIn(cases()),
                         [](const auto& info) {
                           std::string n = info.param.fixture + "_" + std::string(kernels::dtype_name(info.param.type));
                           for (char& c : n) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return n;
                         });

}  // namespace
}  // namespace conveyor
