// Parity of every CUDA op with its CPU twin (kernels/cpu), on fresh random inputs of several shapes,
// with outputs poisoned before each run. Skips with the reason where no GPU is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <numeric>

#include "conveyor/kernels/cpu_backend.hpp"
#include "conveyor/kernels/sampling.hpp"
#include "cuda_test_util.hpp"
#include "../../kernels/cpu/cpu_ops.hpp"
#include "../../kernels/cuda/skinny_wgmma.hpp"

namespace conveyor {
namespace {

using kernels::dtype;
using testing::dev_acts;
using testing::dev_bytes;

std::string name_of(dtype t) { return std::string(kernels::dtype_name(t)); }

/// The paged KV layout of a decode step over sequences of `ctx` keys each, the new token being the
/// last key: their blocks drawn from a shuffled pool of all they need + 3, the block table, q_start
/// (one row a sequence) and each new token's cache slot.
struct paged_decode {
  int max_ctx = 0, max_blocks = 1, num_blocks = 0;
  std::vector<std::int32_t> table, q_start{0}, slots;
};
paged_decode make_paged_decode(const std::vector<int>& ctx, int block_size, std::mt19937_64& rng) {
  paged_decode d;
  const int n = static_cast<int>(ctx.size());
  int total_blocks = 0;
  for (int c : ctx) {
    d.max_ctx = std::max(d.max_ctx, c);
    d.max_blocks = std::max(d.max_blocks, (c + block_size - 1) / block_size);
    total_blocks += (c + block_size - 1) / block_size;
  }
  d.num_blocks = total_blocks + 3;
  std::vector<std::int32_t> perm(d.num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  d.table.assign(static_cast<std::size_t>(n) * d.max_blocks, 0);
  int next = 0;
  for (int s = 0; s < n; ++s) {
    for (int i = 0; i < (ctx[s] + block_size - 1) / block_size; ++i) d.table[s * d.max_blocks + i] = perm[next++];
    d.q_start.push_back(s + 1);
    const int p = ctx[s] - 1;
    d.slots.push_back(d.table[s * d.max_blocks + p / block_size] * block_size + p % block_size);
  }
  return d;
}

/// A decode step of the 1B's attention shape after its qkv projection: n sequences of 1..300 keys,
/// their paged layout, each new token's position, random caches and qkv input rows, rope frequencies.
struct qkv_decode_step {
  static constexpr int heads = 32, kv_heads = 8, d = 64, hidden = 2048, block_size = 16;
  static constexpr int width = (heads + 2 * kv_heads) * d;
  std::vector<int> ctx;
  paged_decode paged;
  int max_ctx = 256;  // the batch's bound: a power of two ≥ 256 and ≥ every context
  std::vector<std::int32_t> pos;
  std::vector<float> k0, v0, x, inv_freq;
  kernels::attn_shape shape() const { return {heads, kv_heads, d, 0.125f, 0}; }
};
qkv_decode_step make_qkv_decode_step(int n, dtype t, std::mt19937_64& rng) {
  using q = qkv_decode_step;
  qkv_decode_step c;
  std::uniform_int_distribution<int> len(1, 300);
  for (int i = 0; i < n; ++i) c.ctx.push_back(len(rng));
  c.paged = make_paged_decode(c.ctx, q::block_size, rng);
  while (c.max_ctx < c.paged.max_ctx) c.max_ctx *= 2;
  for (int s0 = 0; s0 < n; ++s0) c.pos.push_back(c.ctx[s0] - 1);
  const std::size_t cache = static_cast<std::size_t>(c.paged.num_blocks) * q::block_size * q::kv_heads * q::d;
  c.k0 = testing::random_values(rng, cache, t);
  c.v0 = testing::random_values(rng, cache, t);
  c.x = testing::random_values(rng, static_cast<std::size_t>(n) * q::hidden, t);
  c.inv_freq.resize(q::d / 2);
  for (int i = 0; i < q::d / 2; ++i) c.inv_freq[i] = std::pow(5e5f, -2.0f * i / q::d);
  return c;
}

/// A head_dim-64 decode step for the ring kernel's tests, after its qkv projection: the paged layout of
/// `ctx`, max_ctx as the executor's recordings pass it (a power of two ≥ 256), the new tokens'
/// positions (the last key), random caches and qkv rows, rope frequencies.
struct ring_decode_case {
  static constexpr int d = 64;
  std::vector<int> ctx;
  kernels::attn_shape shape;
  int block_size = 16;
  paged_decode paged;
  int max_ctx = 256;
  std::vector<std::int32_t> pos;
  std::vector<float> k0, v0, qkv0, inv_freq;
  kernels::kv_layout layout() const { return {paged.num_blocks, block_size}; }
  int rows() const { return static_cast<int>(ctx.size()); }
};
ring_decode_case make_ring_decode_case(const std::vector<int>& ctx, int heads, int kv_heads, int window, int block_size,
                                       dtype t, std::mt19937_64& rng) {
  constexpr int d = ring_decode_case::d;
  ring_decode_case c;
  c.ctx = ctx;
  c.shape = kernels::attn_shape{heads, kv_heads, d, 0.125f, window};
  c.block_size = block_size;
  c.paged = make_paged_decode(ctx, block_size, rng);
  while (c.max_ctx < c.paged.max_ctx) c.max_ctx *= 2;
  for (int x : ctx) c.pos.push_back(x - 1);
  const std::size_t cache = static_cast<std::size_t>(c.paged.num_blocks) * block_size * kv_heads * d;
  c.k0 = testing::random_values(rng, cache, t);
  c.v0 = testing::random_values(rng, cache, t);
  c.qkv0 = testing::random_values(rng, ctx.size() * (heads + 2 * kv_heads) * d, t, 2.0f);
  c.inv_freq.resize(d / 2);
  for (int i = 0; i < d / 2; ++i) c.inv_freq[i] = std::pow(5e5f, -2.0f * i / d);
  return c;
}

/// The step of `c` on `b`: rope and kv_write first where `fused` (the backend may take them into the
/// attention kernel), then attention; {qkv, k cache, v cache, out} as read back.
std::array<std::vector<float>, 4> run_ring_decode_case(kernels::backend& b, const ring_decode_case& c, bool fused) {
  const int n = c.rows();
  const kernels::attn_shape& sh = c.shape;
  const kernels::kv_layout layout = c.layout();
  dev_acts qd(b, c.qkv0), kd(b, c.k0), vd(b, c.v0), out(b, static_cast<std::size_t>(n) * sh.num_heads * sh.head_dim);
  dev_bytes pos_d(b, c.pos), slot_d(b, c.paged.slots), freq_d(b, c.inv_freq), qs_d(b, c.paged.q_start),
      ctx_d(b, c.ctx), table_d(b, c.paged.table);
  kernels::attention_batch batch{n, qs_d.as<std::int32_t>(), ctx_d.as<std::int32_t>(), table_d.as<std::int32_t>(),
                                 c.paged.max_blocks, c.max_ctx, 1};
  out.poison();
  if (fused) {
    b.rope(qd.get_ptr(), n, sh, pos_d.as<std::int32_t>(), freq_d.as<float>(), 1.0f);
    b.kv_write(qd.get_ptr(), n, sh, slot_d.as<std::int32_t>(), layout, kd.get_ptr(), vd.get_ptr());
  }
  b.attention(qd.get_ptr(), sh, batch, layout, kd.get_ptr(), vd.get_ptr(), out.get_ptr());
  return {qd.get(), kd.get(), vd.get(), out.get()};
}

/// The CPU twin's attention output over the qkv and caches a device step left (`got`).
std::vector<float> ring_decode_reference(const ring_decode_case& c, const std::array<std::vector<float>, 4>& got) {
  const int n = c.rows();
  std::vector<float> ref(static_cast<std::size_t>(n) * c.shape.num_heads * c.shape.head_dim);
  kernels::attention_batch hb{n, c.paged.q_start.data(), c.ctx.data(), c.paged.table.data(), c.paged.max_blocks,
                              c.max_ctx, 1};
  kernels::cpu::attention(got[0].data(), c.shape, hb, c.layout(), got[1].data(), got[2].data(), ref.data());
  return ref;
}

class cuda_ops : public ::testing::TestWithParam<dtype> {
 protected:
  void SetUp() override {
    std::string why;
    b_ = testing::try_cuda_backend(GetParam(), why);
    if (!b_) GTEST_SKIP() << "no CUDA device: " << why;
    rng_.seed(testing::test_seed() ^ std::hash<std::string>{}(
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name()));
  }
  dtype t() const { return GetParam(); }
  /// The current GPU's compute capability major (9: Hopper, where the wgmma GEMM runs).
  static int sm_major() {
    int dev = 0, major = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    return major;
  }
  std::string tag(const std::string& op) const { return op + " " + name_of(t()); }
  /// A matrix weight uploaded from float32 host values; returns the values the device holds.
  kernels::weight upload_matrix(std::vector<float>& host, int rows, int cols) {
    for (auto& x : host) x = testing::representable(t(), x);
    return b_->upload_weight(host.data(), dtype::f32, rows, cols, false);
  }
  kernels::weight upload_vector(const std::vector<float>& host) {
    return b_->upload_weight(host.data(), dtype::f32, 1, static_cast<std::int64_t>(host.size()), true);
  }
  /// One linear on the backend (random x of n × cols, W of rows × cols, a bias when `with_bias`)
  /// against the CPU twin, reported as `op` + the shape + `suffix`. With `repeat`, a second call on
  /// the same inputs must give the same bits (a kernel that sums K splits in a fixed order).
  void check_linear(const std::string& op, int n, int rows, int cols, bool with_bias, const std::string& suffix = "",
                    bool repeat = false) {
    const std::string shape = " n" + std::to_string(n) + " " + std::to_string(rows) + "x" + std::to_string(cols) +
                              (with_bias ? " bias" : "") + suffix;
    auto x = testing::random_values(rng_, static_cast<std::size_t>(n) * cols, t());
    auto wh = testing::random_values(rng_, static_cast<std::size_t>(rows) * cols, t(), 0.05f);
    kernels::weight w = upload_matrix(wh, rows, cols);
    std::vector<float> bias_h = with_bias ? testing::random_values(rng_, rows, dtype::f32) : std::vector<float>{};
    kernels::weight bias = with_bias ? upload_vector(bias_h) : kernels::weight{};
    dev_acts xd(*b_, x), out(*b_, static_cast<std::size_t>(n) * rows);
    out.poison();
    b_->linear(xd.get_ptr(), n, w, bias, out.get_ptr());
    std::vector<float> ref(static_cast<std::size_t>(n) * rows);
    kernels::cpu::linear(x.data(), n, wh.data(), rows, cols, with_bias ? bias_h.data() : nullptr, ref.data());
    EXPECT_CLOSE(out.get(), ref, t(), tag(op + shape));
    if (repeat) {
      dev_acts again(*b_, static_cast<std::size_t>(n) * rows);
      again.poison();
      b_->linear(xd.get_ptr(), n, w, bias, again.get_ptr());
      EXPECT_EQ(again.get(), out.get()) << tag(op + " repeat" + shape);
    }
    b_->release(const_cast<void*>(w.data));
    if (with_bias) b_->release(const_cast<void*>(bias.data));
  }
  /// GEMV configurations the GEMV tests run under: the defaults (TMA stages), the register loads
  /// without the capped-grid staging (session 3's kernel), TMA with a small ring (more stages per
  /// tile, two blocks an SM), and TMA except for grids of one to two waves (qkv_proj's shape on the
  /// register kernel), and the launch-order options of session 17 turned the other way (norm prologue
  /// without norm_early, every GEMV and norm kernel triggering late, one stage before the prologue:
  /// timing only, so the same results, and no wait that could hang).
  static constexpr int gemv_configs = 5;
  static const char* gemv_config_name(int c) {
    return c == 0   ? ""
           : c == 1 ? " [legacy]"
           : c == 2 ? " [tma ring 40k]"
           : c == 3 ? " [tma, register partial waves]"
                    : " [late triggers, pre-wait 1]";
  }
  /// Re-creates the backend with the opt-in speed paths on (the small-batch GEMV and its fusions),
  /// in GEMV configuration `config`.
  void use_opt_in_paths(int config = 0) {
    kernels::cuda_backend_options o;
    o.compute_dtype = t();
    o.small_gemm = true;
    o.small_gemm_max_n = 16;
    o.fuse = true;
    o.fuse_norm = true;
    if (config == 1) o.gemv_tma = o.gemv_stage_capped = false;
    if (config == 2) o.gemv_tma_ring_kb = 40;
    if (config == 3) o.gemv_tma_partial_wave = false;
    if (config == 4) {
      o.gemv_norm_early = false;
      o.gemv_late_trigger = kernels::gemv_every_prologue;
      o.gemv_pre_wait_mask = kernels::gemv_every_prologue;
      o.gemv_pre_wait_stages = 1;
      o.norm_late_trigger = true;
    }
    auto b = kernels::make_cuda_backend(o);
    ASSERT_TRUE(b.ok()) << b.err().message;
    b_ = std::move(b).value();
  }

  std::unique_ptr<kernels::backend> b_;
  std::mt19937_64 rng_;
};

TEST_P(cuda_ops, write_and_read_round_trip) {
  for (std::size_t n : {1u, 1000u, 100003u}) {
    auto host = testing::random_values(rng_, n, t());
    dev_acts d(*b_, host);
    EXPECT_EQ(d.get(), host) << n;
  }
}

TEST_P(cuda_ops, upload_weight_converts_every_source_dtype) {
  const int rows = 37, cols = 129;
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  std::vector<float> src(rows * cols);
  for (auto& x : src) x = u(rng_);
  std::vector<std::uint16_t> as_bf16(src.size()), as_f16(src.size());
  for (std::size_t i = 0; i < src.size(); ++i) as_bf16[i] = kernels::f32_to_bf16(src[i]);
  // f16 bits of small integers and halves are exact; use those for the f16 source.
  std::vector<float> f16_vals(src.size());
  for (std::size_t i = 0; i < src.size(); ++i) {
    f16_vals[i] = std::round(src[i] * 2.0f) / 2.0f;
    // float -> half for these exactly representable values
    const float v = f16_vals[i];
    std::uint32_t bits;
    std::memcpy(&bits, &v, 4);
    const std::uint16_t sign = (bits >> 16) & 0x8000u;
    if (v == 0.0f) { as_f16[i] = sign; continue; }
    const int exp = static_cast<int>((bits >> 23) & 0xff) - 127 + 15;
    as_f16[i] = static_cast<std::uint16_t>(sign | (exp << 10) | ((bits >> 13) & 0x3ffu));
  }
  struct source { dtype type; const void* data; std::vector<float> want; };
  std::vector<float> bf16_vals(src.size());
  for (std::size_t i = 0; i < src.size(); ++i) bf16_vals[i] = kernels::bf16_to_f32(as_bf16[i]);
  for (const auto& s : {source{dtype::f32, src.data(), src}, source{dtype::bf16, as_bf16.data(), bf16_vals},
                        source{dtype::f16, as_f16.data(), f16_vals}}) {
    for (bool vec : {false, true}) {
      kernels::weight w = b_->upload_weight(s.data, s.type, vec ? 1 : rows, vec ? rows * cols : cols, vec);
      ASSERT_FALSE(w.empty());
      EXPECT_EQ(w.type, vec ? dtype::f32 : t());
      std::vector<float> got(src.size());
      if (w.type == dtype::f32) {
        b_->download(got.data(), w.data, got.size() * 4);
      } else {
        std::vector<std::uint16_t> raw(src.size());
        b_->download(raw.data(), w.data, raw.size() * 2);
        for (std::size_t i = 0; i < raw.size(); ++i) got[i] = kernels::bf16_to_f32(raw[i]);
      }
      for (std::size_t i = 0; i < got.size(); ++i) {
        const float want = w.type == dtype::f32 ? s.want[i] : testing::representable(dtype::bf16, s.want[i]);
        ASSERT_EQ(got[i], want) << "source " << kernels::dtype_name(s.type) << " element " << i;
      }
      b_->release(const_cast<void*>(w.data));
    }
  }
}

TEST_P(cuda_ops, embedding_and_gather_rows) {
  for (auto [vocab, width, n] : {std::tuple{37, 67, 1}, {1000, 128, 13}, {5, 4096, 300}}) {
    auto table_h = testing::random_values(rng_, static_cast<std::size_t>(vocab) * width, t());
    kernels::weight table = upload_matrix(table_h, vocab, width);
    std::uniform_int_distribution<int> pick(0, vocab - 1);
    std::vector<std::int32_t> ids(n);
    for (auto& i : ids) i = pick(rng_);
    dev_bytes ids_d(*b_, ids);
    dev_acts out(*b_, static_cast<std::size_t>(n) * width);
    out.poison();
    b_->embedding(ids_d.as<std::int32_t>(), n, table, out.get_ptr());
    std::vector<float> ref;
    for (int i : ids) ref.insert(ref.end(), table_h.begin() + static_cast<std::size_t>(i) * width,
                                 table_h.begin() + static_cast<std::size_t>(i + 1) * width);
    EXPECT_EQ(out.get(), ref) << "embedding " << vocab << "x" << width;

    // gather_rows of the embedded rows, in a random order with repeats
    std::uniform_int_distribution<int> row_pick(0, n - 1);
    std::vector<std::int32_t> rows(std::max(1, n / 2 + 1));
    for (auto& r : rows) r = row_pick(rng_);
    dev_bytes rows_d(*b_, rows);
    dev_acts g(*b_, rows.size() * width);
    g.poison();
    b_->gather_rows(out.get_ptr(), rows_d.as<std::int32_t>(), static_cast<int>(rows.size()), width, g.get_ptr());
    std::vector<float> gref;
    for (int r : rows) gref.insert(gref.end(), ref.begin() + static_cast<std::size_t>(r) * width,
                                   ref.begin() + static_cast<std::size_t>(r + 1) * width);
    EXPECT_EQ(g.get(), gref) << "gather_rows";
    b_->release(const_cast<void*>(table.data));
  }
}

TEST_P(cuda_ops, rmsnorm_and_add_rmsnorm) {
  for (auto [n, width] : {std::pair{1, 1}, {7, 33}, {64, 128}, {3, 4097}, {17, 8192}}) {
    const std::string shape = " " + std::to_string(n) + "x" + std::to_string(width);
    auto x = testing::random_values(rng_, static_cast<std::size_t>(n) * width, t(), 3.0f);
    auto res = testing::random_values(rng_, x.size(), t());
    std::vector<float> w(width);
    std::uniform_real_distribution<float> wd(0.5f, 1.5f);
    for (auto& v : w) v = wd(rng_);
    kernels::weight wd_ = upload_vector(w);
    const float eps = 1e-5f;
    dev_acts xd(*b_, x), rd(*b_, res), out(*b_, x.size());

    out.poison();
    b_->rmsnorm(xd.get_ptr(), n, width, wd_, eps, out.get_ptr());
    std::vector<float> ref(x.size());
    kernels::cpu::rmsnorm(x.data(), n, width, w.data(), eps, ref.data());
    EXPECT_CLOSE(out.get(), ref, t(), tag("rmsnorm" + shape));

    out.poison();
    b_->add_rmsnorm(rd.get_ptr(), xd.get_ptr(), n, width, wd_, eps, out.get_ptr());
    std::vector<float> res_ref = res;
    kernels::cpu::add_rmsnorm(res_ref.data(), x.data(), n, width, w.data(), eps, ref.data());
    EXPECT_CLOSE(out.get(), ref, t(), tag("add_rmsnorm out" + shape));
    EXPECT_CLOSE(rd.get(), res_ref, t(), tag("add_rmsnorm residual" + shape));
    b_->release(const_cast<void*>(wd_.data));
  }
}

TEST_P(cuda_ops, add) {
  for (std::size_t n : {1u, 1000u, (1u << 20) + 3u}) {
    auto a = testing::random_values(rng_, n, t()), x = testing::random_values(rng_, n, t());
    dev_acts ad(*b_, a), xd(*b_, x);
    b_->add(ad.get_ptr(), xd.get_ptr(), n);
    for (std::size_t i = 0; i < n; ++i) a[i] += x[i];
    EXPECT_CLOSE(ad.get(), a, t(), tag("add " + std::to_string(n)));
  }
}

TEST_P(cuda_ops, linear_with_and_without_bias) {
  for (auto [n, rows, cols] : {std::tuple{1, 1, 1}, {3, 17, 33}, {64, 384, 256}, {130, 1000, 515}, {1, 4096, 2048}}) {
    for (bool with_bias : {false, true}) check_linear("linear", n, rows, cols, with_bias);
  }
}

TEST_P(cuda_ops, rope) {
  struct c { int heads, kv_heads, head_dim, n; float theta, scaling; };
  for (auto s : {c{4, 2, 32, 1, 1e4f, 1.0f}, c{8, 2, 16, 77, 1e6f, 1.0f}, c{32, 8, 128, 300, 5e5f, 1.0f},
                 c{5, 1, 64, 33, 1e4f, 1.1386294f}}) {
    kernels::attn_shape sh{s.heads, s.kv_heads, s.head_dim, 1.0f, 0};
    const int width = (s.heads + 2 * s.kv_heads) * s.head_dim;
    auto qkv = testing::random_values(rng_, static_cast<std::size_t>(s.n) * width, t());
    std::vector<std::int32_t> pos(s.n);
    std::uniform_int_distribution<int> pd(0, 100000);
    for (auto& p : pos) p = pd(rng_);
    std::vector<float> inv_freq(s.head_dim / 2);
    for (int i = 0; i < s.head_dim / 2; ++i) inv_freq[i] = std::pow(s.theta, -2.0f * i / s.head_dim);
    dev_acts qd(*b_, qkv);
    dev_bytes pos_d(*b_, pos), freq_d(*b_, inv_freq);
    b_->rope(qd.get_ptr(), s.n, sh, pos_d.as<std::int32_t>(), freq_d.as<float>(), s.scaling);
    kernels::cpu::rope(qkv.data(), s.n, sh, pos.data(), inv_freq.data(), s.scaling);
    EXPECT_CLOSE(qd.get(), qkv, t(),
                 tag("rope h" + std::to_string(s.heads) + "/" + std::to_string(s.kv_heads) + " d" +
                     std::to_string(s.head_dim) + " n" + std::to_string(s.n)));
  }
}

TEST_P(cuda_ops, silu_mul) {
  for (auto [n, ffn] : {std::pair{1, 1}, {5, 353}, {100, 8192}}) {
    auto gu = testing::random_values(rng_, static_cast<std::size_t>(n) * 2 * ffn, t(), 2.0f);
    dev_acts gd(*b_, gu), out(*b_, static_cast<std::size_t>(n) * ffn);
    out.poison();
    b_->silu_mul(gd.get_ptr(), n, ffn, out.get_ptr());
    std::vector<float> ref(static_cast<std::size_t>(n) * ffn);
    kernels::cpu::silu_mul(gu.data(), n, ffn, ref.data());
    EXPECT_CLOSE(out.get(), ref, t(), tag("silu_mul " + std::to_string(n) + "x" + std::to_string(ffn)));
  }
}

TEST_P(cuda_ops, kv_write_touches_only_its_slots) {
  for (auto [heads, kv_heads, head_dim, n] : {std::tuple{4, 2, 32, 1}, {8, 2, 16, 50}, {32, 8, 128, 257}}) {
    kernels::attn_shape sh{heads, kv_heads, head_dim, 1.0f, 0};
    const int block_size = 16, num_blocks = (n + 15) / 16 + 7;
    const std::size_t cache = static_cast<std::size_t>(num_blocks) * block_size * kv_heads * head_dim;
    auto k = testing::random_values(rng_, cache, t()), v = testing::random_values(rng_, cache, t());
    auto qkv = testing::random_values(rng_, static_cast<std::size_t>(n) * (heads + 2 * kv_heads) * head_dim, t());
    std::vector<std::int32_t> slots(num_blocks * block_size);
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng_);
    slots.resize(n);
    dev_acts kd(*b_, k), vd(*b_, v), qd(*b_, qkv);
    dev_bytes sd(*b_, slots);
    b_->kv_write(qd.get_ptr(), n, sh, sd.as<std::int32_t>(), {num_blocks, block_size}, kd.get_ptr(), vd.get_ptr());
    kernels::cpu::kv_write(qkv.data(), n, sh, slots.data(), k.data(), v.data());
    EXPECT_EQ(kd.get(), k) << "k cache, n " << n;
    EXPECT_EQ(vd.get(), v) << "v cache, n " << n;
  }
}

// One attention scenario: sequences with (new query rows, cached context) each.
struct attn_case {
  std::string name;
  int heads, kv_heads, head_dim;
  std::vector<std::pair<int, int>> seqs;  // (q_len, ctx_len)
  int window = 0;
  int block_size = 16;
};

void run_attention_case(kernels::backend& b, std::mt19937_64& rng, const attn_case& c) {
  const dtype t = b.caps().act_dtype;
  kernels::attn_shape sh{c.heads, c.kv_heads, c.head_dim, 1.0f / std::sqrt(static_cast<float>(c.head_dim)),
                         c.window};
  const int num_seqs = static_cast<int>(c.seqs.size());
  int max_q = 0, max_ctx = 0, total_q = 0, max_blocks = 1, total_blocks = 0;
  for (auto [q, ctx] : c.seqs) {
    max_q = std::max(max_q, q);
    max_ctx = std::max(max_ctx, ctx);
    total_q += q;
    const int nb = (ctx + c.block_size - 1) / c.block_size;
    max_blocks = std::max(max_blocks, nb);
    total_blocks += nb;
  }
  // Blocks handed out in a random order, with spares, so the page table matters.
  const int num_blocks = total_blocks + 3;
  std::vector<std::int32_t> perm(num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<std::int32_t> table(static_cast<std::size_t>(num_seqs) * max_blocks, 0), q_start{0}, ctx_len;
  int next = 0;
  for (int s = 0; s < num_seqs; ++s) {
    const auto [q, ctx] = c.seqs[s];
    for (int i = 0; i < (ctx + c.block_size - 1) / c.block_size; ++i) table[s * max_blocks + i] = perm[next++];
    q_start.push_back(q_start.back() + q);
    ctx_len.push_back(ctx);
  }
  const std::size_t cache = static_cast<std::size_t>(num_blocks) * c.block_size * c.kv_heads * c.head_dim;
  auto k = testing::random_values(rng, cache, t), v = testing::random_values(rng, cache, t);
  const int width = (c.heads + 2 * c.kv_heads) * c.head_dim;
  auto qkv = testing::random_values(rng, static_cast<std::size_t>(total_q) * width, t, 2.0f);
  dev_acts kd(b, k), vd(b, v), qd(b, qkv), out(b, static_cast<std::size_t>(total_q) * c.heads * c.head_dim);
  dev_bytes qs_d(b, q_start), ctx_d(b, ctx_len), table_d(b, table);
  kernels::attention_batch batch{num_seqs, qs_d.as<std::int32_t>(), ctx_d.as<std::int32_t>(),
                                 table_d.as<std::int32_t>(), max_blocks, max_ctx, max_q};
  kernels::kv_layout layout{num_blocks, c.block_size};
  out.poison();
  b.attention(qd.get_ptr(), sh, batch, layout, kd.get_ptr(), vd.get_ptr(), out.get_ptr());
  std::vector<float> ref(static_cast<std::size_t>(total_q) * c.heads * c.head_dim);
  kernels::attention_batch hb{num_seqs, q_start.data(), ctx_len.data(), table.data(), max_blocks, max_ctx, max_q};
  kernels::cpu::attention(qkv.data(), sh, hb, layout, k.data(), v.data(), ref.data());
  EXPECT_CLOSE(out.get(), ref, t, "attention " + c.name + " " + name_of(t));
}

std::vector<attn_case> attention_cases(std::mt19937_64& rng) {
  std::vector<attn_case> cases;
  cases.push_back({"prefill-1tok h4/2 d32", 4, 2, 32, {{1, 1}}});
  cases.push_back({"prefill h4/2 d32 T100", 4, 2, 32, {{100, 100}}});
  cases.push_back({"prefill h8/2 d16 T64", 8, 2, 16, {{64, 64}}});
  cases.push_back({"prefill h8/1 d16 bs7", 8, 1, 16, {{70, 70}}, 0, 7});
  cases.push_back({"prefill MHA d80", 4, 4, 80, {{45, 45}}});
  cases.push_back({"prefill d256", 2, 1, 256, {{40, 40}}});
  cases.push_back({"chunked prefill h12/4 d64", 12, 4, 64, {{37, 200}, {5, 5}, {128, 300}}});
  cases.push_back({"long prefill h8/2 d128", 8, 2, 128, {{512, 2500}}});
  cases.push_back({"sliding window 16 prefill", 4, 4, 16, {{40, 40}, {9, 60}}, 16});
  // Decode: one row per sequence, many lengths; exercises the split-K path.
  std::uniform_int_distribution<int> len(1, 3000);
  attn_case dec{"decode 33 seqs h32/8 d128", 32, 8, 128, {}};
  for (int i = 0; i < 33; ++i) dec.seqs.push_back({1, len(rng)});
  cases.push_back(dec);
  cases.push_back({"decode 1 seq ctx 4000 h8/2 d64", 8, 2, 64, {{1, 4000}}});
  cases.push_back({"decode ctx 1", 4, 2, 32, {{1, 1}, {1, 2}}});
  cases.push_back({"decode sliding window 16", 4, 4, 16, {{1, 64}, {1, 10}, {1, 17}}, 16});
  cases.push_back({"decode d80 h5/1", 5, 1, 80, {{1, 700}, {1, 33}}});
  // Mixed prefill + decode in one batch.
  attn_case mixed{"mixed prefill+decode h8/2 d64", 8, 2, 64, {{1, 900}, {50, 50}, {1, 17}, {200, 1000}, {1, 1}}};
  cases.push_back(mixed);
  return cases;
}

TEST_P(cuda_ops, attention_matches_cpu_on_paged_cache) {
  for (const auto& c : attention_cases(rng_)) run_attention_case(*b_, rng_, c);
}

// With a tiny scratch the decode kernel must fall back to fewer splits and stay correct.
TEST_P(cuda_ops, attention_decode_with_small_workspace) {
  std::string why;
  auto small = testing::try_cuda_backend(t(), why, 4096);
  ASSERT_TRUE(small) << why;
  run_attention_case(*small, rng_, {"decode small scratch h8/2 d64", 8, 2, 64, {{1, 3000}, {1, 2500}, {1, 100}}});
}

TEST_P(cuda_ops, sample_matches_cpu_draws) {
  for (int vocab : {1000, 32000, 128256}) {
    const int n = 70;  // more than one pass of 64 rows
    std::vector<float> logits(static_cast<std::size_t>(n) * vocab);
    std::normal_distribution<float> d(0.0f, 3.0f);
    for (std::size_t i = 0; i < logits.size(); ++i) {
      float x = d(rng_);
      if ((i / vocab) % 3 == 0) x = std::round(x * 2.0f) / 2.0f;  // many ties: the tie rule matters
      logits[i] = testing::representable(t(), x);
    }
    std::vector<kernels::sample_params> params(n);
    std::uniform_int_distribution<int> kind(0, 5);
    for (int i = 0; i < n; ++i) {
      auto& p = params[i];
      p.seed = rng_();
      p.step = rng_() % 10000;
      switch (kind(rng_)) {
        case 0: break;  // greedy
        case 1: p.temperature = 0.7f; break;
        case 2: p.temperature = 1.0f; p.top_k = 50; break;
        case 3: p.temperature = 0.9f; p.top_p = 0.9f; break;
        case 4: p.temperature = 1.3f; p.top_k = 200; p.top_p = 0.5f; break;
        default: p.temperature = 2.0f; p.top_k = 1; break;  // top_k 1 is greedy
      }
    }
    dev_acts ld(*b_, logits);
    std::vector<std::int32_t> got(n, -1);
    b_->sample(ld.get_ptr(), n, vocab, params.data(), got.data());
    std::vector<std::pair<float, std::int32_t>> scratch;
    int same = 0;
    for (int i = 0; i < n; ++i) {
      const std::int32_t want = kernels::sample_row(logits.data() + static_cast<std::size_t>(i) * vocab, vocab,
                                                    params[i], scratch);
      EXPECT_EQ(got[i], want) << "vocab " << vocab << " row " << i << " temperature " << params[i].temperature
                              << " top_k " << params[i].top_k << " top_p " << params[i].top_p;
      same += got[i] == want;
    }
    std::printf("[parity] %-56s %d/%d tokens identical\n", tag("sample vocab " + std::to_string(vocab)).c_str(),
                same, n);
  }
}

// Greedy rows only, more than one pass of 64: the argmax (split over many blocks a row for bf16)
// picks the CPU's token where the rule is subtle: a maximum repeated (the first wins), -0 before +0
// as the maximum (equal: the first wins), NaN beside finite values (never picked), a row of -inf.
TEST_P(cuda_ops, argmax_takes_the_first_maximum) {
  // 150 rows: passes of 64 and 22 rows; 5 rows: the batch-1 grid (64 slices a row, some empty at
  // vocab 1000), each kind of row once.
  for (auto [vocab, n] : {std::pair{1000, 150}, {128256, 150}, {1000, 5}, {128256, 5}}) {
    std::vector<float> logits(static_cast<std::size_t>(n) * vocab);
    std::normal_distribution<float> d(0.0f, 3.0f);
    std::uniform_int_distribution<int> at(1, vocab - 1);
    for (int r = 0; r < n; ++r) {
      float* row = logits.data() + static_cast<std::size_t>(r) * vocab;
      for (int i = 0; i < vocab; ++i) row[i] = testing::representable(t(), d(rng_));
      const int i = at(rng_), j = at(rng_), lo = std::min(i, j), hi = std::max(i, j);
      switch (r % 5) {
        case 0: break;
        case 1: row[lo] = row[hi] = 40.0f; break;  // the maximum twice
        case 2:                                     // ≤ 0 everywhere, -0 first, +0 later
          for (int k = 0; k < vocab; ++k) row[k] = -std::fabs(row[k]) - 1.0f;
          for (int k = 0; k < vocab; ++k) row[k] = testing::representable(t(), row[k]);
          row[lo] = -0.0f;
          row[hi] = 0.0f;
          break;
        case 3: row[lo] = std::nanf(""); row[hi] = 50.0f; break;
        default: std::fill(row, row + vocab, -INFINITY); break;
      }
    }
    std::vector<kernels::sample_params> params(n);  // greedy
    dev_acts ld(*b_, logits);
    std::vector<std::int32_t> got(n, -1);
    b_->sample(ld.get_ptr(), n, vocab, params.data(), got.data());
    std::vector<std::pair<float, std::int32_t>> scratch;
    for (int r = 0; r < n; ++r) {
      const std::int32_t want = kernels::sample_row(logits.data() + static_cast<std::size_t>(r) * vocab, vocab,
                                                    params[r], scratch);
      EXPECT_EQ(got[r], want) << "vocab " << vocab << " rows " << n << " row " << r << " kind " << r % 5;
    }
  }
}

// Small uploads are read by a kernel from the pinned staging slot and held until the next call;
// copy_draw lays a draw's tokens over the held upload (or copies them by a kernel when nothing is
// held). Sizes on both sides of the kernel path's limits (64 KB, whole words).
TEST_P(cuda_ops, small_uploads_and_draw_overlay) {
  for (std::size_t bytes : {4u, 6u, 4000u, 65536u, 80000u}) {
    std::vector<std::uint8_t> host(bytes), want(bytes), back(bytes, 0);
    for (auto& v : host) v = static_cast<std::uint8_t>(rng_());
    want = host;
    void* d = b_->alloc(bytes);
    b_->upload(d, host.data(), bytes);
    host.assign(bytes, 0);  // the caller may reuse its buffer at once
    b_->download(back.data(), d, bytes);
    EXPECT_EQ(back, want) << bytes << " bytes";
    b_->release(d);
  }
  const int vocab = 1000, n = 3;
  std::vector<float> logits(static_cast<std::size_t>(n) * vocab, 0.0f);
  const std::int32_t want[n] = {17, 998, 0};
  for (int r = 0; r < n; ++r) logits[static_cast<std::size_t>(r) * vocab + want[r]] = 5.0f;
  dev_acts ld(*b_, logits);
  std::vector<kernels::sample_params> params(n);  // greedy
  b_->draw(ld.get_ptr(), n, vocab, params.data(), 0);
  std::vector<std::int32_t> plan(500);
  for (std::size_t i = 0; i < plan.size(); ++i) plan[i] = static_cast<std::int32_t>(1000 + i);
  auto* dev = static_cast<std::int32_t*>(b_->alloc(plan.size() * 4));
  for (int at : {0, 10, 497}) {
    b_->upload(dev, plan.data(), plan.size() * 4);
    b_->copy_draw(0, n, dev + at);  // into the held upload
    std::vector<std::int32_t> got(plan.size());
    b_->download(got.data(), dev, got.size() * 4);
    for (int i = 0; i < static_cast<int>(plan.size()); ++i) {
      const std::int32_t expect = i >= at && i < at + n ? want[i - at] : plan[i];
      ASSERT_EQ(got[i], expect) << "overlay at " << at << ", word " << i;
    }
  }
  b_->copy_draw(0, n, dev + 100);  // nothing held: a copy of its own
  std::vector<std::int32_t> got(plan.size());
  b_->download(got.data(), dev, got.size() * 4);
  for (int i = 0; i < n; ++i) EXPECT_EQ(got[100 + i], want[i]);
  EXPECT_EQ(got[99], plan[99]);
  EXPECT_EQ(got[103], plan[103]);
  std::int32_t taken[n] = {-1, -1, -1};
  b_->take_draw(0, taken);  // the tokens the kernel wrote into pinned host memory
  for (int i = 0; i < n; ++i) EXPECT_EQ(taken[i], want[i]);
  b_->release(dev);
}

// The small-batch GEMV (bf16, n ≤ 16) across token counts, row tails, K tails and bias; f32 runs
// the same shapes through cuBLAS. The other GEMV configurations on the shapes that take their paths.
// linear + add_rmsnorm as one call, against the CPU twin: on cuBLAS batch sizes the bf16 backend cuts
// the linear along K into float32 slices summed by the norm's kernel (forced here, whatever the
// timing says; at n ≤ 16 the GEMV path runs). Repeated calls give the same bits.
TEST_P(cuda_ops, linear_add_rmsnorm_matches_cpu) {
  // 0: the default; 1: cuBLASLt's K split forced; 2: the wgmma GEMM's K slices (wgmma_split) at
  // every token count it takes (the default stops at 32).
  for (const int config : {0, 1, 2}) {
    const bool force = config == 1;
    kernels::cuda_backend_options o;
    o.compute_dtype = t();
    if (force) o.split_linear_margin_us = -1e9f;
    if (config != 0) o.wgmma_split = config == 2;
    if (config == 2) {
      o.wgmma_split_max_n = 128;
      o.wgmma_split_short_k_max_n = 128;
    }
    auto made = kernels::make_cuda_backend(o);
    ASSERT_TRUE(made.ok()) << made.err().message;
    b_ = std::move(made).value();
    for (auto [n, rows, cols] : {std::tuple{64, 2048, 8192}, {64, 2048, 2048}, {8, 2048, 8192}, {20, 256, 1024},
                                 {100, 512, 768}, {33, 296, 2056}, {1, 256, 512}, {256, 128, 64}}) {
      for (const bool with_bias : {false, true}) {
        const std::string shape = " n" + std::to_string(n) + " " + std::to_string(rows) + "x" + std::to_string(cols) +
                                  (with_bias ? " bias" : "") +
                                  (config == 1 ? " [split forced]" : config == 2 ? " [wgmma slices]" : "");
        auto x = testing::random_values(rng_, static_cast<std::size_t>(n) * cols, t());
        auto wh = testing::random_values(rng_, static_cast<std::size_t>(rows) * cols, t(), 0.05f);
        kernels::weight w = upload_matrix(wh, rows, cols);
        std::vector<float> bias_h = with_bias ? testing::random_values(rng_, rows, dtype::f32) : std::vector<float>{};
        kernels::weight bias = with_bias ? upload_vector(bias_h) : kernels::weight{};
        auto res = testing::random_values(rng_, static_cast<std::size_t>(n) * rows, t(), 2.0f);
        std::vector<float> nw(rows);
        std::uniform_real_distribution<float> wd(0.5f, 1.5f);
        for (auto& v : nw) v = wd(rng_);
        kernels::weight nwd = upload_vector(nw);
        const float eps = 1e-5f;
        std::vector<float> ref_out(static_cast<std::size_t>(n) * rows), ref_n(ref_out.size()), ref_res = res;
        kernels::cpu::linear(x.data(), n, wh.data(), rows, cols, with_bias ? bias_h.data() : nullptr, ref_out.data());
        kernels::cpu::add_rmsnorm(ref_res.data(), ref_out.data(), n, rows, nw.data(), eps, ref_n.data());
        std::vector<float> first_out, first_res, first_n;
        for (int rep = 0; rep < 2; ++rep) {
          dev_acts xd(*b_, x), out(*b_, ref_out.size()), rd(*b_, res), nd(*b_, ref_out.size());
          out.poison();
          nd.poison();
          b_->linear_add_rmsnorm(xd.get_ptr(), n, w, bias, out.get_ptr(), rd.get_ptr(), rows, nwd, eps, nd.get_ptr());
          if (rep == 0) {
            first_out = out.get();
            first_res = rd.get();
            first_n = nd.get();
            EXPECT_CLOSE(first_out, ref_out, t(), tag("linear_add_rmsnorm out" + shape));
            EXPECT_CLOSE(first_res, ref_res, t(), tag("linear_add_rmsnorm residual" + shape));
            EXPECT_CLOSE(first_n, ref_n, t(), tag("linear_add_rmsnorm normed" + shape));
          } else {
            EXPECT_EQ(out.get(), first_out) << tag("linear_add_rmsnorm repeat out" + shape);
            EXPECT_EQ(rd.get(), first_res) << tag("linear_add_rmsnorm repeat residual" + shape);
            EXPECT_EQ(nd.get(), first_n) << tag("linear_add_rmsnorm repeat normed" + shape);
          }
        }
        b_->release(const_cast<void*>(w.data));
        b_->release(const_cast<void*>(nwd.data));
        if (with_bias) b_->release(const_cast<void*>(bias.data));
      }
    }
  }
}

// norm_loads_ahead only moves the norm kernels' loads earlier (session 18): the same sums in the same
// order, so every output is bit-identical at 1 and 2 with 0's — the K-split sum + add + rmsnorm (cuBLASLt's
// split forced, 1-4 slices over these shapes) and add_rmsnorm / rmsnorm with 1, 2 and a part of 8-wide
// chunks a thread. Each backend uploads the same host values.
TEST_P(cuda_ops, norm_loads_ahead_is_bit_identical) {
  struct norm_case {
    int n, rows, cols;  // cols == 0: add_rmsnorm + rmsnorm of width `rows`
    bool bias;
  };
  const std::vector<norm_case> cases = {{64, 2048, 8192, false}, {64, 2048, 2048, false}, {8, 2048, 8192, true},
                                        {33, 296, 2056, true},   {100, 512, 768, false},  {64, 2048, 0, false},
                                        {5, 12288, 0, false},    {3, 8200, 0, false},     {9, 40, 0, false}};
  std::vector<std::vector<float>> inputs;
  for (const auto& c : cases) {
    const std::size_t acts = static_cast<std::size_t>(c.n) * c.rows;
    inputs.push_back(testing::random_values(rng_, c.cols > 0 ? static_cast<std::size_t>(c.n) * c.cols : acts, t()));
    auto wh = c.cols > 0 ? testing::random_values(rng_, static_cast<std::size_t>(c.rows) * c.cols, t(), 0.05f)
                         : std::vector<float>{};
    for (auto& x : wh) x = testing::representable(t(), x);
    inputs.push_back(wh);
    inputs.push_back(testing::random_values(rng_, acts, t(), 2.0f));  // residual
    std::vector<float> nw(c.rows);
    std::uniform_real_distribution<float> wd(0.5f, 1.5f);
    for (auto& v : nw) v = wd(rng_);
    inputs.push_back(nw);
    inputs.push_back(c.bias ? testing::random_values(rng_, c.rows, dtype::f32) : std::vector<float>{});
  }
  std::vector<std::vector<float>> got[3];
  for (const int ahead : {0, 1, 2}) {
    kernels::cuda_backend_options o;
    o.compute_dtype = t();
    o.split_linear_margin_us = -1e9f;  // cuBLASLt's K split wherever it can run
    o.wgmma_split = false;
    o.norm_loads_ahead = ahead;
    auto made = kernels::make_cuda_backend(o);
    ASSERT_TRUE(made.ok()) << made.err().message;
    b_ = std::move(made).value();
    for (std::size_t i = 0; i < cases.size(); ++i) {
      const auto& c = cases[i];
      const std::vector<float>* in = &inputs[5 * i];
      const std::size_t acts = static_cast<std::size_t>(c.n) * c.rows;
      kernels::weight nwd = upload_vector(in[3]);
      dev_acts xd(*b_, in[0]), rd(*b_, in[2]), out(*b_, acts), nd(*b_, acts);
      out.poison();
      nd.poison();
      if (c.cols > 0) {
        std::vector<float> wh = in[1];
        kernels::weight w = upload_matrix(wh, c.rows, c.cols);
        kernels::weight bias = c.bias ? upload_vector(in[4]) : kernels::weight{};
        b_->linear_add_rmsnorm(xd.get_ptr(), c.n, w, bias, out.get_ptr(), rd.get_ptr(), c.rows, nwd, 1e-5f, nd.get_ptr());
        b_->release(const_cast<void*>(w.data));
        if (c.bias) b_->release(const_cast<void*>(bias.data));
      } else {
        b_->add_rmsnorm(rd.get_ptr(), xd.get_ptr(), c.n, c.rows, nwd, 1e-5f, nd.get_ptr());
        b_->rmsnorm(rd.get_ptr(), c.n, c.rows, nwd, 1e-5f, out.get_ptr());
      }
      got[ahead].push_back(out.get());
      got[ahead].push_back(rd.get());
      got[ahead].push_back(nd.get());
      b_->release(const_cast<void*>(nwd.data));
    }
  }
  for (const int ahead : {1, 2}) {
    for (std::size_t i = 0; i < got[0].size(); ++i) {
      const auto& c = cases[i / 3];
      EXPECT_EQ(got[ahead][i], got[0][i]) << tag("norm_loads_ahead " + std::to_string(ahead) + " output " +
                                                 std::to_string(i % 3) + " n" + std::to_string(c.n) + " " +
                                                 std::to_string(c.rows) + "x" + std::to_string(c.cols));
    }
  }
}

// l2_prefetch_kb (session 19) holds the K-split add + rmsnorm and silu_mul until the next call names
// the GEMM that reads their output, whose weights they then ask L2 for before they wait: a hint, so
// every output is bit-identical with it off. The norm before qkv (linear_into_attention), before
// gate_up (linear_silu_mul), before another linear (the LM head), silu_mul before down; budgets that
// take each whole matrix (16 MB) and only its first columns (64 KB); the last norm read back with
// nothing after it (flushed by the download).
TEST_P(cuda_ops, l2_prefetch_is_bit_identical) {
  if (t() != dtype::bf16) GTEST_SKIP() << "the held kernels are the bf16 ones";
  constexpr int n = 64, hidden = 512, ffn = 1024, qkv_rows = 768, vocab = 1000;
  auto values = [&](std::size_t count, float scale) { return testing::random_values(rng_, count, t(), scale); };
  const auto x_h = values(static_cast<std::size_t>(n) * hidden, 1.0f);
  const auto res_h = values(static_cast<std::size_t>(n) * hidden, 2.0f);
  const auto o_h = values(static_cast<std::size_t>(hidden) * hidden, 0.05f);
  const auto qkv_h = values(static_cast<std::size_t>(qkv_rows) * hidden, 0.05f);
  const auto gu_h = values(static_cast<std::size_t>(2 * ffn) * hidden, 0.05f);
  const auto down_h = values(static_cast<std::size_t>(hidden) * ffn, 0.05f);
  const auto head_h = values(static_cast<std::size_t>(vocab) * hidden, 0.05f);
  std::vector<float> nw_h(hidden);
  std::uniform_real_distribution<float> wd(0.5f, 1.5f);
  for (auto& v : nw_h) v = wd(rng_);
  const int budgets[] = {0, 64, 16384};
  std::vector<std::vector<float>> got[3];
  for (int bi = 0; bi < 3; ++bi) {
    kernels::cuda_backend_options o;
    o.compute_dtype = t();
    o.split_linear_margin_us = -1e9f;  // cuBLASLt's K split (the held norm) wherever it can run
    o.wgmma_split = false;
    o.l2_prefetch_kb = budgets[bi];
    auto made = kernels::make_cuda_backend(o);
    ASSERT_TRUE(made.ok()) << made.err().message;
    b_ = std::move(made).value();
    auto w_o = o_h, w_qkv = qkv_h, w_gu = gu_h, w_down = down_h, w_head = head_h;
    kernels::weight wo = upload_matrix(w_o, hidden, hidden), wqkv = upload_matrix(w_qkv, qkv_rows, hidden),
                    wgu = upload_matrix(w_gu, 2 * ffn, hidden), wdown = upload_matrix(w_down, hidden, ffn),
                    whead = upload_matrix(w_head, vocab, hidden), nw = upload_vector(nw_h);
    const std::size_t acts = static_cast<std::size_t>(n) * hidden;
    dev_acts x(*b_, x_h), res(*b_, res_h), o_out(*b_, acts), normed(*b_, acts), q(*b_, static_cast<std::size_t>(n) * qkv_rows),
        gu(*b_, static_cast<std::size_t>(n) * 2 * ffn), act(*b_, static_cast<std::size_t>(n) * ffn), d_out(*b_, acts),
        normed2(*b_, acts), head(*b_, static_cast<std::size_t>(n) * vocab), normed3(*b_, acts);
    b_->linear_add_rmsnorm(x.get_ptr(), n, wo, {}, o_out.get_ptr(), res.get_ptr(), hidden, nw, 1e-5f, normed.get_ptr());
    b_->linear_into_attention(normed.get_ptr(), n, wqkv, {}, q.get_ptr());
    b_->linear_add_rmsnorm(x.get_ptr(), n, wo, {}, o_out.get_ptr(), res.get_ptr(), hidden, nw, 1e-5f, normed.get_ptr());
    b_->linear_silu_mul(normed.get_ptr(), n, wgu, {}, gu.get_ptr(), ffn, act.get_ptr());
    b_->linear_add_rmsnorm(act.get_ptr(), n, wdown, {}, d_out.get_ptr(), res.get_ptr(), hidden, nw, 1e-5f,
                           normed2.get_ptr());
    b_->linear(normed2.get_ptr(), n, whead, {}, head.get_ptr());
    b_->linear_add_rmsnorm(normed2.get_ptr(), n, wo, {}, o_out.get_ptr(), res.get_ptr(), hidden, nw, 1e-5f,
                           normed3.get_ptr());
    for (dev_acts* a : {&q, &act, &d_out, &normed2, &head, &o_out, &res, &normed3}) got[bi].push_back(a->get());
    for (const auto& w : {wo, wqkv, wgu, wdown, whead, nw}) b_->release(const_cast<void*>(w.data));
  }
  const char* names[] = {"qkv", "act", "down", "normed before the head", "head", "o", "residual", "last normed"};
  for (int bi = 1; bi < 3; ++bi) {
    for (std::size_t i = 0; i < got[0].size(); ++i) {
      EXPECT_EQ(got[bi][i], got[0][i]) << tag("l2_prefetch_kb " + std::to_string(budgets[bi]) + " " + names[i]);
    }
  }
}

// gate_up then silu_mul as one call: the default path (GEMM, then silu_mul or the GEMV's held
// silu) and wgmma_swiglu's fused epilogue (gate rows in one warpgroup, up rows in the other), with
// ffn tails shorter than a 64-row tile, runs shorter than one, bias, and the GEMV's token count.
TEST_P(cuda_ops, linear_silu_mul_matches_cpu) {
  for (const bool fused : {false, true}) {
    kernels::cuda_backend_options o;
    o.compute_dtype = t();
    o.wgmma_swiglu = fused;
    o.wgmma_swiglu_max_n = 128;  // every token tile of the fused kernel, not only the default's
    auto made = kernels::make_cuda_backend(o);
    ASSERT_TRUE(made.ok()) << made.err().message;
    b_ = std::move(made).value();
    for (auto [n, ffn, cols] : {std::tuple{64, 8192, 2048}, {8, 8192, 2048}, {2, 1024, 512}, {20, 300, 1024},
                                {100, 512, 768}, {128, 1024, 512}, {33, 40, 2056}, {1, 512, 256}}) {
      for (const bool with_bias : {false, true}) {
        const int rows = 2 * ffn;
        const std::string shape = " n" + std::to_string(n) + " ffn" + std::to_string(ffn) + " cols" +
                                  std::to_string(cols) + (with_bias ? " bias" : "") + (fused ? " [wgmma_swiglu]" : "");
        auto x = testing::random_values(rng_, static_cast<std::size_t>(n) * cols, t());
        auto wh = testing::random_values(rng_, static_cast<std::size_t>(rows) * cols, t(), 0.05f);
        kernels::weight w = upload_matrix(wh, rows, cols);
        std::vector<float> bias_h = with_bias ? testing::random_values(rng_, rows, dtype::f32) : std::vector<float>{};
        kernels::weight bias = with_bias ? upload_vector(bias_h) : kernels::weight{};
        std::vector<float> ref_gu(static_cast<std::size_t>(n) * rows), ref(static_cast<std::size_t>(n) * ffn);
        kernels::cpu::linear(x.data(), n, wh.data(), rows, cols, with_bias ? bias_h.data() : nullptr, ref_gu.data());
        if (t() == dtype::bf16) {
          for (float& v : ref_gu) v = kernels::bf16_to_f32(kernels::f32_to_bf16(v));  // gate_up is stored in bf16
        }
        kernels::cpu::silu_mul(ref_gu.data(), n, ffn, ref.data());
        std::vector<float> first;
        for (int rep = 0; rep < 2; ++rep) {
          dev_acts xd(*b_, x), gu(*b_, ref_gu.size()), out(*b_, ref.size());
          gu.poison();
          out.poison();
          b_->linear_silu_mul(xd.get_ptr(), n, w, bias, gu.get_ptr(), ffn, out.get_ptr());
          if (rep == 0) {
            first = out.get();
            EXPECT_CLOSE(first, ref, t(), tag("linear_silu_mul" + shape));
          } else {
            EXPECT_EQ(out.get(), first) << tag("linear_silu_mul repeat" + shape);
          }
        }
        b_->release(const_cast<void*>(w.data));
        if (with_bias) b_->release(const_cast<void*>(bias.data));
      }
    }
  }
}

TEST_P(cuda_ops, small_batch_linear) {
  for (int config = 0; config < gemv_configs; ++config) {
    use_opt_in_paths(config);
    // 16384 and 8999 rows: more tiles than fit on the GPU at once (blocks loop over tiles).
    for (auto [rows, cols] : {std::pair{48, 64}, {17, 96}, {40, 40}, {3072, 2048}, {2048, 8192}, {16384, 256}, {8999, 64}}) {
      if (config != 0 && rows < 2048) continue;
      for (int n : {1, 2, 5, 8, 9, 16}) {
        if (config != 0 && n != 1 && n != 9) continue;
        check_linear("small linear", n, rows, cols, (n + rows) % 2 == 1, gemv_config_name(config));
      }
    }
  }
}

// batch_invariant relies on it: in every GEMV configuration, each row of a GEMV of n ≤ 16 tokens is
// bit for bit the GEMV of that token alone (the reduction order over K must not depend on n).
TEST_P(cuda_ops, small_batch_linear_rows_match_single_rows) {
  if (t() != dtype::bf16) GTEST_SKIP() << "the GEMV is bf16 only";
  for (int config = 0; config < gemv_configs; ++config) {
    use_opt_in_paths(config);
    for (auto [rows, cols] : {std::pair{2048, 8192}, {16384, 256}, {3072, 2048}}) {
      const int n = 16;
      auto x = testing::random_values(rng_, static_cast<std::size_t>(n) * cols, t());
      auto wh = testing::random_values(rng_, static_cast<std::size_t>(rows) * cols, t(), 0.05f);
      kernels::weight w = upload_matrix(wh, rows, cols);
      for (int m : {16, 5}) {  // two n-tiles, one n-tile
        dev_acts xd(*b_, std::vector<float>(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(m) * cols));
        dev_acts all(*b_, static_cast<std::size_t>(m) * rows);
        b_->linear(xd.get_ptr(), m, w, {}, all.get_ptr());
        const std::vector<float> got = all.get();
        int same = 0;
        for (int r = 0; r < m; ++r) {
          dev_acts xr(*b_, std::vector<float>(x.begin() + static_cast<std::ptrdiff_t>(r) * cols,
                                              x.begin() + static_cast<std::ptrdiff_t>(r + 1) * cols));
          dev_acts one(*b_, static_cast<std::size_t>(rows));
          b_->linear(xr.get_ptr(), 1, w, {}, one.get_ptr());
          const std::vector<float> want = one.get();
          const bool eq = std::equal(want.begin(), want.end(), got.begin() + static_cast<std::ptrdiff_t>(r) * rows);
          same += eq;
          EXPECT_TRUE(eq) << "row " << r << " of n=" << m << " " << rows << "x" << cols << gemv_config_name(config);
        }
        std::printf("[parity] %-56s %d/%d rows bit-identical\n",
                    tag("small linear rows n" + std::to_string(m) + " " + std::to_string(rows) + "x" +
                        std::to_string(cols) + gemv_config_name(config))
                        .c_str(),
                    same, m);
      }
      b_->release(const_cast<void*>(w.data));
    }
  }
}

// The skinny GEMM (bf16, 17 ≤ n ≤ 128, skinny_gemm.cu) across token counts (each n-tile width),
// row tails, K tails (not a multiple of its 64-wide k tiles), K splits over a cluster (3072×2048,
// 2048×8192: 8 splits; 256×2056: the last split shorter than the others) and bias; f32 runs the same
// shapes through cuBLAS.
TEST_P(cuda_ops, skinny_linear) {
  kernels::cuda_backend_options o;
  o.compute_dtype = t();
  o.skinny_gemm = true;
  o.skinny_gemm_min_n = 17;
  o.skinny_gemm_max_n = 128;
  auto made = kernels::make_cuda_backend(o);
  ASSERT_TRUE(made.ok()) << made.err().message;
  b_ = std::move(made).value();
  for (auto [rows, cols] : {std::pair{3072, 2048}, {2048, 8192}, {256, 2056}, {40, 40}, {130, 1000}, {8999, 72}}) {
    for (int n : {17, 33, 64, 100, 128}) {
      if (static_cast<double>(rows) * cols * n > 3e8 && n != 64) continue;  // CPU reference time
      // repeat: deterministic, the cluster sums its K splits in a fixed order.
      check_linear("skinny linear", n, rows, cols, (n + rows) % 2 == 1, "", /*repeat=*/true);
    }
  }
}

// The Hopper skinny GEMM (bf16, TMA + wgmma, skinny_wgmma.cu) across token counts (each token tile:
// 32, 64, 96, 128, and padding inside them), row tails, K tails (not a multiple of its 64-wide k
// tiles), K splits over a cluster (3072×2048, 2048×8192: 8 splits; 256×2056: the last split empty),
// row runs longer than a tile (20000×64, 17000×136: more tiles than SMs, each block's last tile
// shifted back), one tile a block (13000×72), 256-row blocks (34000×72: ≥ 256 rows an SM) and bias;
// f32 runs the same shapes through cuBLAS.
TEST_P(cuda_ops, skinny_wgmma_linear) {
  kernels::cuda_backend_options o;
  o.compute_dtype = t();
  o.skinny_wgmma = true;
  o.skinny_gemm_min_n = 17;
  o.skinny_gemm_max_n = 128;
  auto made = kernels::make_cuda_backend(o);
  ASSERT_TRUE(made.ok()) << made.err().message;
  b_ = std::move(made).value();
  // On Hopper the backend must take the kernel (elsewhere these shapes run on cuBLAS).
  if (sm_major() == 9) ASSERT_TRUE(kernels::cuda::skinny_wgmma_init()) << "no tensor-map encoder from the driver";
  for (auto [rows, cols] : {std::pair{3072, 2048}, {2048, 8192}, {256, 2056}, {40, 40}, {130, 1000}, {8999, 72},
                            {20000, 64}, {17000, 136}, {13000, 72}, {34000, 72}}) {
    for (int n : {17, 33, 64, 80, 100, 128}) {
      if (static_cast<double>(rows) * cols * n > 3e8 && n != 64) continue;  // CPU reference time
      // repeat: deterministic, the cluster sums its K splits in a fixed order.
      check_linear("skinny wgmma linear", n, rows, cols, (n + rows) % 2 == 1, "", /*repeat=*/true);
    }
  }
}

// wgmma_push_reduce (session 20): the K-split cluster's partial sums pushed to the block owning
// their rows, one cluster barrier, against the default (tiles kept, read by the peers, two
// barriers): the same sums in the same order, so the same bits. Shapes with 4 splits (3072×2048,
// qkv of the 1B), 8 (2048×8192), an empty last split (256×2056), 4 splits of 16 k tiles (130×1000),
// every token tile, padding inside them, bias. (256-row blocks never split K: they need ≥ 256 rows an SM.)
TEST_P(cuda_ops, skinny_wgmma_push_reduce_is_bit_identical) {
  if (t() != dtype::bf16) GTEST_SKIP() << "the wgmma GEMM is bf16's";
  if (const int major = sm_major(); major != 9) {
    GTEST_SKIP() << "the wgmma GEMM needs sm_90 (this GPU is sm_" << major << "x)";
  }
  ASSERT_TRUE(kernels::cuda::skinny_wgmma_init()) << "no tensor-map encoder from the driver";
  for (auto [rows, cols] : {std::pair{3072, 2048}, {2048, 8192}, {256, 2056}, {130, 1000}}) {
    for (int n : {17, 33, 64, 80, 128}) {
      const auto xh = testing::random_values(rng_, static_cast<std::size_t>(n) * cols, t(), 1.0f);
      const auto wh = testing::random_values(rng_, static_cast<std::size_t>(rows) * cols, t(), 0.05f);
      std::vector<float> bias(rows);
      std::uniform_real_distribution<float> bd(-0.5f, 0.5f);
      for (auto& v : bias) v = bd(rng_);
      const bool with_bias = (rows + n) % 2 == 1;
      std::vector<float> got[2];
      for (int push = 0; push < 2; ++push) {
        kernels::cuda_backend_options o;
        o.compute_dtype = t();
        o.skinny_wgmma = true;
        o.skinny_gemm_min_n = 17;
        o.skinny_gemm_max_n = 128;
        o.wgmma_push_reduce = push == 1;
        auto made = kernels::make_cuda_backend(o);
        ASSERT_TRUE(made.ok()) << made.err().message;
        b_ = std::move(made).value();
        auto w_copy = wh;
        kernels::weight w = upload_matrix(w_copy, rows, cols);
        kernels::weight bw = with_bias ? upload_vector(bias) : kernels::weight{};
        dev_acts x(*b_, xh), out(*b_, static_cast<std::size_t>(n) * rows);
        out.poison();
        b_->linear(x.get_ptr(), n, w, bw, out.get_ptr());
        got[push] = out.get();
        b_->release(const_cast<void*>(w.data));
        if (with_bias) b_->release(const_cast<void*>(bw.data));
      }
      const std::string shape = std::to_string(rows) + "x" + std::to_string(cols) + " n" + std::to_string(n);
      ASSERT_EQ(got[1].size(), got[0].size());
      std::size_t differ = 0, first = 0;
      for (std::size_t i = 0; i < got[0].size(); ++i) {
        // NaN poison left anywhere fails too: NaN != NaN.
        if (!(got[1][i] == got[0][i])) {
          if (differ++ == 0) first = i;
        }
      }
      EXPECT_EQ(differ, 0u) << tag("push_reduce " + shape) << ": first at " << first << " (token " << first / rows
                            << ", row " << first % rows << ")";
    }
  }
}

// The backend may fuse an op into the next one (rmsnorm or silu_mul into a small linear, rope into
// kv_write); every buffer must end as the op-by-op CPU twin leaves it.
TEST_P(cuda_ops, fused_op_pairs_match_op_by_op) {
  for (int config = 0; config < gemv_configs; ++config) {
    use_opt_in_paths(config);
    // 9000 and 16384 rows: capped grids (the norm prologue there with gemv_stage_capped).
    for (auto [n, hidden, rows] : {std::tuple{1, 2048, 3072}, {7, 96, 64}, {16, 2048, 256}, {20, 64, 48}, {3, 256, 9000},
                                   {1, 2048, 16384}}) {
      if (config != 0 && hidden < 256) continue;
      const std::string shape = " n" + std::to_string(n) + " h" + std::to_string(hidden) + " rows " +
                                std::to_string(rows) + gemv_config_name(config);
      auto x = testing::random_values(rng_, static_cast<std::size_t>(n) * hidden, t(), 2.0f);
      auto res = testing::random_values(rng_, x.size(), t());
      std::vector<float> nw(hidden);
      std::uniform_real_distribution<float> wd(0.5f, 1.5f);
      for (auto& v : nw) v = wd(rng_);
      kernels::weight nwd = upload_vector(nw);
      auto wh = testing::random_values(rng_, static_cast<std::size_t>(rows) * hidden, t(), 0.05f);
      kernels::weight w = upload_matrix(wh, rows, hidden);
      const float eps = 1e-5f;
      std::vector<float> ref_n(x.size()), ref_out(static_cast<std::size_t>(n) * rows);

      // add_rmsnorm -> linear
      dev_acts xd(*b_, x), rd(*b_, res), nd(*b_, x.size()), out(*b_, ref_out.size());
      nd.poison();
      out.poison();
      b_->add_rmsnorm(rd.get_ptr(), xd.get_ptr(), n, hidden, nwd, eps, nd.get_ptr());
      b_->linear(nd.get_ptr(), n, w, {}, out.get_ptr());
      std::vector<float> res_ref = res;
      kernels::cpu::add_rmsnorm(res_ref.data(), x.data(), n, hidden, nw.data(), eps, ref_n.data());
      kernels::cpu::linear(ref_n.data(), n, wh.data(), rows, hidden, nullptr, ref_out.data());
      EXPECT_CLOSE(out.get(), ref_out, t(), tag("add_rmsnorm+linear out" + shape));
      EXPECT_CLOSE(rd.get(), res_ref, t(), tag("add_rmsnorm+linear residual" + shape));
      EXPECT_CLOSE(nd.get(), ref_n, t(), tag("add_rmsnorm+linear normed" + shape));

      // rmsnorm -> linear
      nd.poison();
      out.poison();
      b_->rmsnorm(xd.get_ptr(), n, hidden, nwd, eps, nd.get_ptr());
      b_->linear(nd.get_ptr(), n, w, {}, out.get_ptr());
      kernels::cpu::rmsnorm(x.data(), n, hidden, nw.data(), eps, ref_n.data());
      kernels::cpu::linear(ref_n.data(), n, wh.data(), rows, hidden, nullptr, ref_out.data());
      EXPECT_CLOSE(out.get(), ref_out, t(), tag("rmsnorm+linear out" + shape));
      EXPECT_CLOSE(nd.get(), ref_n, t(), tag("rmsnorm+linear normed" + shape));

      // silu_mul -> linear (ffn = hidden here)
      auto gu = testing::random_values(rng_, static_cast<std::size_t>(n) * 2 * hidden, t(), 2.0f);
      dev_acts gud(*b_, gu), act(*b_, x.size());
      act.poison();
      out.poison();
      b_->silu_mul(gud.get_ptr(), n, hidden, act.get_ptr());
      b_->linear(act.get_ptr(), n, w, {}, out.get_ptr());
      std::vector<float> ref_act(x.size());
      kernels::cpu::silu_mul(gu.data(), n, hidden, ref_act.data());
      kernels::cpu::linear(ref_act.data(), n, wh.data(), rows, hidden, nullptr, ref_out.data());
      EXPECT_CLOSE(out.get(), ref_out, t(), tag("silu_mul+linear out" + shape));
      EXPECT_CLOSE(act.get(), ref_act, t(), tag("silu_mul+linear act" + shape));
      b_->release(const_cast<void*>(w.data));
      b_->release(const_cast<void*>(nwd.data));
    }
  }
  // rope -> kv_write
  for (auto [heads, kv_heads, head_dim, n] : {std::tuple{32, 8, 64, 1}, {8, 2, 16, 37}, {12, 2, 128, 5}, {32, 8, 64, 200}}) {
    kernels::attn_shape sh{heads, kv_heads, head_dim, 1.0f, 0};
    const int width = (heads + 2 * kv_heads) * head_dim;
    const int block_size = 16, num_blocks = (n + 15) / 16 + 3;
    const std::size_t cache = static_cast<std::size_t>(num_blocks) * block_size * kv_heads * head_dim;
    auto qkv = testing::random_values(rng_, static_cast<std::size_t>(n) * width, t());
    auto k = testing::random_values(rng_, cache, t()), v = testing::random_values(rng_, cache, t());
    std::vector<std::int32_t> pos(n), slots(num_blocks * block_size);
    std::uniform_int_distribution<int> pd(0, 5000);
    for (auto& p : pos) p = pd(rng_);
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng_);
    slots.resize(n);
    std::vector<float> inv_freq(head_dim / 2);
    for (int i = 0; i < head_dim / 2; ++i) inv_freq[i] = std::pow(5e5f, -2.0f * i / head_dim);
    dev_acts qd(*b_, qkv), kd(*b_, k), vd(*b_, v);
    dev_bytes pos_d(*b_, pos), slot_d(*b_, slots), freq_d(*b_, inv_freq);
    b_->rope(qd.get_ptr(), n, sh, pos_d.as<std::int32_t>(), freq_d.as<float>(), 1.0f);
    b_->kv_write(qd.get_ptr(), n, sh, slot_d.as<std::int32_t>(), {num_blocks, block_size}, kd.get_ptr(), vd.get_ptr());
    kernels::cpu::rope(qkv.data(), n, sh, pos.data(), inv_freq.data(), 1.0f);
    kernels::cpu::kv_write(qkv.data(), n, sh, slots.data(), k.data(), v.data());
    const std::string shape = " h" + std::to_string(heads) + "/" + std::to_string(kv_heads) + " d" +
                              std::to_string(head_dim) + " n" + std::to_string(n);
    EXPECT_CLOSE(qd.get(), qkv, t(), tag("rope+kv_write qkv" + shape));
    EXPECT_CLOSE(kd.get(), k, t(), tag("rope+kv_write k" + shape));
    EXPECT_EQ(vd.get(), v) << "rope+kv_write v" << shape;
  }
}

// Grouped decode and tensor-core prefill at the shapes they take (Llama-3.2-1B: 32/8 heads, d64).
TEST_P(cuda_ops, attention_fast_paths_match_cpu) {
  std::uniform_int_distribution<int> len(100, 300);
  attn_case dec{"decode 64 seqs h32/8 d64", 32, 8, 64, {}};
  for (int i = 0; i < 64; ++i) dec.seqs.push_back({1, len(rng_)});
  run_attention_case(*b_, rng_, dec);
  run_attention_case(*b_, rng_, {"decode group 8 h16/2 d64", 16, 2, 64, {{1, 700}, {1, 5}, {1, 129}}});
  // Grids of at least as many blocks as SMs (the tensor-core decode kernel): group 8 with a window,
  // and group 4 with long contexts in several splits.
  attn_case g8{"decode 70 seqs group 8 h16/2 d64 window 90", 16, 2, 64, {}, 90};
  for (int i = 0; i < 70; ++i) g8.seqs.push_back({1, len(rng_)});
  run_attention_case(*b_, rng_, g8);
  std::uniform_int_distribution<int> long_len(1, 1500);
  attn_case split{"decode 20 seqs h32/8 d64 splits", 32, 8, 64, {}};
  for (int i = 0; i < 20; ++i) split.seqs.push_back({1, long_len(rng_)});
  split.seqs.push_back({1, 1500});
  run_attention_case(*b_, rng_, split);
  run_attention_case(*b_, rng_, {"decode window 100 h8/2 d64", 8, 2, 64, {{1, 700}, {1, 50}}, 100});
  run_attention_case(*b_, rng_, {"decode h8/2 d128", 8, 2, 128, {{1, 333}, {1, 1}, {1, 64}, {1, 1100}}});
  run_attention_case(*b_, rng_, {"decode h16/8 d128 window 40", 16, 8, 128, {{1, 97}, {1, 31}}, 40});
  run_attention_case(*b_, rng_, {"prefill h32/8 d64 T300", 32, 8, 64, {{300, 300}}});
  run_attention_case(*b_, rng_, {"prefill window 70 h8/2 d64", 8, 2, 64, {{200, 260}}, 70});
  run_attention_case(*b_, rng_, {"prefill h4/4 d128 chunked", 4, 4, 128, {{65, 130}, {3, 3}}});
}

// Tensor-core prefill, both kernels (gqa_prefill on: one block per KV head's group; off: one per query
// head): rows not a multiple of the tiles, several sequences (one of a single row), chunked prefill
// over cached keys, head_dim 64 and 128, groups 1/2/4/8 (6 falls back to the per-head kernel),
// sliding windows and a block size that splits tiles across pages.
TEST_P(cuda_ops, attention_prefill_paths_match_cpu) {
  const std::vector<attn_case> cases = {
      {"prefill gqa h32/8 d64 4 seqs", 32, 8, 64, {{333, 333}, {40, 40}, {1, 1}, {97, 97}}},
      {"prefill gqa chunked h16/4 d64", 16, 4, 64, {{100, 612}, {31, 31}, {64, 200}}},
      {"prefill gqa h16/4 d128 chunked", 16, 4, 128, {{150, 150}, {70, 300}}},
      {"prefill gqa group 8 h16/2 d64 window 50", 16, 2, 64, {{130, 180}, {17, 17}}, 50},
      {"prefill gqa group 8 h8/1 d128", 8, 1, 128, {{45, 45}, {33, 90}}},
      {"prefill gqa h4/2 d128 bs7", 4, 2, 128, {{77, 77}}, 0, 7},
      {"prefill gqa MHA h4/4 d64 window 100", 4, 4, 64, {{300, 300}}, 100},
      {"prefill group 6 h12/2 d64", 12, 2, 64, {{90, 90}, {20, 50}}},
  };
  for (const auto& c : cases) run_attention_case(*b_, rng_, c);
  kernels::cuda_backend_options o;
  o.compute_dtype = t();
  o.gqa_prefill = false;
  auto made = kernels::make_cuda_backend(o);
  ASSERT_TRUE(made.ok()) << made.err().message;
  auto per_head = std::move(made).value();
  for (auto c : cases) {
    c.name += " per-head";
    run_attention_case(*per_head, rng_, c);
  }
}

// rope -> kv_write -> attention of a decode step: the grouped decode kernel takes the first two where
// one block serves each (sequence, KV head) (and hands them to rope_kv where not: one long context,
// several splits). Every buffer must end as the op-by-op CPU twin leaves it.
TEST_P(cuda_ops, rope_kv_write_attention_decode_matches_op_by_op) {
  struct dcase {
    int heads, kv_heads, head_dim;
    std::vector<int> ctx;  // context per sequence, the new token included
  };
  std::uniform_int_distribution<int> len(2, 300);
  dcase many{32, 8, 64, {}};
  for (int i = 0; i < 64; ++i) many.ctx.push_back(len(rng_));
  // Also with decode_one_split_max_keys 1024 (session 30): one split, the rope fused into the
  // attention kernel, up to 1024 keys, so the new key's chunk is past the ring's first requests
  // (one sequence: the ring kernel; three: the tc kernel).
  std::unique_ptr<kernels::backend> one_split;
  if (t() == dtype::bf16) {
    kernels::cuda_backend_options o;
    o.compute_dtype = t();
    o.decode_one_split_max_keys = 1024;
    auto made = kernels::make_cuda_backend(o);
    ASSERT_TRUE(made.ok()) << made.err().message;
    one_split = std::move(made).value();
  }
  for (kernels::backend* be : {b_.get(), one_split.get()}) {
    if (be == nullptr) continue;
    for (const dcase& c : {many, dcase{16, 2, 64, {1, 129, 700}}, dcase{8, 2, 128, {333, 1, 64}},
                           dcase{8, 2, 64, {4000}}, dcase{32, 8, 64, {700}}, dcase{32, 8, 64, {1000}}}) {
      const int n = static_cast<int>(c.ctx.size()), block_size = 16;
      kernels::attn_shape sh{c.heads, c.kv_heads, c.head_dim, 1.0f / std::sqrt(static_cast<float>(c.head_dim)), 0};
      const auto [max_ctx, max_blocks, num_blocks, table, q_start, slots] = make_paged_decode(c.ctx, block_size, rng_);
      std::vector<std::int32_t> pos;
      for (int s = 0; s < n; ++s) pos.push_back(c.ctx[s] - 1);  // the new token is the last key
      const std::size_t cache = static_cast<std::size_t>(num_blocks) * block_size * c.kv_heads * c.head_dim;
      auto k = testing::random_values(rng_, cache, t()), v = testing::random_values(rng_, cache, t());
      const int width = (c.heads + 2 * c.kv_heads) * c.head_dim;
      auto qkv = testing::random_values(rng_, static_cast<std::size_t>(n) * width, t(), 2.0f);
      std::vector<float> inv_freq(c.head_dim / 2);
      for (int i = 0; i < c.head_dim / 2; ++i) inv_freq[i] = std::pow(5e5f, -2.0f * i / c.head_dim);
      dev_acts qd(*be, qkv), kd(*be, k), vd(*be, v), out(*be, static_cast<std::size_t>(n) * c.heads * c.head_dim);
      dev_bytes pos_d(*be, pos), slot_d(*be, slots), freq_d(*be, inv_freq), qs_d(*be, q_start), ctx_d(*be, c.ctx),
          table_d(*be, table);
      kernels::attention_batch batch{n, qs_d.as<std::int32_t>(), ctx_d.as<std::int32_t>(), table_d.as<std::int32_t>(),
                                     max_blocks, max_ctx, 1};
      const kernels::kv_layout layout{num_blocks, block_size};
      out.poison();
      be->rope(qd.get_ptr(), n, sh, pos_d.as<std::int32_t>(), freq_d.as<float>(), 1.0f);
      be->kv_write(qd.get_ptr(), n, sh, slot_d.as<std::int32_t>(), layout, kd.get_ptr(), vd.get_ptr());
      be->attention(qd.get_ptr(), sh, batch, layout, kd.get_ptr(), vd.get_ptr(), out.get_ptr());
      kernels::cpu::rope(qkv.data(), n, sh, pos.data(), inv_freq.data(), 1.0f);
      kernels::cpu::kv_write(qkv.data(), n, sh, slots.data(), k.data(), v.data());
      const std::string shape = " h" + std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) + " d" +
                                std::to_string(c.head_dim) + " seqs " + std::to_string(n);
      const std::vector<float> q_dev = qd.get(), k_dev = kd.get(), v_dev = vd.get();
      EXPECT_CLOSE(q_dev, qkv, t(), tag("rope+kv_write+attention qkv" + shape));
      EXPECT_CLOSE(k_dev, k, t(), tag("rope+kv_write+attention k" + shape));
      EXPECT_EQ(v_dev, v) << "rope+kv_write+attention v" << shape;
      // The attention reference reads the roped rows the device wrote (checked just above): a one-ulp
      // difference in a roped bf16 query moves a score over 4000 keys enough to fail the tolerance.
      std::vector<float> ref(static_cast<std::size_t>(n) * c.heads * c.head_dim);
      kernels::attention_batch hb{n, q_start.data(), c.ctx.data(), table.data(), max_blocks, max_ctx, 1};
      kernels::cpu::attention(q_dev.data(), sh, hb, layout, k_dev.data(), v_dev.data(), ref.data());
      EXPECT_CLOSE(out.get(), ref, t(), tag("rope+kv_write+attention out" + shape + (be == b_.get() ? "" : " one split to 1024")));
    }
  }
}

// First index where two results differ in bits (as the floats read back), or -1.
long first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return static_cast<long>(i);
  }
  return -1;
}

