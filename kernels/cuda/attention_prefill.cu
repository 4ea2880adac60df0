// Prefill attention on tensor cores (bf16, head_dim 64 or 128), FlashAttention-2 on mma.sync m16n8k16
// over the paged KV cache (layout contract in backend.hpp); attention.cu dispatches here.
// - prefill_tc_kernel: 4 warps of one head per block, 64-row Q tiles, 64-key K/V tiles in padded
//   shared memory (V through ldmatrix.trans), the next tile prefetched into registers.
// - prefill_gqa_tc_kernel (tune.gqa_prefill): 8 warps, one block per KV head's query group (K/V tiles
//   read once per group), cp.async-pipelined K/V tiles.
// TODO(perf): wgmma/TMA prefill tiles.
#include <atomic>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "attention_common.cuh"
#include "device_types.cuh"
#include "launch.hpp"

namespace conveyor::kernels::cuda {

namespace {

using namespace attention_detail;

/// A warp's m16n8k16 A fragments of its query rows r_a and r_b = r_a + 8 (lane: g = lane / 4,
/// q = lane % 4), straight from qkv's row-major bf16 rows; rows past q_len read the last row (their
/// results are never stored). Both prefill kernels start so.
template <int D>
__device__ __forceinline__ void load_q_fragments(std::uint32_t (&qf)[D / 16][4], const __nv_bfloat16* qkv, int q0,
                                                 int r_a, int r_b, int q_len, int width, int h, int q) {
  const __nv_bfloat16* qa = qkv + static_cast<std::size_t>(q0 + min(r_a, q_len - 1)) * width + h * D;
  const __nv_bfloat16* qb = qkv + static_cast<std::size_t>(q0 + min(r_b, q_len - 1)) * width + h * D;
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    const int d = ks * 16 + 2 * q;
    qf[ks][0] = *reinterpret_cast<const std::uint32_t*>(qa + d);
    qf[ks][1] = *reinterpret_cast<const std::uint32_t*>(qb + d);
    qf[ks][2] = *reinterpret_cast<const std::uint32_t*>(qa + d + 8);
    qf[ks][3] = *reinterpret_cast<const std::uint32_t*>(qb + d + 8);
  }
}
/// Rows r_a / r_b of a warp's O fragments times their softmax rescale factors.
template <int D>
__device__ __forceinline__ void rescale_rows(float (&o)[D / 8][4], float alpha_a, float alpha_b) {
#pragma unroll
  for (int i = 0; i < D / 8; ++i) {
    o[i][0] *= alpha_a;
    o[i][1] *= alpha_a;
    o[i][2] *= alpha_b;
    o[i][3] *= alpha_b;
  }
}

/// O += P V for a warp's 16 rows over a tile of KT keys: the S accumulator layout is P's A-fragment
/// layout (two 8-key blocks per 16-key step), rounded to bf16; V's B fragments come transposed by
/// ldmatrix from the tile in shared memory (rows of LD elements).
template <int D, int KT>
__device__ __forceinline__ void accumulate_pv(float (&o)[D / 8][4], const float (&s)[KT / 8][4],
                                              const __nv_bfloat16* v_tile, int LD, int lane) {
  const int mi = lane / 8;
#pragma unroll
  for (int kk = 0; kk < KT / 16; ++kk) {
    const std::uint32_t a0 = pack_bf16x2(s[2 * kk][0], s[2 * kk][1]);
    const std::uint32_t a1 = pack_bf16x2(s[2 * kk][2], s[2 * kk][3]);
    const std::uint32_t a2 = pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    const std::uint32_t a3 = pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    const __nv_bfloat16* vrow = v_tile + (kk * 16 + (mi & 1) * 8 + lane % 8) * LD + (mi >> 1) * 8;
#pragma unroll
    for (int dn = 0; dn < D / 8; dn += 2) {
      std::uint32_t b[4];
      ldmatrix_x4_trans(b, vrow + dn * 8);
      mma16816(o[dn], a0, a1, a2, a3, b[0], b[1]);
      mma16816(o[dn + 1], a0, a1, a2, a3, b[2], b[3]);
    }
  }
}

/// The end of both prefill kernels: each row's softmax denominator is summed over its quad (every
/// lane held its own columns' share), and rows r_a / r_b (when they are real rows) are stored as
/// bf16, O / l, at their head's D columns of `out`.
template <int D>
__device__ __forceinline__ void store_normalised_rows(const float (&o)[D / 8][4], float l_a, float l_b, bool row_a,
                                                      bool row_b, __nv_bfloat16* out, int q0, int r_a, int r_b,
                                                      int heads, int h, int q) {
#pragma unroll
  for (int o2 = 1; o2 <= 2; o2 <<= 1) {
    l_a += __shfl_xor_sync(0xffffffffu, l_a, o2);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, o2);
  }
  const std::size_t out_stride = static_cast<std::size_t>(heads) * D;
  if (row_a) {
    const float inv = 1.0f / l_a;
    __nv_bfloat16* dst = out + static_cast<std::size_t>(q0 + r_a) * out_stride + h * D + 2 * q;
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      *reinterpret_cast<std::uint32_t*>(dst + i * 8) = pack_bf16x2(o[i][0] * inv, o[i][1] * inv);
    }
  }
  if (row_b) {
    const float inv = 1.0f / l_b;
    __nv_bfloat16* dst = out + static_cast<std::size_t>(q0 + r_b) * out_stride + h * D + 2 * q;
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      *reinterpret_cast<std::uint32_t*>(dst + i * 8) = pack_bf16x2(o[i][2] * inv, o[i][3] * inv);
    }
  }
}

