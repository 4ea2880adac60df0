// Parity of the CUDA quantized linear (fused GEMV for n ≤ 16 bf16 tokens, dequantize + cuBLAS
// otherwise) with its CPU twin on the very same codes and scales. Skips where no GPU is present.
#include <gtest/gtest.h>

#include <cmath>

#include "conveyor/kernels/cpu_backend.hpp"
#include "conveyor/kernels/quant.hpp"
#include "cuda_test_util.hpp"
#include "../../kernels/cpu/cpu_ops.hpp"

namespace conveyor {
namespace {

using kernels::dtype;
using kernels::weight_quant;
using testing::dev_acts;
using testing::dev_bytes;

struct quant_case {
  dtype act;
  weight_quant kind;
};

class cuda_quant : public ::testing::TestWithParam<quant_case> {
 protected:
  void SetUp() override {
    std::string why;
    b_ = testing::try_cuda_backend(GetParam().act, why);
    if (!b_) GTEST_SKIP() << "no CUDA device: " << why;
    if (GetParam().kind == weight_quant::fp8 && !b_->caps().fp8_weights) GTEST_SKIP() << "no FP8 on this GPU";
    rng_.seed(testing::test_seed() ^ static_cast<std::uint64_t>(GetParam().kind) * 131 ^
              static_cast<std::uint64_t>(GetParam().act));
  }
  dtype t() const { return GetParam().act; }
  weight_quant kind() const { return GetParam().kind; }
  std::string tag(int n, int rows, int cols) const {
    return std::string("quant_linear ") + std::string(kernels::weight_quant_name(kind())) + " " +
           std::string(kernels::dtype_name(t())) + " n" + std::to_string(n) + " " + std::to_string(rows) + "x" +
           std::to_string(cols);
  }

  /// Runs one linear on both backends and expects them close; `got_out` receives the GPU's output.
  void run(int n, int rows, int cols, bool with_bias, const std::vector<float>* w_in = nullptr,
           const std::vector<float>* x_in = nullptr, std::vector<float>* got_out = nullptr) {
    std::vector<float> w = w_in ? *w_in : testing::random_values(rng_, static_cast<std::size_t>(rows) * cols, dtype::f32, 0.05f);
    std::vector<float> x = x_in ? *x_in : testing::random_values(rng_, static_cast<std::size_t>(n) * cols, t());
    for (auto& v : x) v = testing::representable(t(), v);
    const auto bias = testing::random_values(rng_, rows, dtype::f32, 0.1f);
    std::vector<std::uint8_t> q(w.size());
    std::vector<float> s(rows);
    kernels::quantize_rows(w.data(), rows, cols, kind(), nullptr, q.data(), s.data());
    const dtype qt = kernels::weight_quant_dtype(kind());

    std::vector<float> want(static_cast<std::size_t>(n) * rows);
    std::vector<float> scratch(1u << 16);
    kernels::cpu::linear_quant(x.data(), n, q.data(), qt, s.data(), rows, cols, with_bias ? bias.data() : nullptr,
                               want.data(), scratch.data(), scratch.size());

    dev_bytes dq(*b_, q), ds(*b_, s), db(*b_, bias);
    dev_acts dx(*b_, x), dout(*b_, want.size());
    dout.poison();
    kernels::weight qw{dq.as<void>(), qt, rows, cols};
    qw.scales = ds.as<float>();
    kernels::weight bw{};
    if (with_bias) bw = kernels::weight{db.as<void>(), dtype::f32, 1, rows};
    b_->linear(dx.get_ptr(), n, qw, bw, dout.get_ptr());
    const auto got = dout.get();
    if (got_out != nullptr) *got_out = got;
    EXPECT_CLOSE(got, want, t(), tag(n, rows, cols));
  }

  std::unique_ptr<kernels::backend> b_;
  std::mt19937_64 rng_;
};

// n ≤ 16 with cols % 16 == 0 takes the fused kernel in bf16; the rest (n > 16, cols 200, f32) the
// dequantize + cuBLAS path. Row counts not a multiple of 16 check the last block's guard.
TEST_P(cuda_quant, matches_cpu_twin) {
  for (int n : {1, 3, 8, 9, 16, 17, 64}) {
    run(n, 256, 512, true);
    run(n, 100, 96, false);
  }
  run(1, 2048, 2048, false);  // several chunks per warp
  run(4, 48, 8192, true);
  run(2, 40, 200, true);      // cols % 16 != 0: the cuBLAS path even in decode
  run(300, 130, 256, true);   // a prefill
}

// Every E4M3 code, subnormals included, decodes exactly: row r holds 448 (scale 1) and the codes;
// x is one-hot, so the output is the decoded code itself.
TEST_P(cuda_quant, decodes_every_code_exactly) {
  if (kind() != weight_quant::fp8) GTEST_SKIP() << "fp8 only";
  const int rows = 16, cols = 256;
  std::vector<float> w(static_cast<std::size_t>(rows) * cols, 0.0f);
  for (int r = 0; r < rows; ++r) {
    w[r * cols] = 448.0f;
    for (int c = 1; c < cols; ++c) {
      const std::uint8_t code = static_cast<std::uint8_t>((c + r * 17) % 256);
      const float v = kernels::e4m3_to_f32(code);
      w[r * cols + c] = std::isnan(v) ? 0.0f : v;
    }
  }
  for (int col : {1, 2, 7, 9, 100, 200, 255}) {
    std::vector<float> x(cols, 0.0f);
    x[col] = 1.0f;
    std::vector<float> got;
    run(1, rows, cols, false, &w, &x, &got);
    ASSERT_EQ(got.size(), static_cast<std::size_t>(rows));
    for (int r = 0; r < rows; ++r) EXPECT_EQ(got[r], w[r * cols + col]) << "row " << r << " column " << col;
  }
}

std::string case_name(const ::testing::TestParamInfo<quant_case>& info) {
  return std::string(kernels::weight_quant_name(info.param.kind)) + "_" +
         std::string(kernels::dtype_name(info.param.act));
}

INSTANTIATE_TEST_SUITE_P(all, cuda_quant,
                         ::testing::Values(quant_case{dtype::bf16, weight_quant::int8},
                                           quant_case{dtype::bf16, weight_quant::fp8},
                                           quant_case{dtype::f32, weight_quant::int8},
                                           quant_case{dtype::f32, weight_quant::fp8}),
                         case_name);

}  // namespace
}  // namespace conveyor