// The fused decode prologue (rope + kv_write in the grouped decode kernels) with rope_once on (each
// angle's sincos once a block, shared) and off (one sincos per head and pair, session 3's code): every
// buffer must come out bit for bit the same, and both as the op-by-op CPU twin leaves it. Contexts are
// at most 256 keys, so each sequence is one split and the fused path runs on any GPU; positions go
// past the contexts (to 131071) so the sincos sees large angles, and the attention scaling is not 1.
TEST_P(cuda_ops, rope_once_fused_decode_is_bit_identical) {
  if (t() != dtype::bf16) GTEST_SKIP() << "the fused rope + kv_write decode prologue is bf16 only";
  struct dcase {
    int heads, kv_heads, head_dim;
    std::vector<int> ctx;  // context per sequence, the new token included (≤ 256)
    float scaling;
  };
  std::uniform_int_distribution<int> len(1, 256), far(0, 131071);
  dcase many{32, 8, 64, {}, 1.0f};  // the 1B shape at batch 64 (G 4)
  for (int i = 0; i < 64; ++i) many.ctx.push_back(len(rng_));
  const std::vector<dcase> cases{many, dcase{16, 2, 64, {1, 129, 256}, 1.0f},  // G 8: 288 (head, pair) items
                                 dcase{8, 4, 64, {5, 200}, 0.875f},            // G 2: fewer items than threads
                                 dcase{8, 2, 128, {200, 1, 64}, 1.25f},        // d 128 (vec kernel only)
                                 dcase{8, 4, 128, {17, 256}, 1.0f}};
  struct config {
    const char* name;
    bool tc_decode, wide_decode;
  };
  for (const config& cf : {config{"tc", true, false}, config{"vec", false, false}, config{"vec wide", false, true}}) {
    std::unique_ptr<kernels::backend> be[2];
    for (int once = 0; once < 2; ++once) {
      kernels::cuda_backend_options o;
      o.compute_dtype = t();
      o.tc_decode = cf.tc_decode;
      o.wide_decode = cf.wide_decode;
      o.rope_once = once == 1;
      auto made = kernels::make_cuda_backend(o);
      ASSERT_TRUE(made.ok()) << made.err().message;
      be[once] = std::move(made).value();
    }
    for (const dcase& c : cases) {
      const int n = static_cast<int>(c.ctx.size()), block_size = 16;
      kernels::attn_shape sh{c.heads, c.kv_heads, c.head_dim, 1.0f / std::sqrt(static_cast<float>(c.head_dim)), 0};
      const auto [max_ctx, max_blocks, num_blocks, table, q_start, slots] = make_paged_decode(c.ctx, block_size, rng_);
      // The new token is the last key; its rope position may be far later (odd sequences).
      std::vector<std::int32_t> pos;
      for (int s = 0; s < n; ++s) pos.push_back(s % 2 == 0 ? c.ctx[s] - 1 : far(rng_));
      const std::size_t cache = static_cast<std::size_t>(num_blocks) * block_size * c.kv_heads * c.head_dim;
      const auto k0 = testing::random_values(rng_, cache, t()), v0 = testing::random_values(rng_, cache, t());
      const int width = (c.heads + 2 * c.kv_heads) * c.head_dim;
      const auto qkv0 = testing::random_values(rng_, static_cast<std::size_t>(n) * width, t(), 2.0f);
      std::vector<float> inv_freq(c.head_dim / 2);
      for (int i = 0; i < c.head_dim / 2; ++i) inv_freq[i] = std::pow(5e5f, -2.0f * i / c.head_dim);
      const std::string shape = std::string(" ") + cf.name + " h" + std::to_string(c.heads) + "/" +
                                std::to_string(c.kv_heads) + " d" + std::to_string(c.head_dim) + " seqs " +
                                std::to_string(n);
      // got[once] = {qkv, k cache, v cache, out} as each backend leaves them.
      std::vector<float> got[2][4];
      for (int once = 0; once < 2; ++once) {
        kernels::backend& b = *be[once];
        dev_acts qd(b, qkv0), kd(b, k0), vd(b, v0), out(b, static_cast<std::size_t>(n) * c.heads * c.head_dim);
        dev_bytes pos_d(b, pos), slot_d(b, slots), freq_d(b, inv_freq), qs_d(b, q_start), ctx_d(b, c.ctx),
            table_d(b, table);
        kernels::attention_batch batch{n, qs_d.as<std::int32_t>(), ctx_d.as<std::int32_t>(),
                                       table_d.as<std::int32_t>(), max_blocks, max_ctx, 1};
        const kernels::kv_layout layout{num_blocks, block_size};
        out.poison();
        b.rope(qd.get_ptr(), n, sh, pos_d.as<std::int32_t>(), freq_d.as<float>(), c.scaling);
        b.kv_write(qd.get_ptr(), n, sh, slot_d.as<std::int32_t>(), layout, kd.get_ptr(), vd.get_ptr());
        b.attention(qd.get_ptr(), sh, batch, layout, kd.get_ptr(), vd.get_ptr(), out.get_ptr());
        got[once][0] = qd.get();
        got[once][1] = kd.get();
        got[once][2] = vd.get();
        got[once][3] = out.get();
      }
      const char* what[4] = {"qkv", "k cache", "v cache", "out"};
      for (int w = 0; w < 4; ++w) {
        const long at = first_difference(got[1][w], got[0][w]);
        EXPECT_EQ(at, -1) << "rope_once on vs off, " << what[w] << shape << ": first difference at " << at
                          << ", seed " << testing::test_seed();
      }
      auto qkv = qkv0, k = k0, v = v0;
      kernels::cpu::rope(qkv.data(), n, sh, pos.data(), inv_freq.data(), c.scaling);
      kernels::cpu::kv_write(qkv.data(), n, sh, slots.data(), k.data(), v.data());
      // The attention reference reads the roped rows the device wrote (checked against the CPU rope
      // here), as in rope_kv_write_attention_decode_matches_op_by_op.
      std::vector<float> ref(static_cast<std::size_t>(n) * c.heads * c.head_dim);
      kernels::attention_batch hb{n, q_start.data(), c.ctx.data(), table.data(), max_blocks, max_ctx, 1};
      const kernels::kv_layout layout{num_blocks, block_size};
      kernels::cpu::attention(got[1][0].data(), sh, hb, layout, got[1][1].data(), got[1][2].data(), ref.data());
      EXPECT_CLOSE(got[1][0], qkv, t(), tag("rope_once qkv" + shape));
      EXPECT_CLOSE(got[1][1], k, t(), tag("rope_once k" + shape));
      EXPECT_EQ(got[1][2], v) << "rope_once v" << shape;
      EXPECT_CLOSE(got[1][3], ref, t(), tag("rope_once out" + shape));
    }
  }
}