constexpr int tc_q_tile = 64;  // query rows per block (4 warps × 16)
constexpr int tc_key_tile = 64;

// FlashAttention-2 with mma.sync m16n8k16 (bf16 in, f32 accumulate): grid (q tiles, heads, seqs),
// block 128 threads. A warp owns 16 query rows; K and V tiles of 64 keys are staged in shared memory
// with rows padded by 16 bytes (conflict-free fragment loads; V is read transposed by ldmatrix).
// S = Q Kᵀ and the online softmax stay in registers; P is rounded to bf16 for P·V, as FlashAttention
// does. Padding rows are never written.
template <int D>
__global__ void __launch_bounds__(block_threads, D == 64 ? 3 : 1) prefill_tc_kernel(
    const __nv_bfloat16* qkv, int heads, int kv_heads, float scale, int window, const std::int32_t* q_start,
    const std::int32_t* ctx_len, const std::int32_t* block_table, int table_stride, int block_size,
    const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache, __nv_bfloat16* out) {
  constexpr int LD = D + 8;
  __shared__ __align__(16) __nv_bfloat16 k_s[tc_key_tile * LD];
  __shared__ __align__(16) __nv_bfloat16 v_s[tc_key_tile * LD];
  const int seq = blockIdx.z, h = blockIdx.y;
  const int q0 = q_start[seq], q_len = q_start[seq + 1] - q0;
  const int tile_row0 = (gridDim.x - 1 - blockIdx.x) * tc_q_tile;  // late (long) tiles first
  if (tile_row0 >= q_len) return;
  const int ctx = ctx_len[seq], first_pos = ctx - q_len;
  const int kvh = h / (heads / kv_heads);
  const int width = (heads + 2 * kv_heads) * D;
  const std::int32_t* table = block_table + static_cast<std::size_t>(seq) * table_stride;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;

  const int r_a = tile_row0 + warp * 16 + g, r_b = r_a + 8;
  const int pos_a = r_a < q_len ? first_pos + r_a : -1;
  const int pos_b = r_b < q_len ? first_pos + r_b : -1;
  const int lo_a = window > 0 ? pos_a - window + 1 : 0;
  const int lo_b = window > 0 ? pos_b - window + 1 : 0;

  std::uint32_t qf[D / 16][4];
  load_q_fragments<D>(qf, qkv, q0, r_a, r_b, q_len, width, h, q);
  float o[D / 8][4];
  zero_fragments<D>(o);
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;
  const float sl2 = scale * 1.4426950408889634f;  // exp(x) = exp2(x log2 e)

  const int last_row = min(q_len, tile_row0 + tc_q_tile) - 1;
  const int last_pos = first_pos + last_row;
  const int first_key = window > 0 ? max(0, first_pos + tile_row0 - window + 1) : 0;
  // The next K/V tile is loaded into registers while the current one is computed on, so the loads'
  // latency overlaps the tensor-core work instead of stalling every tile.
  constexpr int per_thread = tc_key_tile * (D / 8) / block_threads;
  uint4 k_next[per_thread], v_next[per_thread];
  auto load_tile = [&](int k0) {
#pragma unroll
    for (int i = 0; i < per_thread; ++i) {
      const int idx = threadIdx.x + i * block_threads;
      const int r = idx / (D / 8), c = idx % (D / 8), j = k0 + r;
      k_next[i] = make_uint4(0, 0, 0, 0);  // zeros: 0 · V stays finite
      v_next[i] = make_uint4(0, 0, 0, 0);
      if (j <= last_pos) {
        const std::size_t at = cache_index(table, block_size, j, kv_heads, kvh, D) + c * 8;
        k_next[i] = *reinterpret_cast<const uint4*>(k_cache + at);
        v_next[i] = *reinterpret_cast<const uint4*>(v_cache + at);
      }
    }
  };
  load_tile(first_key);
  for (int k0 = first_key; k0 <= last_pos; k0 += tc_key_tile) {
    __syncthreads();  // the previous tile is consumed
#pragma unroll
    for (int i = 0; i < per_thread; ++i) {
      const int idx = threadIdx.x + i * block_threads;
      const int r = idx / (D / 8), c = idx % (D / 8);
      *reinterpret_cast<uint4*>(k_s + r * LD + c * 8) = k_next[i];
      *reinterpret_cast<uint4*>(v_s + r * LD + c * 8) = v_next[i];
    }
    __syncthreads();
    if (k0 + tc_key_tile <= last_pos) load_tile(k0 + tc_key_tile);

    float s[tc_key_tile / 8][4];
#pragma unroll
    for (int nb = 0; nb < tc_key_tile / 8; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nb][e] = 0.0f;
      const __nv_bfloat16* krow = k_s + (nb * 8 + g) * LD + 2 * q;
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        const std::uint32_t b0 = *reinterpret_cast<const std::uint32_t*>(krow + ks * 16);
        const std::uint32_t b1 = *reinterpret_cast<const std::uint32_t*>(krow + ks * 16 + 8);
        mma16816(s[nb], qf[ks][0], qf[ks][1], qf[ks][2], qf[ks][3], b0, b1);
      }
    }
    // Mask, then the online softmax of rows a (e = 0, 1) and b (e = 2, 3); a quad of lanes shares a row.
    // Below the diagonal (most tiles) every key is visible to all 16 rows: no per-element test.
    const int warp_first_pos = first_pos + tile_row0 + warp * 16;
    const bool all_visible = window == 0 && tile_row0 + warp * 16 + 15 < q_len && k0 + tc_key_tile - 1 <= warp_first_pos;
    float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
    for (int nb = 0; nb < tc_key_tile / 8; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const bool row_b = e >= 2;
        if (all_visible) {
          s[nb][e] *= sl2;
        } else {
          const int j = k0 + nb * 8 + 2 * q + (e & 1);
          const int p = row_b ? pos_b : pos_a, lo = row_b ? lo_b : lo_a;
          const bool visible = p >= 0 && j <= p && j >= lo;
          s[nb][e] = visible ? s[nb][e] * sl2 : -INFINITY;
        }
        if (row_b) {
          mx_b = fmaxf(mx_b, s[nb][e]);
        } else {
          mx_a = fmaxf(mx_a, s[nb][e]);
        }
      }
    }
