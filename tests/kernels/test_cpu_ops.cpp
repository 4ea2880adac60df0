// CPU reference kernels against straightforward double-precision formulas on random inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>

#include "../../kernels/cpu/cpu_ops.hpp"
#include "conveyor/kernels/cpu_backend.hpp"
#include "conveyor/kernels/sampling.hpp"

namespace conveyor::kernels {
namespace {

std::vector<float> random_vec(std::size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

TEST(cpu_ops, linear_matches_double_reference) {
  std::mt19937 rng(1);
  for (auto [n, rows, cols] : {std::tuple{1, 7, 5}, {13, 33, 17}, {4, 128, 96}}) {
    auto x = random_vec(n * cols, rng), w = random_vec(rows * cols, rng), b = random_vec(rows, rng);
    std::vector<float> out(n * rows, NAN);
    cpu::linear(x.data(), n, w.data(), rows, cols, b.data(), out.data());
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < rows; ++j) {
        double ref = b[j];
        for (int k = 0; k < cols; ++k) ref += static_cast<double>(x[i * cols + k]) * w[j * cols + k];
        EXPECT_NEAR(out[i * rows + j], ref, 1e-4 * (1 + std::fabs(ref)));
      }
  }
}

TEST(cpu_ops, add_rmsnorm_matches_formula) {
  std::mt19937 rng(2);
  const int n = 3, width = 37;
  auto res = random_vec(n * width, rng), x = random_vec(n * width, rng), w = random_vec(width, rng);
  auto res_ref = res;
  std::vector<float> out(n * width, NAN);
  cpu::add_rmsnorm(res.data(), x.data(), n, width, w.data(), 1e-5f, out.data());
  for (int r = 0; r < n; ++r) {
    double ss = 0;
    for (int i = 0; i < width; ++i) {
      res_ref[r * width + i] += x[r * width + i];
      ss += static_cast<double>(res_ref[r * width + i]) * res_ref[r * width + i];
    }
    const double inv = 1.0 / std::sqrt(ss / width + 1e-5);
    for (int i = 0; i < width; ++i) {
      EXPECT_FLOAT_EQ(res[r * width + i], res_ref[r * width + i]);
      EXPECT_NEAR(out[r * width + i], w[i] * res_ref[r * width + i] * inv, 1e-5);
    }
  }
}

TEST(cpu_ops, rope_rotates_q_and_k_and_leaves_v) {
  std::mt19937 rng(3);
  attn_shape s{4, 2, 8, 1.0f, 0};
  const int n = 3, width = (4 + 2 * 2) * 8;
  auto qkv = random_vec(n * width, rng);
  auto orig = qkv;
  std::vector<float> inv_freq = {1.0f, 0.1f, 0.01f, 0.001f};
  std::vector<std::int32_t> pos = {0, 5, 100};
  cpu::rope(qkv.data(), n, s, pos.data(), inv_freq.data(), 1.0f);
  for (int t = 0; t < n; ++t) {
    for (int h = 0; h < 6; ++h) {
      for (int i = 0; i < 4; ++i) {
        const double a = pos[t] * static_cast<double>(inv_freq[i]);
        const float x0 = orig[t * width + h * 8 + i], x1 = orig[t * width + h * 8 + i + 4];
        EXPECT_NEAR(qkv[t * width + h * 8 + i], x0 * std::cos(a) - x1 * std::sin(a), 1e-5);
        EXPECT_NEAR(qkv[t * width + h * 8 + i + 4], x1 * std::cos(a) + x0 * std::sin(a), 1e-5);
      }
    }
    for (int i = 6 * 8; i < width; ++i) EXPECT_EQ(qkv[t * width + i], orig[t * width + i]) << "v changed";
  }
}

// Paged attention over a shuffled block table equals dense causal attention (with GQA and a window).
TEST(cpu_ops, paged_attention_matches_dense_reference) {
  std::mt19937 rng(4);
  for (int window : {0, 5}) {
    attn_shape s{6, 2, 8, 0.35f, window};
    const int bs = 4, num_blocks = 16;
    const int width = (6 + 4) * 8, kvw = 2 * 8;
    // Two sequences: one prefilling 7 tokens from scratch, one decoding 1 token after 10 cached.
    const std::vector<int> new_tokens = {7, 1}, ctx = {7, 11};
    std::vector<std::int32_t> table = {3, 9, 0, 0, 12, 1, 5, 0};  // 4 blocks per sequence
    const int total = 8;
    auto qkv = random_vec(total * width, rng);
    std::vector<float> kc(num_blocks * bs * kvw, NAN), vc(num_blocks * bs * kvw, NAN);
    // Full K/V history per sequence, written to the cache slots.
    std::vector<std::vector<float>> k_hist(2), v_hist(2);
    for (int sq = 0; sq < 2; ++sq) {
      k_hist[sq] = random_vec(ctx[sq] * kvw, rng);
      v_hist[sq] = random_vec(ctx[sq] * kvw, rng);
    }
    int row = 0;
    for (int sq = 0; sq < 2; ++sq) {
      for (int p = ctx[sq] - new_tokens[sq]; p < ctx[sq]; ++p, ++row) {  // new tokens' k/v come from qkv
        std::copy_n(&qkv[row * width + 6 * 8], kvw, &k_hist[sq][p * kvw]);
        std::copy_n(&qkv[row * width + 6 * 8 + kvw], kvw, &v_hist[sq][p * kvw]);
      }
      for (int p = 0; p < ctx[sq]; ++p) {
        const int slot = table[sq * 4 + p / bs] * bs + p % bs;
        std::copy_n(&k_hist[sq][p * kvw], kvw, &kc[slot * kvw]);
        std::copy_n(&v_hist[sq][p * kvw], kvw, &vc[slot * kvw]);
      }
    }
    std::vector<std::int32_t> q_start = {0, 7, 8}, ctx_len = {7, 11};
    attention_batch batch{2, q_start.data(), ctx_len.data(), table.data(), 4, 11, 7};
    std::vector<float> out(total * 6 * 8, NAN);
    cpu::attention(qkv.data(), s, batch, kv_layout{num_blocks, bs}, kc.data(), vc.data(), out.data());
    row = 0;
    for (int sq = 0; sq < 2; ++sq) {
      for (int p = ctx[sq] - new_tokens[sq]; p < ctx[sq]; ++p, ++row) {
        for (int h = 0; h < 6; ++h) {
          const int kvh = h / 3;
          const int lo = window > 0 ? std::max(0, p - window + 1) : 0;
          std::vector<double> w;
          double mx = -1e300;
          for (int j = lo; j <= p; ++j) {
            double dot = 0;
            for (int d = 0; d < 8; ++d) dot += qkv[row * width + h * 8 + d] * k_hist[sq][j * kvw + kvh * 8 + d];
            w.push_back(dot * 0.35);
            mx = std::max(mx, w.back());
          }
          double den = 0;
          for (auto& x : w) den += (x = std::exp(x - mx));
          for (int d = 0; d < 8; ++d) {
            double ref = 0;
            for (int j = lo; j <= p; ++j) ref += w[j - lo] / den * v_hist[sq][j * kvw + kvh * 8 + d];
            EXPECT_NEAR(out[row * 48 + h * 8 + d], ref, 1e-5) << "window " << window << " seq " << sq << " pos " << p;
          }
        }
      }
    }
  }
}

TEST(cpu_ops, silu_mul) {
  std::vector<float> gu = {1.0f, -2.0f, 3.0f, 0.5f};  // gate {1,-2}, up {3,0.5}
  std::vector<float> out(2);
  cpu::silu_mul(gu.data(), 1, 2, out.data());
  EXPECT_NEAR(out[0], 1.0 / (1 + std::exp(-1.0)) * 3.0, 1e-6);
  EXPECT_NEAR(out[1], -2.0 / (1 + std::exp(2.0)) * 0.5, 1e-6);
}

TEST(sampling, greedy_top_k1_and_tiny_top_p_pick_the_argmax) {
  std::vector<std::pair<float, std::int32_t>> scratch;
  std::vector<float> logits = {0.1f, 2.0f, 2.0f, -1.0f};
  EXPECT_EQ(argmax(logits.data(), 4), 1) << "first maximum wins, as torch.argmax";
  EXPECT_EQ(sample_row(logits.data(), 4, {0.0f, 0, 1.0f, 1, 0}, scratch), 1);
  EXPECT_EQ(sample_row(logits.data(), 4, {1.0f, 1, 1.0f, 1, 0}, scratch), 1);
  for (std::uint64_t step = 0; step < 50; ++step) {
    EXPECT_EQ(sample_row(logits.data(), 4, {1.0f, 0, 1e-3f, 9, step}, scratch), 1);
  }
}

TEST(sampling, deterministic_per_seed_and_step_and_follows_the_distribution) {
  std::vector<std::pair<float, std::int32_t>> scratch;
  std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  std::vector<int> counts(3, 0);
  const int draws = 20000;
  for (int i = 0; i < draws; ++i) {
    const sample_params p{1.0f, 0, 1.0f, 42, static_cast<std::uint64_t>(i)};
    const int t = sample_row(logits.data(), 3, p, scratch);
    EXPECT_EQ(t, sample_row(logits.data(), 3, p, scratch));
    ++counts[t];
  }
  EXPECT_NEAR(counts[0] / double(draws), 0.5, 0.02);
  EXPECT_NEAR(counts[1] / double(draws), 0.3, 0.02);
  EXPECT_NEAR(counts[2] / double(draws), 0.2, 0.02);
  // top_k = 2 never draws the third token; top_p = 0.6 keeps the first two (0.5 + 0.3 >= 0.6).
  for (int i = 0; i < 2000; ++i) {
    EXPECT_NE(sample_row(logits.data(), 3, {1.0f, 2, 1.0f, 7, static_cast<std::uint64_t>(i)}, scratch), 2);
    EXPECT_NE(sample_row(logits.data(), 3, {1.0f, 0, 0.6f, 7, static_cast<std::uint64_t>(i)}, scratch), 2);
  }
}

TEST(cpu_backend, bf16_and_f16_weights_convert_exactly) {
  auto b = make_cpu_backend({});
  const std::uint16_t bf[] = {0x3f80, 0xc000, 0x0000};   // 1, -2, 0
  const std::uint16_t hf[] = {0x3c00, 0xc000, 0x0001};   // 1, -2, smallest subnormal
  auto wb = b->upload_weight(bf, dtype::bf16, 1, 3, false);
  auto wh = b->upload_weight(hf, dtype::f16, 1, 3, false);
  const float* pb = static_cast<const float*>(wb.data);
  const float* ph = static_cast<const float*>(wh.data);
  EXPECT_EQ(pb[0], 1.0f);
  EXPECT_EQ(pb[1], -2.0f);
  EXPECT_EQ(ph[1], -2.0f);
  EXPECT_EQ(ph[2], std::ldexp(1.0f, -24));
  b->release(const_cast<void*>(wb.data));
  b->release(const_cast<void*>(wh.data));
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(bf16_to_f32(0x4049)), 0x4049);
}

}  // namespace
}  // namespace conveyor::kernels