// decode_gqa_ring_kernel (ring_decode 1 and 2: K/V staged in shared memory, the first chunks requested
// before griddepcontrol.wait in the fused step), the tc kernel with early_decode, and a launch with a
// preferred carveout against decode_gqa_tc_kernel (ring_decode 0): the same chunks per warp and
// arithmetic, so every buffer bit for bit the same, fused (rope -> kv_write -> attention, one split)
// and unfused (attention alone, several splits on long contexts), and the output as the CPU twin's.
// Contexts cross the ring (4 or 8 chunks of 32 keys a block), so the new key lands in a chunk
// requested early (put into its slot by the prologue) or late (read back from the cache); windows,
// group 8 and pages of 7 keys; max_ctx as the executor's recordings pass it (a power of two ≥ 256
// above the real contexts).
TEST_P(cuda_ops, ring_decode_matches_tc_decode_bit_for_bit) {
  if (t() != dtype::bf16) GTEST_SKIP() << "the tensor-core decode kernels are bf16 only";
  struct dcase {
    int heads, kv_heads, window, block_size;
    std::vector<int> ctx;  // context per sequence, the new token included
    bool fused;
  };
  std::uniform_int_distribution<int> len(1, 300), long_len(1, 3000);
  dcase b64{32, 8, 0, 16, {}, true}, b64w{16, 2, 90, 7, {}, true}, split{32, 8, 0, 16, {}, false};
  for (int i = 0; i < 64; ++i) b64.ctx.push_back(len(rng_));
  for (int i = 0; i < 70; ++i) b64w.ctx.push_back(len(rng_));
  for (int i = 0; i < 20; ++i) split.ctx.push_back(long_len(rng_));
  split.ctx.push_back(3000);
  // The last case is a batch-1 step (the default takes the ring kernel only there).
  const std::vector<dcase> cases{b64, b64w, split, dcase{16, 2, 0, 16, {1, 129, 256, 97}, true},
                                 dcase{8, 4, 0, 16, {33, 160, 1}, false}, dcase{32, 8, 0, 16, {200}, true}};
  // The tc kernel first (the reference), then the others.
  struct config {
    int ring;
    bool early;
    int carveout;
  };
  const std::vector<config> configs{{0, false, -1}, {1, false, -1}, {2, false, -1}, {0, true, -1}, {1, false, 100}};
  const int nc = static_cast<int>(configs.size());
  std::vector<std::unique_ptr<kernels::backend>> be;
  for (const config& cf : configs) {
    kernels::cuda_backend_options o;
    o.compute_dtype = t();
    o.ring_decode = cf.ring;
    o.ring_decode_max_seqs = 1 << 30;  // every case on the kernel named, not only batch 1 (the default)
    o.early_decode = cf.early;
    o.decode_carveout = cf.carveout;
    auto made = kernels::make_cuda_backend(o);
    ASSERT_TRUE(made.ok()) << made.err().message;
    be.push_back(std::move(made).value());
  }
  for (const dcase& c : cases) {
    const ring_decode_case rc = make_ring_decode_case(c.ctx, c.heads, c.kv_heads, c.window, c.block_size, t(), rng_);
    const std::string shape = std::string(c.fused ? " fused" : " unfused") + " h" + std::to_string(c.heads) + "/" +
                              std::to_string(c.kv_heads) + " window " + std::to_string(c.window) + " seqs " +
                              std::to_string(rc.rows());
    std::vector<std::array<std::vector<float>, 4>> got(nc);  // {qkv, k cache, v cache, out} of each backend
    for (int ring = 0; ring < nc; ++ring) got[ring] = run_ring_decode_case(*be[ring], rc, c.fused);
    const char* what[4] = {"qkv", "k cache", "v cache", "out"};
    const std::vector<float> ref = ring_decode_reference(rc, got[1]);
    for (int ring = 1; ring < nc; ++ring) {
      const config& cf = configs[ring];
      const std::string name = "ring_decode " + std::to_string(cf.ring) + " early " + std::to_string(cf.early) +
                               " carveout " + std::to_string(cf.carveout);
      for (int w = 0; w < 4; ++w) {
        const long at = first_difference(got[ring][w], got[0][w]);
        EXPECT_EQ(at, -1) << name << " vs the tc kernel, " << what[w] << shape << ": first difference at " << at
                          << ", seed " << testing::test_seed();
      }
      EXPECT_CLOSE(got[ring][3], ref, t(), tag(name + " out" + shape));
    }
  }
}