#pragma unroll
    for (int o2 = 1; o2 <= 2; o2 <<= 1) {
      mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, o2));
      mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, o2));
    }
    const float mn_a = fmaxf(m_a, mx_a), mn_b = fmaxf(m_b, mx_b);
    const float base_a = mn_a == -INFINITY ? 0.0f : mn_a, base_b = mn_b == -INFINITY ? 0.0f : mn_b;
    const float alpha_a = exp2f(m_a - base_a), alpha_b = exp2f(m_b - base_b);
    m_a = mn_a;
    m_b = mn_b;
    float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
    for (int nb = 0; nb < tc_key_tile / 8; ++nb) {
      s[nb][0] = exp2f(s[nb][0] - base_a);
      s[nb][1] = exp2f(s[nb][1] - base_a);
      s[nb][2] = exp2f(s[nb][2] - base_b);
      s[nb][3] = exp2f(s[nb][3] - base_b);
      sum_a += s[nb][0] + s[nb][1];
      sum_b += s[nb][2] + s[nb][3];
    }
    l_a = l_a * alpha_a + sum_a;  // this lane's columns only; the quad is summed at the end
    l_b = l_b * alpha_b + sum_b;
    rescale_rows<D>(o, alpha_a, alpha_b);
    accumulate_pv<D, tc_key_tile>(o, s, v_s, LD, lane);
  }
  store_normalised_rows<D>(o, l_a, l_b, pos_a >= 0, pos_b >= 0, out, q0, r_a, r_b, heads, h, q);
}

