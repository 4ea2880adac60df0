// Host quantization (int8 and FP8 E4M3 with per-row scales) and the CPU twin of the quantized linear.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "conveyor/kernels/cpu_backend.hpp"
#include "conveyor/kernels/quant.hpp"
#include "../../kernels/cpu/cpu_ops.hpp"

namespace conveyor::kernels {
namespace {

TEST(e4m3, known_codes) {
  EXPECT_EQ(f32_to_e4m3(1.0f), 0x38);
  EXPECT_EQ(f32_to_e4m3(-1.0f), 0xb8);
  EXPECT_EQ(f32_to_e4m3(448.0f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(1e6f), 0x7e);    // saturates
  EXPECT_EQ(f32_to_e4m3(-1e6f), 0xfe);
  EXPECT_EQ(f32_to_e4m3(0.001953125f), 0x01);  // 2^-9, the smallest subnormal
  EXPECT_EQ(f32_to_e4m3(0.0f), 0x00);
  EXPECT_EQ(f32_to_e4m3(std::nanf("")), 0x7f);
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0x08), 0.015625f);
  EXPECT_EQ(e4m3_to_f32(0x07), 7.0f / 512.0f);
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0xff)));
}

TEST(e4m3, every_finite_code_round_trips) {
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7f) == 0x7f) continue;  // NaN
    const float v = e4m3_to_f32(static_cast<std::uint8_t>(b));
    EXPECT_EQ(f32_to_e4m3(v), b == 0x80 ? 0x80 : b) << "code " << b << " value " << v;
  }
}

// The encoder against a brute-force search: the nearest finite code, ties to the even code.
TEST(e4m3, encoder_rounds_to_nearest_even) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::uniform_int_distribution<int> exp(-12, 9);
  for (int i = 0; i < 200000; ++i) {
    float v = std::ldexp(mant(rng), exp(rng));
    if (i % 2) v = -v;
    if (i % 1000 == 0) v = std::ldexp(std::round(std::ldexp(std::fabs(v), 4)) + 0.5f, -4);  // exact ties
    int best = -1;
    double best_d = 1e30;
    for (int b = 0; b < 256; ++b) {
      if ((b & 0x7f) == 0x7f) continue;
      const double d = std::fabs(static_cast<double>(e4m3_to_f32(static_cast<std::uint8_t>(b))) - v);
      if (d < best_d || (d == best_d && (b & 1) == 0 && (best & 1) == 1)) {
        best_d = d;
        best = b;
      }
    }
    if (std::fabs(v) >= e4m3_max) best = v > 0 ? 0x7e : 0xfe;
    const int got = f32_to_e4m3(v);
    // ±0 codes compare equal in value.
    EXPECT_EQ(e4m3_to_f32(static_cast<std::uint8_t>(got)), e4m3_to_f32(static_cast<std::uint8_t>(best)))
        << "value " << v;
    if (HasFailure()) break;
  }
}

std::vector<float> random_matrix(int rows, int cols, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.05f);
  std::vector<float> w(static_cast<std::size_t>(rows) * cols);
  for (auto& x : w) x = d(rng);
  return w;
}

TEST(quantize_rows, int8_error_is_at_most_half_a_step) {
  const int rows = 37, cols = 200;
  auto w = random_matrix(rows, cols, 1);
  w[5 * cols + 3] = 0.0f;
  for (int c = 0; c < cols; ++c) w[9 * cols + c] = 0.0f;  // an all-zero row
  std::vector<std::uint8_t> q(w.size());
  std::vector<float> s(rows), back(w.size());
  quantize_rows(w.data(), rows, cols, weight_quant::int8, nullptr, q.data(), s.data());
  dequantize_rows(q.data(), dtype::i8, s.data(), 0, rows, cols, back.data());
  for (int r = 0; r < rows; ++r) {
    float absmax = 0.0f;
    int top = 0;
    for (int c = 0; c < cols; ++c) {
      absmax = std::max(absmax, std::fabs(w[r * cols + c]));
      top = std::max(top, std::abs(static_cast<int>(static_cast<std::int8_t>(q[r * cols + c]))));
      EXPECT_LE(std::fabs(back[r * cols + c] - w[r * cols + c]), s[r] * 0.5f * 1.0001f) << r << "," << c;
    }
    if (absmax > 0) {
      EXPECT_EQ(top, 127) << "row " << r << ": the largest weight takes the largest code";
      EXPECT_FLOAT_EQ(s[r], absmax / 127.0f);
    } else {
      EXPECT_EQ(top, 0);
    }
  }
}