// decode_fuse_splits (session 31): a step of several splits on decode_gqa_ring_kernel with the rope
// prologue in every split (the new key's split writes it) and the last split to finish merging them,
// against the separate rope_kv, the same splits and the combine launch: every buffer bit for bit the
// same (the same rounding and the combine's one expression), the output as the CPU twin's. Each case
// runs twice on the fused backends, so a done-counter not cleared by its last split shows up as a
// second call that differs. Contexts past one split (max_ctx as the executor's recordings pass it:
// a power of two ≥ 256), the new key early or late in its split's ring, windows, group 8, 1-2 chunks
// a warp in flight (ring_decode 2 and 1).
TEST_P(cuda_ops, fused_split_decode_matches_unfused_bit_for_bit) {
  if (t() != dtype::bf16) GTEST_SKIP() << "the ring decode kernel is bf16 only";
  struct dcase {
    int heads, kv_heads, window, block_size;
    std::vector<int> ctx;  // context per sequence, the new token included
  };
  std::uniform_int_distribution<int> long_len(1, 3000);
  dcase eight{32, 8, 0, 16, {}};
  for (int i = 0; i < 8; ++i) eight.ctx.push_back(long_len(rng_));
  const std::vector<dcase> cases{dcase{32, 8, 0, 16, {700}},  dcase{32, 8, 0, 16, {1000}},
                                 dcase{32, 8, 0, 16, {3000}}, dcase{32, 8, 0, 16, {2049}},
                                 dcase{16, 2, 0, 16, {1, 129, 2000, 97}}, dcase{32, 8, 90, 7, {1500, 20}},
                                 eight};
  struct config {
    int ring;
    bool fuse;
  };
  const std::vector<config> configs{{2, false}, {2, true}, {1, true}};
  std::vector<std::unique_ptr<kernels::backend>> be;
  for (const config& cf : configs) {
    kernels::cuda_backend_options o;
    o.compute_dtype = t();
    o.ring_decode = cf.ring;
    o.ring_decode_max_seqs = 1 << 30;  // the ring kernel at every batch, not only batch 1 (the default)
    o.decode_fuse_splits = cf.fuse;
    auto made = kernels::make_cuda_backend(o);
    ASSERT_TRUE(made.ok()) << made.err().message;
    be.push_back(std::move(made).value());
  }
  for (const dcase& c : cases) {
    const ring_decode_case rc = make_ring_decode_case(c.ctx, c.heads, c.kv_heads, c.window, c.block_size, t(), rng_);
    std::string shape = " h" + std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) + " window " +
                        std::to_string(c.window) + " max_ctx " + std::to_string(rc.max_ctx) + " ctx";
    for (int x : c.ctx) shape += " " + std::to_string(x);
    const auto want = run_ring_decode_case(*be[0], rc, true);
    EXPECT_CLOSE(want[3], ring_decode_reference(rc, want), t(), tag("unfused splits out" + shape));
    const char* what[4] = {"qkv", "k cache", "v cache", "out"};
    for (std::size_t i = 1; i < configs.size(); ++i) {
      for (int call = 0; call < 2; ++call) {
        const auto got = run_ring_decode_case(*be[i], rc, true);
        const std::string name = "fused splits, ring_decode " + std::to_string(configs[i].ring) + ", call " +
                                 std::to_string(call + 1);
        for (int w = 0; w < 4; ++w) {
          const long at = first_difference(got[w], want[w]);
          EXPECT_EQ(at, -1) << name << " vs unfused, " << what[w] << shape << ": first difference at " << at
                            << ", seed " << testing::test_seed();
        }
      }
    }
  }
}