// --- prefill v2 (tune.gqa_prefill): one block per (query tile, KV head) serving the group ---
constexpr int pf_key_tile = 64;
constexpr int pf_stages = 3;
template <int D>
constexpr std::size_t pf_smem_bytes = static_cast<std::size_t>(pf_stages) * 2 * pf_key_tile * (D + 8) * 2;

__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const void* smem_row) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// 2^x on the special-function unit (exp2f adds range fix-ups for denormal results; those are 0 here).
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// FlashAttention-2 on mma.sync m16n8k16 like prefill_tc_kernel, with the work laid out so that K/V
// tiles are read once per query-head group and their loads overlap the tensor-core work:
// - 1-D grid, one block per (query tile, KV head, sequence), the tile index slowest and the last
//   (longest causal) tiles first, so the short tiles fill the tail of the last wave.
// - W = 8 warps; warp w serves query head kvh·G + w / U for 16 rows (U = W / G warps a head), so the
//   block covers R = 16·U rows of all G heads of the group and each K/V tile in shared memory
//   feeds 8 warps (prefill_tc_kernel: 4 warps of one head, so a group read each tile 4 times).
// - the page of a key by shift and mask where the page size is a power of two (block_shift ≥ 0).
// - K/V tiles of 64 keys, pf_stages deep, filled by cp.async (rows past the block's last key
//   zero-filled): one barrier a tile, loads two tiles ahead.
// - K's B fragments by ldmatrix (one instruction per two mmas), V's by ldmatrix.trans.
// - a warp skips the tiles none of its rows sees (above its diagonal, before its window) and masks
//   only the tiles that cross its diagonal or window; exp2 with log2(e)·scale folded into one FFMA;
//   O is rescaled only when some row's max moved.
// P is rounded to bf16 for P·V, as in prefill_tc_kernel.
template <int D, int G, int W>
__global__ void __launch_bounds__(W * 32, D == 64 ? 16 / W : 1) prefill_gqa_tc_kernel(
    const __nv_bfloat16* qkv, int heads, int kv_heads, float scale, int window, const std::int32_t* q_start,
    const std::int32_t* ctx_len, const std::int32_t* block_table, int table_stride, int block_size,
    int block_shift, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache, __nv_bfloat16* out,
    int num_tiles) {
  constexpr int LD = D + 8, KT = pf_key_tile, U = W / G, R = 16 * U, TILE = KT * LD, NT = W * 32;
  static_assert(W % G == 0, "the group must divide the block's warps");
  extern __shared__ __align__(16) __nv_bfloat16 pf_smem[];  // [stage][K, V][KT][LD]
  const int units = static_cast<int>(gridDim.x) / num_tiles;  // KV heads × sequences
  const int tile = num_tiles - 1 - static_cast<int>(blockIdx.x) / units;
  const int rem = static_cast<int>(blockIdx.x) % units, kvh = rem % kv_heads, seq = rem / kv_heads;
  const int q0 = q_start[seq], q_len = q_start[seq + 1] - q0, t0 = tile * R;
  if (t0 >= q_len) return;
  const int ctx = ctx_len[seq], first_pos = ctx - q_len;
  const int width = (heads + 2 * kv_heads) * D;
  const std::int32_t* table = block_table + static_cast<std::size_t>(seq) * table_stride;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int h = kvh * G + warp / U;
  const int wr0 = t0 + (warp % U) * 16;  // the warp's first row
  const int r_a = wr0 + g, r_b = r_a + 8;
  const int pos_a = r_a < q_len ? first_pos + r_a : -1;
  const int pos_b = r_b < q_len ? first_pos + r_b : -1;
  const int lo_a = window > 0 ? pos_a - window + 1 : 0;
  const int lo_b = window > 0 ? pos_b - window + 1 : 0;
  const bool warp_live = wr0 < q_len;
  const int w_first = first_pos + wr0, w_last = first_pos + min(q_len - 1, wr0 + 15);
  const int w_lo = window > 0 ? w_first - window + 1 : 0;  // no row of the warp sees keys below

  const int last_pos = first_pos + min(q_len, t0 + R) - 1;
  const int first_key = window > 0 ? max(0, first_pos + t0 - window + 1) : 0;
  const int n_tiles = (last_pos - first_key) / KT + 1;

  auto load_tile = [&](int n) {
    const int k0 = first_key + n * KT;
    __nv_bfloat16* ks = pf_smem + (n % pf_stages) * 2 * TILE;
    __nv_bfloat16* vs = ks + TILE;
#pragma unroll
    for (int i = 0; i < KT * (D / 8) / NT; ++i) {
      const int idx = threadIdx.x + i * NT;
      const int r = idx / (D / 8), c = idx % (D / 8), j = k0 + r;
      const bool valid = j <= last_pos;
      // Shift and mask instead of cache_index's integer division: 92 → 87 µs at the 1B shape.
      const int page = block_shift >= 0 ? j >> block_shift : j / block_size;
      const int in_page = block_shift >= 0 ? j & (block_size - 1) : j - page * block_size;
      const std::size_t slot = static_cast<std::size_t>(valid ? table[page] : 0) * block_size + in_page;
      const std::size_t at = valid ? (slot * kv_heads + kvh) * D + c * 8 : 0;
      cp_async16(ks + r * LD + c * 8, k_cache + at, valid);
      cp_async16(vs + r * LD + c * 8, v_cache + at, valid);
    }
  };
  load_tile(0);
  asm volatile("cp.async.commit_group;\n" ::);
  if (n_tiles > 1) load_tile(1);
  asm volatile("cp.async.commit_group;\n" ::);

  std::uint32_t qf[D / 16][4];
  load_q_fragments<D>(qf, qkv, q0, r_a, r_b, q_len, width, h, q);
  float o[D / 8][4];
  zero_fragments<D>(o);
  // m: the rows' running max of the raw scores; l: this lane's columns only until the end.
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;
  const float sl2 = scale * 1.4426950408889634f;  // exp(x·scale) = 2^(x·scale·log2 e)
  const int mi = lane / 8;

  for (int n = 0; n < n_tiles; ++n) {
    asm volatile("cp.async.wait_group 1;\n" ::: "memory");  // this thread's pieces of tile n landed
    __syncthreads();  // everyone's pieces of tile n landed; tile n - 1 is consumed by every warp
    if (n + 2 < n_tiles) load_tile(n + 2);  // into tile n - 1's stage
    asm volatile("cp.async.commit_group;\n" ::);
    const int k0 = first_key + n * KT;
    if (!warp_live || k0 > w_last || k0 + KT - 1 < w_lo) continue;
    const __nv_bfloat16* ks = pf_smem + (n % pf_stages) * 2 * TILE;
    const __nv_bfloat16* vs = ks + TILE;

    float s[KT / 8][4];
#pragma unroll
    for (int nb = 0; nb < KT / 8; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nb][e] = 0.0f;
      // Matrices 0-3: dims c·32 + 0/8/16/24 of keys nb·8 + 0..7: b0, b1 of k-steps 2c and 2c + 1.
      const __nv_bfloat16* krow = ks + (nb * 8 + lane % 8) * LD + mi * 8;
#pragma unroll
      for (int c = 0; c < D / 32; ++c) {
        std::uint32_t b[4];
        ldmatrix_x4(b, krow + c * 32);
        mma16816(s[nb], qf[2 * c][0], qf[2 * c][1], qf[2 * c][2], qf[2 * c][3], b[0], b[1]);
        mma16816(s[nb], qf[2 * c + 1][0], qf[2 * c + 1][1], qf[2 * c + 1][2], qf[2 * c + 1][3], b[2], b[3]);
      }
    }
    // Every key of the tile is visible to all 16 rows below the warp's diagonal (most tiles).
    const bool all_visible = window == 0 && wr0 + 15 < q_len && k0 + KT - 1 <= w_first;
    if (!all_visible) {
#pragma unroll
      for (int nb = 0; nb < KT / 8; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int j = k0 + nb * 8 + 2 * q + (e & 1);
          const int p = e >= 2 ? pos_b : pos_a, lo = e >= 2 ? lo_b : lo_a;
          if (!(p >= 0 && j <= p && j >= lo)) s[nb][e] = -INFINITY;
        }
      }
    }
    float mx_a = m_a, mx_b = m_b;
