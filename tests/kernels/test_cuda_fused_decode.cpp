// The fused decode kernel (kernels/cuda/fused_decode.cu, backend::decode_layers) against its twin,
// the op-by-op decode layer (rmsnorm, qkv, rope, kv_write, attention, o, add_rmsnorm, gate_up,
// silu_mul, down) on the same backend, from the same random weights, residual and KV cache: the
// residual and the last down output after every layer, and every byte of both KV caches (the new
// key and value close, everything else untouched). Shapes: Llama-3.2-1B's layer (the bench model),
// the fixtures' small ones (most blocks own no rows), a group of 8, head_dim 128, a sliding window
// and qkv biases, the producer's L2 look-ahead on; contexts from 1 key to several splits of 64. The
// whole-model run against HF's goldens is test_cuda_model's `fused` cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "cuda_test_util.hpp"

namespace conveyor {
namespace {

using kernels::dtype;

struct shape_case {
  std::string name;
  int hidden, ffn, heads, kv_heads, head_dim, layers;
  bool bias;
  int window;
  std::vector<int> contexts;  ///< decode steps run in this order on the same caches
  int l2_ahead = 0;           ///< cuda_backend_options::fused_l2_ahead (the producer's L2 look-ahead)
};

std::vector<shape_case> cases() {
  return {
      {"llama1b", 2048, 8192, 32, 8, 64, 2, false, 0, {1, 37, 200, 700}},
      {"llama1b_16_layers", 2048, 8192, 32, 8, 64, 16, false, 0, {129, 200}},
      {"tiny_bias", 64, 200, 4, 2, 16, 3, true, 0, {1, 5, 70}},
      {"group8", 96, 256, 8, 1, 16, 2, false, 0, {3, 129}},
      {"window", 128, 352, 4, 2, 32, 2, false, 24, {10, 100}},
      {"hd128_bias", 1024, 2816, 8, 2, 128, 2, true, 0, {300}},
      {"llama1b_l2_ahead", 2048, 8192, 32, 8, 64, 2, false, 0, {37, 200}, 4},
  };
}

class fused_decode : public ::testing::TestWithParam<shape_case> {
 protected:
  void SetUp() override {
    kernels::cuda_backend_options o;
    o.fused_decode = true;
    o.fused_l2_ahead = GetParam().l2_ahead;
    std::string why;
    backend_ = testing::try_cuda_backend(o, why);
    if (!backend_) GTEST_SKIP() << "no CUDA device: " << why;
  }
  std::unique_ptr<kernels::backend> backend_;
};

TEST_P(fused_decode, matches_the_op_by_op_layers) {
  const shape_case& sc = GetParam();
  kernels::backend& b = *backend_;
  std::mt19937_64 rng(testing::test_seed());
  const int h = sc.hidden, hd = sc.head_dim, qkv_w = (sc.heads + 2 * sc.kv_heads) * hd;
  const int block_size = 16;
  const int max_ctx = *std::max_element(sc.contexts.begin(), sc.contexts.end());
  const int num_blocks = (max_ctx + block_size - 1) / block_size + 3;
  const std::size_t cache_elems = static_cast<std::size_t>(num_blocks) * block_size * sc.kv_heads * hd;

  std::vector<kernels::weight> owned;
  auto matrix = [&](int rows, int cols) {
    auto v = testing::random_values(rng, static_cast<std::size_t>(rows) * cols, dtype::f32, 1.0f / std::sqrt(cols));
    owned.push_back(b.upload_weight(v.data(), dtype::f32, rows, cols, false));
    return owned.back();
  };
  auto vec = [&](int n, float mean, float sd) {
    auto v = testing::random_values(rng, n, dtype::f32, sd);
    for (auto& x : v) x += mean;
    owned.push_back(b.upload_weight(v.data(), dtype::f32, 1, n, true));
    return owned.back();
  };
  std::vector<std::unique_ptr<testing::dev_acts>> caches;  // per layer: k, v (fused), k, v (ops)
  std::vector<kernels::layer_ref> fused_layers, op_layers;
  for (int l = 0; l < sc.layers; ++l) {
    kernels::layer_ref r;
    r.input_norm = vec(h, 1.0f, 0.1f);
    r.qkv = matrix(qkv_w, h);
    if (sc.bias) r.qkv_bias = vec(qkv_w, 0.0f, 0.5f);
    r.o = matrix(h, sc.heads * hd);
    if (sc.bias) r.o_bias = vec(h, 0.0f, 0.1f);
    r.post_norm = vec(h, 1.0f, 0.1f);
    r.gate_up = matrix(2 * sc.ffn, h);
    if (sc.bias) r.gate_up_bias = vec(2 * sc.ffn, 0.0f, 0.1f);
    r.down = matrix(h, sc.ffn);
    if (sc.bias) r.down_bias = vec(h, 0.0f, 0.1f);
    r.sliding_window = sc.window;
    const auto k0 = testing::random_values(rng, cache_elems, dtype::bf16);
    const auto v0 = testing::random_values(rng, cache_elems, dtype::bf16);
    for (const auto* init : {&k0, &v0, &k0, &v0}) caches.push_back(std::make_unique<testing::dev_acts>(b, *init));
    r.k_cache = caches[4 * l]->get_ptr();
    r.v_cache = caches[4 * l + 1]->get_ptr();
    fused_layers.push_back(r);
    r.k_cache = caches[4 * l + 2]->get_ptr();
    r.v_cache = caches[4 * l + 3]->get_ptr();
    op_layers.push_back(r);
  }
  for (const auto& w : owned) ASSERT_FALSE(w.empty()) << "out of device memory";

  kernels::attn_shape shape{sc.heads, sc.kv_heads, hd, 1.0f / std::sqrt(static_cast<float>(hd)), 0};
  std::vector<float> inv_freq(hd / 2);
  for (int i = 0; i < hd / 2; ++i) inv_freq[i] = std::pow(10000.0f, -2.0f * i / hd);
  testing::dev_bytes inv_freq_d(b, inv_freq);
  // A shuffled block table: keys of neighbouring blocks are far apart in the cache.
  std::vector<std::int32_t> table(num_blocks);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  testing::dev_bytes table_d(b, table);
  testing::dev_bytes q_start_d(b, std::vector<std::int32_t>{0, 1});

  const int ffn = sc.ffn;
  testing::dev_acts res_f(b, h), delta_f(b, h), qkv_f(b, qkv_w), attn_f(b, sc.heads * hd), o_f(b, h), act_f(b, ffn);
  testing::dev_acts res_o(b, h), delta_o(b, h), normed(b, h), qkv_o(b, qkv_w), attn(b, sc.heads * hd),
      gate_up(b, 2 * ffn), act_o(b, ffn);
  const float eps = 1e-5f;
  for (int ctx : sc.contexts) {
    const std::string what = sc.name + " ctx " + std::to_string(ctx);
    const int pos = ctx - 1;
    testing::dev_bytes pos_d(b, std::vector<std::int32_t>{pos});
    testing::dev_bytes slot_d(b, std::vector<std::int32_t>{table[pos / block_size] * block_size + pos % block_size});
    testing::dev_bytes ctx_d(b, std::vector<std::int32_t>{ctx});
    const kernels::attention_batch batch{1, q_start_d.as<std::int32_t>(), ctx_d.as<std::int32_t>(),
                                         table_d.as<std::int32_t>(), num_blocks, ctx, 1};
    const kernels::kv_layout layout{num_blocks, block_size};
    const auto residual = testing::random_values(rng, h, dtype::bf16);
    res_f.set(residual);
    res_o.set(residual);
    for (auto* p : {&delta_f, &qkv_f, &attn_f, &o_f, &act_f}) p->poison();

    kernels::decode_layers_call c;
    c.layers = fused_layers.data();
    c.num_layers = sc.layers;
    c.hidden = h;
    c.ffn = ffn;
    c.shape = shape;
    c.layout = layout;
    c.eps = eps;
    c.positions = pos_d.as<std::int32_t>();
    c.slots = slot_d.as<std::int32_t>();
    c.inv_freq = inv_freq_d.as<float>();
    c.batch = batch;
    c.residual = res_f.get_ptr();
    c.delta = delta_f.get_ptr();
    c.qkv = qkv_f.get_ptr();
    c.attn = attn_f.get_ptr();
    c.o = o_f.get_ptr();
    c.act = act_f.get_ptr();
    ASSERT_TRUE(b.decode_layers(c)) << what << ": the CUDA backend declined a supported shape";

    for (int l = 0; l < sc.layers; ++l) {
      const kernels::layer_ref& w = op_layers[l];
      kernels::attn_shape s = shape;
      s.sliding_window = sc.window;
      if (l == 0) {
        b.rmsnorm(res_o.get_ptr(), 1, h, w.input_norm, eps, normed.get_ptr());
      } else {
        b.add_rmsnorm(res_o.get_ptr(), delta_o.get_ptr(), 1, h, w.input_norm, eps, normed.get_ptr());
      }
      b.linear(normed.get_ptr(), 1, w.qkv, w.qkv_bias, qkv_o.get_ptr());
      b.rope(qkv_o.get_ptr(), 1, s, pos_d.as<std::int32_t>(), inv_freq_d.as<float>(), 1.0f);
      b.kv_write(qkv_o.get_ptr(), 1, s, slot_d.as<std::int32_t>(), layout, w.k_cache, w.v_cache);
      b.attention(qkv_o.get_ptr(), s, batch, layout, w.k_cache, w.v_cache, attn.get_ptr());
      b.linear(attn.get_ptr(), 1, w.o, w.o_bias, delta_o.get_ptr());
      b.add_rmsnorm(res_o.get_ptr(), delta_o.get_ptr(), 1, h, w.post_norm, eps, normed.get_ptr());
      b.linear(normed.get_ptr(), 1, w.gate_up, w.gate_up_bias, gate_up.get_ptr());
      b.silu_mul(gate_up.get_ptr(), 1, ffn, act_o.get_ptr());
      b.linear(act_o.get_ptr(), 1, w.down, w.down_bias, delta_o.get_ptr());
    }
    // Each path rounds its sums (in a different order) to bf16 where the other does: single flips of
    // the last bit compound over the layers, so the layers' outputs get the whole-model tolerance
    // test_cuda_model uses (2e-2) for two layers, growing as sqrt(layers / 2) (16 layers: 5.7e-2);
    // a wrong index or a missed term is far above it.
    const double layers_bound = 2e-2 * std::sqrt(sc.layers / 2.0);
    EXPECT_CLOSE_WITHIN(res_f.get(), res_o.get(), layers_bound, what + " residual");
    EXPECT_CLOSE_WITHIN(delta_f.get(), delta_o.get(), layers_bound, what + " last down output");
    for (int l = 0; l < sc.layers; ++l) {
      for (int kv = 0; kv < 2; ++kv) {
        const auto got = caches[4 * l + kv]->get(), want = caches[4 * l + 2 + kv]->get();
        const std::size_t slot = static_cast<std::size_t>(table[pos / block_size]) * block_size + pos % block_size;
        const std::size_t row0 = slot * sc.kv_heads * hd, row1 = row0 + static_cast<std::size_t>(sc.kv_heads) * hd;
        std::size_t changed = 0;
        for (std::size_t i = 0; i < got.size(); ++i) changed += (i < row0 || i >= row1) && got[i] != want[i];
        EXPECT_EQ(changed, 0u) << what << " layer " << l << (kv ? " V" : " K") << ": cache outside the new slot";
        const std::vector<float> g(got.begin() + row0, got.begin() + row1), r(want.begin() + row0, want.begin() + row1);
        // Layer l's key and value carry the flips of the l layers before it (1e-2 × sqrt(l + 1)).
        EXPECT_CLOSE_WITHIN(g, r, 1e-2 * std::sqrt(l + 1.0),
                            what + " layer " + std::to_string(l) + (kv ? " new V" : " new K"));
        caches[4 * l + kv]->set(want);  // the next context starts from equal caches
      }
    }
  }
  for (auto& w : owned) b.release(const_cast<void*>(w.data));
}

INSTANTIATE_TEST_SUITE_P(shapes, fused_decode, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace conveyor