// The decode step's qkv through linear_into_attention: at wgmma_qkv's token counts (the default
// 2..64, above the GEMV's) the wgmma GEMM, then the ring decode kernel it releases early
// (wgmma_qkv_ring_decode); elsewhere linear(). qkv against the CPU linear, the attention output against the CPU attention
// of the GPU's own roped qkv and caches, at the token counts on both sides of the range.
TEST_P(cuda_ops, linear_into_attention_then_decode_matches_cpu) {
  if (t() != dtype::bf16) GTEST_SKIP() << "wgmma_qkv is a bf16 path";
  using q = qkv_decode_step;
  const int heads = q::heads, d = q::d, width = q::width;
  const kernels::attn_shape sh = qkv_decode_step{}.shape();
  auto wh = testing::random_values(rng_, static_cast<std::size_t>(width) * q::hidden, t(), 0.05f);
  kernels::weight w = upload_matrix(wh, width, q::hidden);
  for (int n : {1, 2, 8, 16, 17, 32, 40, 64, 65}) {
    const qkv_decode_step c = make_qkv_decode_step(n, t(), rng_);
    const paged_decode& pd = c.paged;
    const std::string shape = " seqs " + std::to_string(n);
    dev_acts xd(*b_, c.x), qd(*b_, static_cast<std::size_t>(n) * width), kd(*b_, c.k0), vd(*b_, c.v0),
        out(*b_, static_cast<std::size_t>(n) * heads * d);
    dev_bytes pos_d(*b_, c.pos), slot_d(*b_, pd.slots), freq_d(*b_, c.inv_freq), qs_d(*b_, pd.q_start),
        ctx_d(*b_, c.ctx), table_d(*b_, pd.table);
    const kernels::kv_layout layout{pd.num_blocks, q::block_size};
    kernels::attention_batch batch{n, qs_d.as<std::int32_t>(), ctx_d.as<std::int32_t>(), table_d.as<std::int32_t>(),
                                   pd.max_blocks, c.max_ctx, 1};
    qd.poison();
    out.poison();
    b_->linear_into_attention(xd.get_ptr(), n, w, {}, qd.get_ptr());
    const std::vector<float> qkv_lin = qd.get();
    std::vector<float> ref_lin(static_cast<std::size_t>(n) * width);
    kernels::cpu::linear(c.x.data(), n, wh.data(), width, q::hidden, nullptr, ref_lin.data());
    EXPECT_CLOSE(qkv_lin, ref_lin, t(), tag("linear_into_attention" + shape));
    b_->linear_into_attention(xd.get_ptr(), n, w, {}, qd.get_ptr());
    b_->rope(qd.get_ptr(), n, sh, pos_d.as<std::int32_t>(), freq_d.as<float>(), 1.0f);
    b_->kv_write(qd.get_ptr(), n, sh, slot_d.as<std::int32_t>(), layout, kd.get_ptr(), vd.get_ptr());
    b_->attention(qd.get_ptr(), sh, batch, layout, kd.get_ptr(), vd.get_ptr(), out.get_ptr());
    const auto q_after = qd.get(), k_after = kd.get(), v_after = vd.get();
    std::vector<float> ref(static_cast<std::size_t>(n) * heads * d);
    kernels::attention_batch hb{n, pd.q_start.data(), c.ctx.data(), pd.table.data(), pd.max_blocks, c.max_ctx, 1};
    kernels::cpu::attention(q_after.data(), sh, hb, layout, k_after.data(), v_after.data(), ref.data());
    EXPECT_CLOSE(out.get(), ref, t(), tag("attention after linear_into_attention" + shape));
  }
  b_->release(const_cast<void*>(w.data));
}