#pragma unroll
    for (int nb = 0; nb < KT / 8; ++nb) {
      mx_a = fmaxf(mx_a, fmaxf(s[nb][0], s[nb][1]));
      mx_b = fmaxf(mx_b, fmaxf(s[nb][2], s[nb][3]));
    }
#pragma unroll
    for (int o2 = 1; o2 <= 2; o2 <<= 1) {
      mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, o2));
      mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, o2));
    }
    // base: the new max in log2 units (0 while a row has seen no key: its p are then all 0).
    const float base_a = mx_a == -INFINITY ? 0.0f : mx_a * sl2, base_b = mx_b == -INFINITY ? 0.0f : mx_b * sl2;
    const float alpha_a = ex2(m_a * sl2 - base_a), alpha_b = ex2(m_b * sl2 - base_b);
    const bool moved = mx_a != m_a || mx_b != m_b;
    m_a = mx_a;
    m_b = mx_b;
    float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
    for (int nb = 0; nb < KT / 8; ++nb) {
      s[nb][0] = ex2(fmaf(s[nb][0], sl2, -base_a));
      s[nb][1] = ex2(fmaf(s[nb][1], sl2, -base_a));
      s[nb][2] = ex2(fmaf(s[nb][2], sl2, -base_b));
      s[nb][3] = ex2(fmaf(s[nb][3], sl2, -base_b));
      sum_a += s[nb][0] + s[nb][1];
      sum_b += s[nb][2] + s[nb][3];
    }
    l_a = l_a * alpha_a + sum_a;
    l_b = l_b * alpha_b + sum_b;
    if (__any_sync(0xffffffffu, moved)) rescale_rows<D>(o, alpha_a, alpha_b);
    accumulate_pv<D, KT>(o, s, vs, LD, lane);
  }
  asm volatile("cp.async.wait_all;\n" ::: "memory");
  store_normalised_rows<D>(o, l_a, l_b, pos_a >= 0, pos_b >= 0, out, q0, r_a, r_b, heads, h, q);
}