TEST(quantize_rows, fp8_relative_error_is_within_e4m3_precision) {
  const int rows = 16, cols = 300;
  const auto w = random_matrix(rows, cols, 2);
  std::vector<std::uint8_t> q(w.size());
  std::vector<float> s(rows), back(w.size());
  quantize_rows(w.data(), rows, cols, weight_quant::fp8, nullptr, q.data(), s.data());
  dequantize_rows(q.data(), dtype::f8e4m3, s.data(), 0, rows, cols, back.data());
  for (std::size_t i = 0; i < w.size(); ++i) {
    // 3 mantissa bits: half a step is 2^-4 relative for normals; subnormals have an absolute step.
    const float r = s[i / cols];
    EXPECT_LE(std::fabs(back[i] - w[i]), std::max(std::fabs(w[i]) / 16.0f, r * 0.001953125f * 0.5f) * 1.0001f) << i;
  }
}

TEST(quantize_rows, given_row_absmax_sets_the_scales) {
  // A column slice of a wider matrix takes the scales of its full rows (tensor-parallel shards).
  const int rows = 4, cols = 8;
  const auto w = random_matrix(rows, cols, 3);
  const std::vector<float> absmax = {1.0f, 2.0f, 0.5f, 3.0f};
  std::vector<std::uint8_t> q(w.size());
  std::vector<float> s(rows);
  quantize_rows(w.data(), rows, cols, weight_quant::int8, absmax.data(), q.data(), s.data());
  for (int r = 0; r < rows; ++r) EXPECT_FLOAT_EQ(s[r], absmax[r] / 127.0f);
}

// The CPU twin: linear over the quantized matrix equals sgemm over its dequantized copy, for tiles
// smaller than the matrix (several row tiles) and with a bias.
TEST(linear_quant, equals_the_dequantized_product) {
  for (auto kind : {weight_quant::int8, weight_quant::fp8}) {
    for (int n : {1, 5}) {
      const int rows = 70, cols = 48;
      const auto w = random_matrix(rows, cols, 4);
      const auto x = random_matrix(n, cols, 5);
      const auto bias = random_matrix(1, rows, 6);
      std::vector<std::uint8_t> q(w.size());
      std::vector<float> s(rows), deq(w.size());
      quantize_rows(w.data(), rows, cols, kind, nullptr, q.data(), s.data());
      const dtype t = weight_quant_dtype(kind);
      dequantize_rows(q.data(), t, s.data(), 0, rows, cols, deq.data());
      std::vector<float> want(static_cast<std::size_t>(n) * rows), got(want.size()), scratch(cols * 16);
      cpu::linear(x.data(), n, deq.data(), rows, cols, bias.data(), want.data());
      cpu::linear_quant(x.data(), n, q.data(), t, s.data(), rows, cols, bias.data(), got.data(), scratch.data(),
                        scratch.size());
      for (std::size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5f) << i;
      // Through the backend interface too.
      auto b = make_cpu_backend({1});
      ASSERT_TRUE(b->caps().int8_weights && b->caps().fp8_weights);
      weight qw{q.data(), t, rows, cols};
      qw.scales = s.data();
      std::vector<float> via(want.size());
      b->linear(x.data(), n, qw, weight{bias.data(), dtype::f32, 1, rows}, via.data());
      for (std::size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(via[i], want[i], 1e-5f) << i;
    }
  }
}

}  // namespace
}  // namespace conveyor::kernels