// wgmma_qkv_slices (session 21): the qkv GEMM's K splits left as f32 slices for the decode attention's
// rope prologue to sum, against the default (the cluster sums them): q, k, v, the caches and the
// attention output must keep every bit. Token counts on both sides of the fused prologue (2 and 8
// with contexts that split the keys, where launch_attention sums the slices with its own kernel
// first), a bias (Qwen2's qkv), and a rope flushed on its own (the slices summed, then rope).
TEST_P(cuda_ops, qkv_slices_into_attention_is_bit_identical) {
  if (t() != dtype::bf16) GTEST_SKIP() << "wgmma_qkv is a bf16 path";
  if (const int major = sm_major(); major != 9) {
    GTEST_SKIP() << "the wgmma GEMM needs sm_90 (this GPU is sm_" << major << "x)";
  }
  using q = qkv_decode_step;
  const int width = q::width;
  const kernels::attn_shape sh = qkv_decode_step{}.shape();
  const auto wh = testing::random_values(rng_, static_cast<std::size_t>(width) * q::hidden, t(), 0.05f);
  std::vector<float> bias(width);
  std::uniform_real_distribution<float> bd(-0.5f, 0.5f);
  for (auto& v : bias) v = bd(rng_);
  for (int n : {2, 8, 17, 33, 64}) {
    for (int variant = 0; variant < 2; ++variant) {  // 1: with the bias, and a rope flushed on its own
      const qkv_decode_step c = make_qkv_decode_step(n, t(), rng_);
      const paged_decode& pd = c.paged;
      std::vector<float> got[2][5];  // [slices][qkv, k, v, out, qkv after a lone rope]
      for (int slices = 0; slices < 2; ++slices) {
        kernels::cuda_backend_options o;
        o.compute_dtype = t();
        o.wgmma_qkv_slices = slices == 1;
        auto made = kernels::make_cuda_backend(o);
        ASSERT_TRUE(made.ok()) << made.err().message;
        b_ = std::move(made).value();
        auto w_copy = wh;
        kernels::weight w = upload_matrix(w_copy, width, q::hidden);
        kernels::weight bw = variant == 1 ? upload_vector(bias) : kernels::weight{};
        dev_acts xd(*b_, c.x), qd(*b_, static_cast<std::size_t>(n) * width), kd(*b_, c.k0), vd(*b_, c.v0),
            out(*b_, static_cast<std::size_t>(n) * q::heads * q::d);
        dev_bytes pos_d(*b_, c.pos), slot_d(*b_, pd.slots), freq_d(*b_, c.inv_freq), qs_d(*b_, pd.q_start),
            ctx_d(*b_, c.ctx), table_d(*b_, pd.table);
        const kernels::kv_layout layout{pd.num_blocks, q::block_size};
        kernels::attention_batch batch{n, qs_d.as<std::int32_t>(), ctx_d.as<std::int32_t>(),
                                       table_d.as<std::int32_t>(), pd.max_blocks, c.max_ctx, 1};
        qd.poison();
        out.poison();
        b_->linear_into_attention(xd.get_ptr(), n, w, bw, qd.get_ptr());
        b_->rope(qd.get_ptr(), n, sh, pos_d.as<std::int32_t>(), freq_d.as<float>(), 1.0f);
        b_->kv_write(qd.get_ptr(), n, sh, slot_d.as<std::int32_t>(), layout, kd.get_ptr(), vd.get_ptr());
        b_->attention(qd.get_ptr(), sh, batch, layout, kd.get_ptr(), vd.get_ptr(), out.get_ptr());
        got[slices][0] = qd.get();
        got[slices][1] = kd.get();
        got[slices][2] = vd.get();
        got[slices][3] = out.get();
        if (variant == 1) {
          qd.poison();
          b_->linear_into_attention(xd.get_ptr(), n, w, bw, qd.get_ptr());
          b_->rope(qd.get_ptr(), n, sh, pos_d.as<std::int32_t>(), freq_d.as<float>(), 1.0f);
          got[slices][4] = qd.get();  // the download flushes the held rope
        }
        b_->release(const_cast<void*>(w.data));
        if (variant == 1) b_->release(const_cast<void*>(bw.data));
      }
      const char* what[5] = {"qkv", "k cache", "v cache", "attention out", "qkv after rope alone"};
      for (int k = 0; k < 5; ++k) {
        ASSERT_EQ(got[1][k].size(), got[0][k].size()) << what[k];
        std::size_t differ = 0, first = 0;
        for (std::size_t i = 0; i < got[0][k].size(); ++i) {
          if (!(got[1][k][i] == got[0][k][i])) {  // NaN poison left anywhere fails too
            if (differ++ == 0) first = i;
          }
        }
        EXPECT_EQ(differ, 0u) << tag(std::string("qkv_slices ") + what[k] + " seqs " + std::to_string(n) +
                                     (variant == 1 ? " bias" : ""))
                              << ": first at " << first;
      }
    }
  }
}