template <int D, int G, int W>
void launch_prefill_gqa(const __nv_bfloat16* qkv, const attn_shape& sh, const attention_batch& b,
                        const kv_layout& layout, const __nv_bfloat16* k, const __nv_bfloat16* v, __nv_bfloat16* out,
                        cudaStream_t s) {
  constexpr int R = 16 * (W / G);
  const int tiles = (b.max_q_len + R - 1) / R;
  constexpr std::size_t smem = pf_smem_bytes<D>;
  // The limit is per device: raised once for each (bit per device ordinal; past 63, at every launch).
  static std::atomic<unsigned long long> raised{0};
  int dev = 0;
  CONVEYOR_CUDA_CHECK(cudaGetDevice(&dev));
  const unsigned long long bit = dev < 64 ? 1ull << dev : 0ull;
  if (bit == 0 || (raised.load(std::memory_order_relaxed) & bit) == 0) {
    CONVEYOR_CUDA_CHECK(cudaFuncSetAttribute(prefill_gqa_tc_kernel<D, G, W>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    raised.fetch_or(bit, std::memory_order_relaxed);
  }
  int shift = -1;
  for (int i = 0; i < 31; ++i) {
    if ((1 << i) == layout.block_size) shift = i;
  }
  const unsigned blocks = static_cast<unsigned>(tiles) * sh.num_kv_heads * b.num_seqs;
  prefill_gqa_tc_kernel<D, G, W><<<blocks, W * 32, smem, s>>>(
      qkv, sh.num_heads, sh.num_kv_heads, sh.scale, sh.sliding_window, b.q_start, b.ctx_len, b.block_table,
      b.max_blocks_per_seq, layout.block_size, shift, k, v, out, tiles);
  CONVEYOR_CUDA_LAUNCHED("attention prefill gqa tc");
}

/// The v2 prefill where it applies (bf16, head_dim 64/128, group 1/2/4/8); false elsewhere.
bool try_prefill_gqa(const __nv_bfloat16* qkv, const attn_shape& sh, const attention_batch& b,
                     const kv_layout& layout, const __nv_bfloat16* k, const __nv_bfloat16* v, __nv_bfloat16* out,
                     cudaStream_t s) {
  const int group = sh.num_heads / sh.num_kv_heads;
  auto go = [&](auto d) -> bool {
    constexpr int D = decltype(d)::value;
    // 8 warps a block: 4 (4 blocks an SM) and 16 (1) measured 2-7% slower at the 1B shape (session 4).
    switch (group) {
      case 1: launch_prefill_gqa<D, 1, 8>(qkv, sh, b, layout, k, v, out, s); return true;
      case 2: launch_prefill_gqa<D, 2, 8>(qkv, sh, b, layout, k, v, out, s); return true;
      case 4: launch_prefill_gqa<D, 4, 8>(qkv, sh, b, layout, k, v, out, s); return true;
      case 8: launch_prefill_gqa<D, 8, 8>(qkv, sh, b, layout, k, v, out, s); return true;
      default: return false;
    }
  };
  if (sh.head_dim == 64) return go(std::integral_constant<int, 64>{});
  if (sh.head_dim == 128) return go(std::integral_constant<int, 128>{});
  return false;
}

}  // namespace

namespace attention_detail {

void launch_prefill_tc(const __nv_bfloat16* qkv, const attn_shape& sh, const attention_batch& b,
                       const kv_layout& layout, const __nv_bfloat16* k, const __nv_bfloat16* v, __nv_bfloat16* out,
                       bool gqa, cudaStream_t s) {
  if (gqa && try_prefill_gqa(qkv, sh, b, layout, k, v, out, s)) return;
  const dim3 grid((b.max_q_len + tc_q_tile - 1) / tc_q_tile, sh.num_heads, b.num_seqs);
  if (sh.head_dim == 64) {
    prefill_tc_kernel<64><<<grid, block_threads, 0, s>>>(qkv, sh.num_heads, sh.num_kv_heads, sh.scale,
                                                         sh.sliding_window, b.q_start, b.ctx_len, b.block_table,
                                                         b.max_blocks_per_seq, layout.block_size, k, v, out);
  } else {
    prefill_tc_kernel<128><<<grid, block_threads, 0, s>>>(qkv, sh.num_heads, sh.num_kv_heads, sh.scale,
                                                          sh.sliding_window, b.q_start, b.ctx_len, b.block_table,
                                                          b.max_blocks_per_seq, layout.block_size, k, v, out);
  }
  CONVEYOR_CUDA_LAUNCHED("attention prefill tc");
}

}  // namespace attention_detail

}  // namespace conveyor::kernels::cuda