// A decode-sized linear seen first while recording: the default backend times its algorithms then
// (on a side stream, lt_gemm.hpp), and the recording replays with the inputs present at replay time.
TEST_P(cuda_ops, capture_with_linear_tuned_while_recording) {
  if (!b_->can_capture()) GTEST_SKIP() << "backend records nothing";
  for (auto [n, rows, cols] : {std::tuple{40, 256, 512}, {64, 3072, 2048}, {1, 512, 256}}) {
    auto wh = testing::random_values(rng_, static_cast<std::size_t>(rows) * cols, t(), 0.05f);
    kernels::weight w = upload_matrix(wh, rows, cols);
    dev_acts xd(*b_, static_cast<std::size_t>(n) * cols), out(*b_, static_cast<std::size_t>(n) * rows);
    b_->begin_capture();
    b_->linear(xd.get_ptr(), n, w, {}, out.get_ptr());
    const kernels::capture_id id = b_->end_capture();
    ASSERT_NE(id, 0u);
    for (int round = 0; round < 2; ++round) {
      auto x = testing::random_values(rng_, static_cast<std::size_t>(n) * cols, t());
      xd.set(x);
      out.poison();
      b_->replay(id);
      std::vector<float> ref(static_cast<std::size_t>(n) * rows);
      kernels::cpu::linear(x.data(), n, wh.data(), rows, cols, nullptr, ref.data());
      EXPECT_CLOSE(out.get(), ref, t(), tag("replayed tuned linear n" + std::to_string(n)));
    }
    // The same shape again, outside a recording: the choice made while recording.
    auto x = testing::random_values(rng_, static_cast<std::size_t>(n) * cols, t());
    xd.set(x);
    out.poison();
    b_->linear(xd.get_ptr(), n, w, {}, out.get_ptr());
    std::vector<float> ref(static_cast<std::size_t>(n) * rows);
    kernels::cpu::linear(x.data(), n, wh.data(), rows, cols, nullptr, ref.data());
    EXPECT_CLOSE(out.get(), ref, t(), tag("tuned linear n" + std::to_string(n)));
    b_->drop_capture(id);
    b_->release(const_cast<void*>(w.data));
  }
}

// A recorded op sequence replays with the inputs present at replay time.
TEST_P(cuda_ops, capture_and_replay) {
  use_opt_in_paths();  // the GEMV launch (programmatic dependent launch) inside a recording
  if (!b_->can_capture()) GTEST_SKIP() << "backend records nothing";
  const int n = 3, rows = 64, cols = 96;
  auto wh = testing::random_values(rng_, static_cast<std::size_t>(rows) * cols, t(), 0.05f);
  kernels::weight w = upload_matrix(wh, rows, cols);
  dev_acts xd(*b_, static_cast<std::size_t>(n) * cols), out(*b_, static_cast<std::size_t>(n) * rows),
      acc(*b_, static_cast<std::size_t>(n) * rows);
  b_->begin_capture();
  b_->linear(xd.get_ptr(), n, w, {}, out.get_ptr());
  b_->add(acc.get_ptr(), out.get_ptr(), static_cast<std::size_t>(n) * rows);
  const kernels::capture_id id = b_->end_capture();
  ASSERT_NE(id, 0u);
  for (int round = 0; round < 2; ++round) {
    auto x = testing::random_values(rng_, static_cast<std::size_t>(n) * cols, t());
    auto a = testing::random_values(rng_, static_cast<std::size_t>(n) * rows, t());
    xd.set(x);
    acc.set(a);
    b_->replay(id);
    std::vector<float> ref(static_cast<std::size_t>(n) * rows);
    kernels::cpu::linear(x.data(), n, wh.data(), rows, cols, nullptr, ref.data());
    EXPECT_CLOSE(out.get(), ref, t(), tag("replayed linear"));
    for (std::size_t i = 0; i < ref.size(); ++i) a[i] += testing::representable(t(), ref[i]);
    EXPECT_CLOSE(acc.get(), a, t(), tag("replayed add"));
  }
  b_->drop_capture(id);
  b_->release(const_cast<void*>(w.data));
}

INSTANTIATE_TEST_SUITE_P(dtypes, cuda_ops, ::testing::Values(dtype::f32, dtype::bf16),
                         [](const auto& info) { return name_of(info.param); });

}  // namespace
}  // namespace conveyor
