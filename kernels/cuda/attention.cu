// Attention over the paged KV cache (layout contract in backend.hpp).
// - prefill_kernel: FlashAttention-style. A block owns BQ query rows of one head; K/V tiles of 32 keys
//   are staged in shared memory and folded in with an online softmax, so no T×T matrix exists.
// - decode_kernel + combine_kernel: flash-decoding. With one query row per sequence a block per
//   (sequence, head) leaves the GPU idle on long contexts, so the keys are split across blocks that
//   each write (max, sum, unnormalised output) and a second kernel merges the splits.
// - decode_gqa_kernel: flash-decoding with one block per KV head serving its whole query-head group.
// - decode_gqa_tc_kernel: the grouped decode on tensor cores (mma.sync, bf16, head_dim 64).
// The plain kernels compute in float32 on CUDA cores; they serve f32 and other head sizes and groups.
// The tensor-core prefill kernels live in attention_prefill.cu; what both files use, in
// attention_common.cuh.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <type_traits>
#include <utility>

#include "attention_common.cuh"
#include "device_types.cuh"
#include "launch.hpp"
#include "linear_epilogue.cuh"

namespace conveyor::kernels::cuda {

namespace {

using namespace attention_detail;

constexpr int key_tile = 32;
constexpr int rows_per_warp = 8;
constexpr int q_tile = warps * rows_per_warp;

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}


// exp(a - b) that is 0 when a is -inf (also when both are: a fully masked state contributes nothing).
__device__ __forceinline__ float exp_diff(float a, float b) { return a == -INFINITY ? 0.0f : expf(a - b); }

// grid (q tiles, heads, seqs), block 128 threads; dynamic shared memory: Q [q_tile][D],
// K [key_tile][D + 1] (padded: lane j reads row j, conflict-free), V [key_tile][D].
template <class T, int DC>
__global__ void __launch_bounds__(block_threads) prefill_kernel(
    const T* qkv, int heads, int kv_heads, int head_dim, float scale, int window, const std::int32_t* q_start,
    const std::int32_t* ctx_len, const std::int32_t* block_table, int table_stride, int block_size,
    const T* k_cache, const T* v_cache, T* out) {
  extern __shared__ float smem[];
  const int D = head_dim;
  float* q_s = smem;
  float* k_s = q_s + q_tile * D;
  float* v_s = k_s + key_tile * (D + 1);

  const int seq = blockIdx.z, h = blockIdx.y;
  const int q0 = q_start[seq], q_len = q_start[seq + 1] - q0;
  const int tile_row0 = blockIdx.x * q_tile;
  if (tile_row0 >= q_len) return;
  const int ctx = ctx_len[seq];
  const int first_pos = ctx - q_len;  // position of query row 0 of the sequence
  const int rows = min(q_tile, q_len - tile_row0);
  const int kvh = h / (heads / kv_heads);
  const int width = (heads + 2 * kv_heads) * D;
  const std::int32_t* table = block_table + static_cast<std::size_t>(seq) * table_stride;

  for (int idx = threadIdx.x; idx < q_tile * D; idx += blockDim.x) {
    const int r = idx / D, d = idx % D;
    q_s[idx] = r < rows ? to_f32(qkv[static_cast<std::size_t>(q0 + tile_row0 + r) * width + h * D + d]) * scale
                        : 0.0f;
  }

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int pos[rows_per_warp], lo[rows_per_warp];
  float m[rows_per_warp], l[rows_per_warp], o[rows_per_warp][DC];
#pragma unroll
  for (int r = 0; r < rows_per_warp; ++r) {
    const int row = warp * rows_per_warp + r;
    pos[r] = row < rows ? first_pos + tile_row0 + row : -1;  // -1: no keys, row not written
    lo[r] = window > 0 ? max(0, pos[r] - window + 1) : 0;
    m[r] = -INFINITY;
    l[r] = 0.0f;
#pragma unroll
    for (int c = 0; c < DC; ++c) o[r][c] = 0.0f;
  }
  const int last_pos = first_pos + tile_row0 + rows - 1;
  const int first_key = window > 0 ? max(0, first_pos + tile_row0 - window + 1) : 0;

  for (int k0 = first_key; k0 <= last_pos; k0 += key_tile) {
    __syncthreads();  // previous tile fully consumed (and, the first time, Q stored)
    for (int idx = threadIdx.x; idx < key_tile * D; idx += blockDim.x) {
      const int jj = idx / D, d = idx % D, j = k0 + jj;
      float kv = 0.0f, vv = 0.0f;
      if (j <= last_pos) {
        const std::size_t at = cache_index(table, block_size, j, kv_heads, kvh, D) + d;
        kv = to_f32(k_cache[at]);
        vv = to_f32(v_cache[at]);
      }
      k_s[jj * (D + 1) + d] = kv;
      v_s[jj * D + d] = vv;
    }
    __syncthreads();

    const int j = k0 + lane;
    float s[rows_per_warp];
#pragma unroll
    for (int r = 0; r < rows_per_warp; ++r) s[r] = 0.0f;
    for (int d = 0; d < D; ++d) {
      const float kd = k_s[lane * (D + 1) + d];
#pragma unroll
      for (int r = 0; r < rows_per_warp; ++r) s[r] += q_s[(warp * rows_per_warp + r) * D + d] * kd;
    }
#pragma unroll
    for (int r = 0; r < rows_per_warp; ++r) {
      if (j < lo[r] || j > pos[r]) s[r] = -INFINITY;
      const float m_new = fmaxf(m[r], warp_max(s[r]));
      if (m_new == -INFINITY) continue;  // warp-uniform: nothing visible to this row yet
      const float alpha = exp_diff(m[r], m_new);
      const float p = exp_diff(s[r], m_new);
      l[r] = l[r] * alpha + warp_sum(p);
      m[r] = m_new;
#pragma unroll
      for (int c = 0; c < DC; ++c) o[r][c] *= alpha;
      s[r] = p;
    }
    for (int jj = 0; jj < key_tile; ++jj) {
#pragma unroll
      for (int r = 0; r < rows_per_warp; ++r) {
        const float p = __shfl_sync(0xffffffffu, s[r], jj);
        if (m[r] == -INFINITY) continue;
#pragma unroll
        for (int c = 0; c < DC; ++c) {
          const int d = lane + 32 * c;
          if (d < D) o[r][c] += p * v_s[jj * D + d];
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < rows_per_warp; ++r) {
    if (pos[r] < 0) continue;
    const float inv = 1.0f / l[r];
    T* dst = out + static_cast<std::size_t>(q0 + tile_row0 + warp * rows_per_warp + r) * heads * D + h * D;
#pragma unroll
    for (int c = 0; c < DC; ++c) {
      const int d = lane + 32 * c;
      if (d < D) dst[d] = from_f32<T>(o[r][c] * inv);
    }
  }
}

// q · k for one key row that this lane reads alone. 16-byte loads where the row allows them (a row
// starts at a multiple of head_dim elements, so head_dim % 8 == 0 keeps bf16 rows 16-byte aligned):
// scalar loads made the decode kernel latency-bound.
__device__ __forceinline__ float dot_row(const float* q, const __nv_bfloat16* k, int D) {
  float acc0 = 0.0f, acc1 = 0.0f;
  if (D % 8 == 0) {
    const uint4* k4 = reinterpret_cast<const uint4*>(k);
    for (int c = 0; c < D / 8; ++c) {
      const uint4 u = k4[c];
      const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 f = __bfloat1622float2(h[e]);
        acc0 += q[c * 8 + 2 * e] * f.x;
        acc1 += q[c * 8 + 2 * e + 1] * f.y;
      }
    }
    return acc0 + acc1;
  }
  for (int d = 0; d < D; ++d) acc0 += q[d] * __bfloat162float(k[d]);
  return acc0;
}
__device__ __forceinline__ float dot_row(const float* q, const float* k, int D) {
  float acc0 = 0.0f, acc1 = 0.0f;
  if (D % 4 == 0) {
    const float4* k4 = reinterpret_cast<const float4*>(k);
    for (int c = 0; c < D / 4; ++c) {
      const float4 f = k4[c];
      acc0 += q[c * 4] * f.x + q[c * 4 + 2] * f.z;
      acc1 += q[c * 4 + 1] * f.y + q[c * 4 + 3] * f.w;
    }
    return acc0 + acc1;
  }
  for (int d = 0; d < D; ++d) acc0 += q[d] * k[d];
  return acc0;
}

// grid (splits, heads, seqs), block 128 threads. Every sequence has exactly one query row.
// splits == 1 writes the output; otherwise partial[(seq, head, split)] = {m, l, o[D]}.
template <class T, int DC>
__global__ void __launch_bounds__(block_threads) decode_kernel(
    const T* qkv, int heads, int kv_heads, int head_dim, float scale, int window, const std::int32_t* q_start,
    const std::int32_t* ctx_len, const std::int32_t* block_table, int table_stride, int block_size,
    const T* k_cache, const T* v_cache, int split_len, float* partials, T* out) {
  __shared__ float q_s[32 * DC];
  __shared__ float m_s[warps], l_s[warps];
  __shared__ float o_s[warps][32 * DC];
  const int D = head_dim;
  const int split = blockIdx.x, splits = gridDim.x, h = blockIdx.y, seq = blockIdx.z;
  const int row = q_start[seq];
  if (q_start[seq + 1] - row != 1) return;
  const int ctx = ctx_len[seq], pos = ctx - 1;
  const int lo = window > 0 ? max(0, pos - window + 1) : 0;
  const int begin = lo + split * split_len, end = min(ctx, begin + split_len);
  const int kvh = h / (heads / kv_heads);
  const int width = (heads + 2 * kv_heads) * D;
  const std::int32_t* table = block_table + static_cast<std::size_t>(seq) * table_stride;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    q_s[d] = to_f32(qkv[static_cast<std::size_t>(row) * width + h * D + d]) * scale;
  }
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float m = -INFINITY, l = 0.0f, o[DC];
#pragma unroll
  for (int c = 0; c < DC; ++c) o[c] = 0.0f;
  for (int k0 = begin + warp * 32; k0 < end; k0 += warps * 32) {
    const int j = k0 + lane;
    float s = -INFINITY;
    std::size_t at = 0;
    if (j < end) {
      at = cache_index(table, block_size, j, kv_heads, kvh, D);
      s = dot_row(q_s, k_cache + at, D);
    }
    const float m_new = fmaxf(m, warp_max(s));  // finite: key k0 is always < end
    const float alpha = exp_diff(m, m_new);
    const float p = exp_diff(s, m_new);
    l = l * alpha + warp_sum(p);
    m = m_new;
#pragma unroll
    for (int c = 0; c < DC; ++c) o[c] *= alpha;
    const int valid = min(32, end - k0);
    for (int jj = 0; jj < valid; ++jj) {
      const float pj = __shfl_sync(0xffffffffu, p, jj);
      const std::size_t at_j = __shfl_sync(0xffffffffu, static_cast<unsigned long long>(at), jj);
#pragma unroll
      for (int c = 0; c < DC; ++c) {
        const int d = lane + 32 * c;
        if (d < D) o[c] += pj * to_f32(v_cache[at_j + d]);
      }
    }
  }
  if (lane == 0) {
    m_s[warp] = m;
    l_s[warp] = l;
  }
#pragma unroll
  for (int c = 0; c < DC; ++c) o_s[warp][lane + 32 * c] = o[c];
  __syncthreads();

  float m_all = -INFINITY;
  for (int w = 0; w < warps; ++w) m_all = fmaxf(m_all, m_s[w]);
  float l_all = 0.0f;
  for (int w = 0; w < warps; ++w) l_all += l_s[w] * exp_diff(m_s[w], m_all);
  const std::size_t part = (static_cast<std::size_t>(seq) * heads + h) * splits + split;
  float* p_out = partials + part * (D + 2);
  if (splits > 1 && threadIdx.x == 0) {
    p_out[0] = m_all;
    p_out[1] = l_all;
  }
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.0f;
    for (int w = 0; w < warps; ++w) acc += o_s[w][d] * exp_diff(m_s[w], m_all);
    if (splits > 1) {
      p_out[2 + d] = acc;
    } else {
      out[static_cast<std::size_t>(row) * heads * D + h * D + d] = from_f32<T>(acc / l_all);
    }
  }
}

// q · k for the G query heads of one KV head against one key row that this lane reads alone: the
// row is loaded once (16-byte loads) and used G times.
template <int G>
__device__ __forceinline__ void dot_rows(const float* q, int q_stride, const __nv_bfloat16* k, int D, float (&s)[G]) {
#pragma unroll
  for (int g = 0; g < G; ++g) s[g] = 0.0f;
  if (D % 8 == 0) {
    const uint4* k4 = reinterpret_cast<const uint4*>(k);
    for (int c = 0; c < D / 8; ++c) {
      const uint4 u = k4[c];
      const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
      float f[8];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 v = __bfloat1622float2(h[e]);
        f[2 * e] = v.x;
        f[2 * e + 1] = v.y;
      }
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const float* qg = q + g * q_stride + c * 8;
#pragma unroll
        for (int e = 0; e < 8; ++e) s[g] += qg[e] * f[e];
      }
    }
    return;
  }
  for (int d = 0; d < D; ++d) {
    const float kd = __bfloat162float(k[d]);
#pragma unroll
    for (int g = 0; g < G; ++g) s[g] += q[g * q_stride + d] * kd;
  }
}
template <int G>
__device__ __forceinline__ void dot_rows(const float* q, int q_stride, const float* k, int D, float (&s)[G]) {
#pragma unroll
  for (int g = 0; g < G; ++g) s[g] = 0.0f;
  if (D % 4 == 0) {
    const float4* k4 = reinterpret_cast<const float4*>(k);
    for (int c = 0; c < D / 4; ++c) {
      const float4 f = k4[c];
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const float* qg = q + g * q_stride + c * 4;
        s[g] += qg[0] * f.x + qg[1] * f.y + qg[2] * f.z + qg[3] * f.w;
      }
    }
    return;
  }
  for (int d = 0; d < D; ++d) {
#pragma unroll
    for (int g = 0; g < G; ++g) s[g] += q[g * q_stride + d] * k[d];
  }
}

// The last step of a grouped decode block: merges its W warps' softmax states for each of the G
// query heads (running max m, sum l and unnormalised o, kept in shared memory) and writes the split's
// partial result (m in natural-log units, l, o: what combine_kernel reads) or, with one split, the
// output row. kLog2: m and l were kept with exp2 (the tensor-core kernel), not exp.
template <int G, int W, int QS, bool kLog2, class T>
__device__ __forceinline__ void merge_warps_and_store(const float (&m_s)[W][G], const float (&l_s)[W][G],
                                                      const float (&o_s)[W][G][QS], int D, int heads, int h0, int seq,
                                                      int split, int splits, int row, float* partials, T* out) {
  for (int idx = threadIdx.x; idx < G * D; idx += blockDim.x) {
    const int g = idx / D, d = idx % D;
    float m_all = -INFINITY;
    for (int w = 0; w < W; ++w) m_all = fmaxf(m_all, m_s[w][g]);
    float l_all = 0.0f, acc = 0.0f;
    for (int w = 0; w < W; ++w) {
      const float f = kLog2 ? (m_s[w][g] == -INFINITY ? 0.0f : exp2f(m_s[w][g] - m_all)) : exp_diff(m_s[w][g], m_all);
      l_all += l_s[w][g] * f;
      acc += o_s[w][g][d] * f;
    }
    const int h = h0 + g;
    if (splits > 1) {
      float* p_out = partials + ((static_cast<std::size_t>(seq) * heads + h) * splits + split) * (D + 2);
      if (d == 0) {
        p_out[0] = kLog2 ? m_all * 0.6931471805599453f : m_all;
        p_out[1] = l_all;
      }
      p_out[2 + d] = acc;
    } else {
      out[static_cast<std::size_t>(row) * heads * D + h * D + d] = from_f32<T>(acc / l_all);
    }
  }
}

// Flash-decoding with grouped queries: grid (splits, kv_heads, seqs), block 128 threads. The G =
// heads / kv_heads query heads of a KV head share every K and V row the block loads, so K/V bytes are
// read once per KV head instead of once per query head. Same partial/combine format as decode_kernel.
template <class T, int DC, int G>
__global__ void __launch_bounds__(block_threads) decode_gqa_kernel(
    const T* qkv, int heads, int kv_heads, int head_dim, float scale, int window, const std::int32_t* q_start,
    const std::int32_t* ctx_len, const std::int32_t* block_table, int table_stride, int block_size,
    const T* k_cache, const T* v_cache, int split_len, float* partials, T* out) {
  constexpr int QS = 32 * DC;
  __shared__ float q_s[G * QS];
  __shared__ float m_s[warps][G], l_s[warps][G];
  __shared__ float o_s[warps][G][QS];
  grid_dep_wait();
  grid_dep_trigger();
  const int D = head_dim;
  const int split = blockIdx.x, splits = gridDim.x, kvh = blockIdx.y, seq = blockIdx.z;
  const int row = q_start[seq];
  if (q_start[seq + 1] - row != 1) return;
  const int ctx = ctx_len[seq], pos = ctx - 1;
  const int lo = window > 0 ? max(0, pos - window + 1) : 0;
  const int begin = lo + split * split_len, end = min(ctx, begin + split_len);
  const int width = (heads + 2 * kv_heads) * D;
  const int h0 = kvh * G;
  const std::int32_t* table = block_table + static_cast<std::size_t>(seq) * table_stride;
  for (int idx = threadIdx.x; idx < G * D; idx += blockDim.x) {
    const int g = idx / D, d = idx % D;
    q_s[g * QS + d] = to_f32(qkv[static_cast<std::size_t>(row) * width + (h0 + g) * D + d]) * scale;
  }
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float m[G], l[G], o[G][DC];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int c = 0; c < DC; ++c) o[g][c] = 0.0f;
  }
  for (int k0 = begin + warp * 32; k0 < end; k0 += warps * 32) {
    const int j = k0 + lane;
    float s[G];
    std::size_t at = 0;
    if (j < end) {
      at = cache_index(table, block_size, j, kv_heads, kvh, D);
      dot_rows<G>(q_s, QS, k_cache + at, D, s);
    } else {
#pragma unroll
      for (int g = 0; g < G; ++g) s[g] = -INFINITY;
    }
    float p[G];
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const float m_new = fmaxf(m[g], warp_max(s[g]));  // finite: key k0 is always < end
      const float alpha = exp_diff(m[g], m_new);
      p[g] = exp_diff(s[g], m_new);
      l[g] = l[g] * alpha + warp_sum(p[g]);
      m[g] = m_new;
#pragma unroll
      for (int c = 0; c < DC; ++c) o[g][c] *= alpha;
    }
    // V rows 8 keys at a time: their loads are all in flight before the first is used (one key at a
    // time exposed a memory round trip per key).
    const int valid = min(32, end - k0);
    for (int j0 = 0; j0 < valid; j0 += 8) {
      float v[8][DC];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const std::size_t at_j = __shfl_sync(0xffffffffu, static_cast<unsigned long long>(at), j0 + u);
#pragma unroll
        for (int c = 0; c < DC; ++c) {
          const int d = lane + 32 * c;
          v[u][c] = (j0 + u < valid && d < D) ? to_f32(v_cache[at_j + d]) : 0.0f;
        }
      }
#pragma unroll
      for (int u = 0; u < 8; ++u) {
#pragma unroll
        for (int g = 0; g < G; ++g) {
          const float pj = __shfl_sync(0xffffffffu, p[g], j0 + u);  // 0 past `valid`: those keys are masked
#pragma unroll
          for (int c = 0; c < DC; ++c) o[g][c] += pj * v[u][c];
        }
      }
    }
  }
  if (lane == 0) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
      m_s[warp][g] = m[g];
      l_s[warp][g] = l[g];
    }
  }
#pragma unroll
  for (int g = 0; g < G; ++g)
#pragma unroll
    for (int c = 0; c < DC; ++c) o_s[warp][g][lane + 32 * c] = o[g][c];
  __syncthreads();
  merge_warps_and_store<G, warps, QS, false>(m_s, l_s, o_s, D, heads, h0, seq, split, splits, row, partials, out);
}

// One (query or key) pair rotated by (cos_v, sin_v) and rounded, as rope_kv_kernel does. Both prologue
// variants inline this one expression, so they round (and contract into FMAs) alike.
__device__ __forceinline__ void rope_pair(float xa, float xb, float cos_v, float sin_v, __nv_bfloat16& a,
                                          __nv_bfloat16& b) {
  a = __float2bfloat16_rn(xa * cos_v - xb * sin_v);
  b = __float2bfloat16_rn(xb * cos_v + xa * sin_v);
}

// qkv[row, col] as the qkv linear stores it: read from qkv, or (rope.parts) summed from its K slices
// as the wgmma GEMM's cluster sums them (0 + part 0 + part 1 + ...) and rounded as store_linear_out
// rounds. The slices' loads are unconditional (a split past the last reads the last again, not
// added) so that the unrolled callers' loads all leave before the first sum: with a load behind
// each split's own branch they went one entry at a time, a round trip each (session 21: the
// attention kernel +1.8 µs a layer at b=64).
__device__ __forceinline__ __nv_bfloat16 qkv_entry(const attention_rope_kv& rope, const __nv_bfloat16* qrow, int row,
                                                   int width, int col) {
  if (rope.parts == nullptr) return qrow[col];
  constexpr int MS = attention_rope_kv::max_splits;
  const std::size_t slice = static_cast<std::size_t>(rope.n) * width;
  const float* at = rope.parts + static_cast<std::size_t>(row) * width + col;
  float v[MS];
#pragma unroll
  for (int sp = 0; sp < MS; ++sp) v[sp] = __ldcg(at + min(sp, rope.splits - 1) * slice);
  float sum = 0.0f;
#pragma unroll
  for (int sp = 0; sp < MS; ++sp) {
    if (sp < rope.splits) sum += v[sp];
  }
  return __float2bfloat16_rn(linear_out_value(sum, rope.bias, col));
}

// rope_kv_kernel's work for one decode row, done by the attention block that serves KV head `kvh`:
// its G query heads (h0 ...) and its KV head are rotated (same rounding), written back to qkv, the new
// key's K and V rows stored to their cache slot, and each roped query pair handed to store_q(g, i, a, b)
// (dims i and i + D/2), and the new key's pairs to store_kv(i, k_a, k_b, v_a, v_b) (the ring kernel's
// shared-memory copy). The caller's __syncthreads orders the block's global writes before its reads.
// NT: the block's threads (blockDim.x).
// rope.once (tune.rope_once, the default): each thread first loads the pairs of its (head, pair) items
// (at most ceil((G + 1) D/2 / NT)), then threads 0 .. D/2 - 1 compute one angle each (the same float
// angle, double-precision sincos and float rounding as below) into shared memory, and after a barrier
// every item is rotated with its pair's (cos, sin): the same bits as computing them per item. Off: one
// sincos per item, each after its item's loads, so the G + 1 heads repeat each angle and warp 0 of a
// 128-thread block (160 items at D 64, G 4) runs two sincos and two load round trips back to back.
struct no_store_kv {
  __device__ void operator()(int, __nv_bfloat16, __nv_bfloat16, __nv_bfloat16, __nv_bfloat16) const {}
};
// with_kv false (rope.once only): the block leaves the KV head alone (another split of the row
// writes it); write_q false: the roped query heads go to store_q only, not back into qkv (other splits
// of the row still read them there; decode_gqa_ring_kernel's last block writes them back).
template <int D, int G, int NT, class StoreQ, class StoreKV = no_store_kv>
__device__ __forceinline__ void rope_kv_prologue(const attention_rope_kv& rope, int row, int width, int heads,
                                                 int kv_heads, int kvh, int h0, StoreQ store_q,
                                                 StoreKV store_kv = {}, bool with_kv = true, bool write_q = true) {
  constexpr int half = D / 2;
  static_assert(NT >= half, "one thread per pair computes the angles");
  __nv_bfloat16* qrow = static_cast<__nv_bfloat16*>(rope.qkv) + static_cast<std::size_t>(row) * width;
  const std::size_t slot = static_cast<std::size_t>(rope.slots[row]) * kv_heads + kvh;
  if (rope.once) {
    __nv_bfloat16* kd = static_cast<__nv_bfloat16*>(rope.k_cache) + slot * D;
    __nv_bfloat16* vd = static_cast<__nv_bfloat16*>(rope.v_cache) + slot * D;
    const int v0 = (heads + kv_heads + kvh) * D;  // the KV head's v entries in the row
    __nv_bfloat16* vsrc = qrow + v0;
    constexpr int items = (G + 1) * half, per = (items + NT - 1) / NT;
    const int live = with_kv ? items : G * half;  // items g == G (the KV head) come last
    __shared__ float2 cs_s[half];
    // Loads first: their latency runs under the sincos (all of them precede every store, so no
    // store can alias a later load).
    __nv_bfloat16 xa[per], xb[per], va[per], vb[per];
#pragma unroll
    for (int u = 0; u < per; ++u) {
      const int idx = threadIdx.x + u * NT;
      if (idx < live) {
        const int g = idx / half, i = idx % half;
        const int x0 = (g < G ? h0 + g : heads + kvh) * D;
        xa[u] = qkv_entry(rope, qrow, row, width, x0 + i);
        xb[u] = qkv_entry(rope, qrow, row, width, x0 + i + half);
        if (g == G) {
          va[u] = qkv_entry(rope, qrow, row, width, v0 + i);
          vb[u] = qkv_entry(rope, qrow, row, width, v0 + i + half);
        }
      }
    }
    if (threadIdx.x < half) {
      const int i = threadIdx.x;
      const float angle = static_cast<float>(rope.positions[row]) * rope.inv_freq[i];
      double sn, cs;
      sincos(static_cast<double>(angle), &sn, &cs);
      cs_s[i] = make_float2(static_cast<float>(cs) * rope.scaling, static_cast<float>(sn) * rope.scaling);
    }
    __syncthreads();
#pragma unroll
    for (int u = 0; u < per; ++u) {
      const int idx = threadIdx.x + u * NT;
      if (idx < live) {
        const int g = idx / half, i = idx % half;
        const float2 c = cs_s[i];
        __nv_bfloat16 a, b;
        rope_pair(__bfloat162float(xa[u]), __bfloat162float(xb[u]), c.x, c.y, a, b);
        __nv_bfloat16* x = qrow + (g < G ? h0 + g : heads + kvh) * D;
        if (g == G || write_q) {
          x[i] = a;
          x[i + half] = b;
        }
        if (g < G) {
          store_q(g, i, a, b);
        } else {
          kd[i] = a;
          kd[i + half] = b;
          vd[i] = va[u];
          vd[i + half] = vb[u];
          if (rope.parts != nullptr) {  // v as the GEMM would have left it in qkv
            vsrc[i] = va[u];
            vsrc[i + half] = vb[u];
          }
          store_kv(i, a, b, va[u], vb[u]);
        }
      }
    }
    return;
  }
  // The code of session 3, kept for the ablation (variant `norope1`).
  const float position = static_cast<float>(rope.positions[row]);
  for (int idx = threadIdx.x; idx < (G + 1) * half; idx += blockDim.x) {
    const int g = idx / half, i = idx % half;  // g == G: the KV head
    const float angle = position * rope.inv_freq[i];
    double sn, cs;
    sincos(static_cast<double>(angle), &sn, &cs);
    const float cos_v = static_cast<float>(cs) * rope.scaling, sin_v = static_cast<float>(sn) * rope.scaling;
    const int x0 = (g < G ? h0 + g : heads + kvh) * D;
    __nv_bfloat16* x = qrow + x0;
    const float xa = __bfloat162float(qkv_entry(rope, qrow, row, width, x0 + i));
    const float xb = __bfloat162float(qkv_entry(rope, qrow, row, width, x0 + i + half));
    __nv_bfloat16 a, b;
    rope_pair(xa, xb, cos_v, sin_v, a, b);
    x[i] = a;
    x[i + half] = b;
    if (g < G) {
      store_q(g, i, a, b);
    } else {
      __nv_bfloat16* kd = static_cast<__nv_bfloat16*>(rope.k_cache) + slot * D;
      __nv_bfloat16* vd = static_cast<__nv_bfloat16*>(rope.v_cache) + slot * D;
      const int v0 = (heads + kv_heads + kvh) * D;
      const __nv_bfloat16 va = qkv_entry(rope, qrow, row, width, v0 + i);
      const __nv_bfloat16 vb = qkv_entry(rope, qrow, row, width, v0 + i + half);
      kd[i] = a;
      kd[i + half] = b;
      vd[i] = va;
      vd[i + half] = vb;
      if (rope.parts != nullptr) {
        qrow[v0 + i] = va;
        qrow[v0 + i + half] = vb;
      }
      store_kv(i, a, b, va, vb);
    }
  }
}

// Grouped flash-decoding for bf16 and head_dim 64 or 128, the kernel the decode step runs. Same grid,
// partials and result as decode_gqa_kernel; what differs is how a warp reads its 32 keys. There, V
// rows came as 2-byte loads, 8 keys at a time, after the scores: five dependent memory round trips
// per 32 keys (22 µs a layer at batch 64, a quarter of the copy bandwidth). Here each lane issues its
// key's K row and its share of the 32 V rows (16-byte loads, D / 8 lanes per V row) at once, so a
// warp waits for memory once per 32 keys; lane l then accumulates 8 output dimensions for the keys
// it loaded, and the lanes holding the same dimensions are summed at the end.
// Registers capped for the 1B shape (D 64, G 4): uncapped it took 145, three blocks an SM, and the
// 512 blocks of batch 64 ran as two waves.
// ROPE (launch_gqa: one split per sequence, one row per sequence): the block first does rope_kv_kernel's
// work for its row's G query heads and its KV head (same rounding), writes the roped heads back to
// qkv and the new key's K and V rows to their cache slot, and reads them back in its key loop: no
// other block touches that row's heads or slot, and __syncthreads orders the block's own global
// writes before its reads.
// W warps a block: 4, or 16 with tune.wide_decode where the grid has fewer blocks than SMs (batch 1
// and 8), so that each warp's long dependent chain (~3 µs per 32 keys: the loads, then ~800
// instructions) runs once instead of several times. ncu had that 8% faster at batch 1 (8.9 vs 9.6 µs a
// layer), but the whole step measured 2% slower (bench/NOTES.md, session 3), so it is off.
template <int D, int G, bool ROPE, int W>
__global__ void __launch_bounds__(W * 32, (W == 4 && D == 64 && G == 4) ? 4 : 1) decode_gqa_vec_kernel(
    const __nv_bfloat16* qkv, int heads, int kv_heads, float scale, int window, const std::int32_t* q_start,
    const std::int32_t* ctx_len, const std::int32_t* block_table, int table_stride, int block_size,
    const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache, int split_len, float* partials,
    __nv_bfloat16* out, attention_rope_kv rope) {
  constexpr int KC = D / 8;       // 16-byte chunks of a row
  constexpr int RPI = 32 / KC;    // V rows one warp-wide load covers (4 or 2)
  constexpr int VL = 32 / RPI;    // V loads per lane for 32 keys
  __shared__ __align__(16) float q_s[G][D];
  __shared__ float m_s[W][G], l_s[W][G];
  __shared__ float o_s[W][G][D];
  grid_dep_wait();
  grid_dep_trigger();
  const int split = blockIdx.x, splits = gridDim.x, kvh = blockIdx.y, seq = blockIdx.z;
  const int row = q_start[seq];
  if (q_start[seq + 1] - row != 1) return;
  const int ctx = ctx_len[seq], pos = ctx - 1;
  const int lo = window > 0 ? max(0, pos - window + 1) : 0;
  const int begin = lo + split * split_len, end = min(ctx, begin + split_len);
  const int width = (heads + 2 * kv_heads) * D;
  const int h0 = kvh * G;
  const std::int32_t* table = block_table + static_cast<std::size_t>(seq) * table_stride;
  if constexpr (ROPE) {
    rope_kv_prologue<D, G, W * 32>(rope, row, width, heads, kv_heads, kvh, h0,
                                   [&](int g, int i, __nv_bfloat16 a, __nv_bfloat16 b) {
                             q_s[g][i] = __bfloat162float(a) * scale;
                             q_s[g][i + D / 2] = __bfloat162float(b) * scale;
                           });
  } else {
    for (int idx = threadIdx.x; idx < G * D; idx += blockDim.x) {
      const int g = idx / D, d = idx % D;
      q_s[g][d] = to_f32(qkv[static_cast<std::size_t>(row) * width + (h0 + g) * D + d]) * scale;
    }
  }
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int vrow = lane / KC, vcol = (lane % KC) * 8;
  float m[G], l[G], o[G][8];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) o[g][e] = 0.0f;
  }
  for (int k0 = begin + warp * 32; k0 < end; k0 += W * 32) {
    const int j = k0 + lane;
    const bool valid = j < end;
    const std::size_t at = valid ? cache_index(table, block_size, j, kv_heads, kvh, D) : 0;
    uint4 kr[KC], vr[VL];
    const uint4* k4 = reinterpret_cast<const uint4*>(k_cache + at);
#pragma unroll
    for (int c = 0; c < KC; ++c) kr[c] = valid ? k4[c] : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int i = 0; i < VL; ++i) {
      const int r = i * RPI + vrow;
      const std::size_t at_r = __shfl_sync(0xffffffffu, static_cast<unsigned long long>(at), r);
      vr[i] = k0 + r < end ? *reinterpret_cast<const uint4*>(v_cache + at_r + vcol) : make_uint4(0, 0, 0, 0);
    }
    float s[G];
#pragma unroll
    for (int g = 0; g < G; ++g) s[g] = 0.0f;
#pragma unroll
    for (int c = 0; c < KC; ++c) {
      const std::uint32_t* kp = reinterpret_cast<const std::uint32_t*>(&kr[c]);
      float kf[8];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        kf[2 * e] = __uint_as_float(kp[e] << 16);
        kf[2 * e + 1] = __uint_as_float(kp[e] & 0xffff0000u);
      }
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const float4 qa = *reinterpret_cast<const float4*>(&q_s[g][c * 8]);
        const float4 qb = *reinterpret_cast<const float4*>(&q_s[g][c * 8 + 4]);
        s[g] += qa.x * kf[0] + qa.y * kf[1] + qa.z * kf[2] + qa.w * kf[3] + qb.x * kf[4] + qb.y * kf[5] +
                qb.z * kf[6] + qb.w * kf[7];
      }
    }
    float p[G];
#pragma unroll
    for (int g = 0; g < G; ++g) {
      if (!valid) s[g] = -INFINITY;
      const float m_new = fmaxf(m[g], warp_max(s[g]));  // finite: key k0 is always < end
      const float alpha = exp_diff(m[g], m_new);
      p[g] = exp_diff(s[g], m_new);
      l[g] = l[g] * alpha + warp_sum(p[g]);
      m[g] = m_new;
#pragma unroll
      for (int e = 0; e < 8; ++e) o[g][e] *= alpha;
    }
#pragma unroll
    for (int i = 0; i < VL; ++i) {
      const int r = i * RPI + vrow;
      const std::uint32_t* vp = reinterpret_cast<const std::uint32_t*>(&vr[i]);
      float vf[8];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        vf[2 * e] = __uint_as_float(vp[e] << 16);
        vf[2 * e + 1] = __uint_as_float(vp[e] & 0xffff0000u);
      }
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const float pr = __shfl_sync(0xffffffffu, p[g], r);  // 0 for keys past `end` (their V is 0 too)
#pragma unroll
        for (int e = 0; e < 8; ++e) o[g][e] += pr * vf[e];
      }
    }
  }
  // Lanes l, l + KC, l + 2 KC, ... hold the same 8 dimensions for different keys.
#pragma unroll
  for (int g = 0; g < G; ++g)
#pragma unroll
    for (int e = 0; e < 8; ++e)
#pragma unroll
      for (int off = KC; off < 32; off <<= 1) o[g][e] += __shfl_xor_sync(0xffffffffu, o[g][e], off);
  if (lane < KC) {
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
      for (int e = 0; e < 8; ++e) o_s[warp][g][vcol + e] = o[g][e];
  }
  if (lane == 0) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
      m_s[warp][g] = m[g];
      l_s[warp][g] = l[g];
    }
  }
  __syncthreads();
  merge_warps_and_store<G, W, D, false>(m_s, l_s, o_s, D, heads, h0, seq, split, splits, row, partials, out);
}


// One warp's 32 keys k0 .. k0 + 31 on tensor cores (decode_gqa_tc_kernel, decode_gqa_ring_kernel):
// S = Q Kᵀ from the keys' B fragments kr (keys past `end` masked), the online softmax of row
// g = lane / 4 (log2 units; l over this lane's keys), then, once before_pv() has made the warp's V
// tile `vs` (32 rows of stride LD, rows past `end` zero) visible, O += P V with V read transposed.
template <int D, int LD, class BeforePV>
__device__ __forceinline__ void tc_decode_chunk(const std::uint32_t (&qa)[D / 32][2][2], const uint4 (&kr)[4][D / 32],
                                                const __nv_bfloat16* vs, int k0, int end, float sl2, int lane,
                                                float& m, float& l, float (&o)[D / 8][4], BeforePV before_pv) {
  const int q = lane % 4, mi = lane / 8;
  float sc[4][4];
#pragma unroll
  for (int nb = 0; nb < 4; ++nb) {
#pragma unroll
    for (int e = 0; e < 4; ++e) sc[nb][e] = 0.0f;
#pragma unroll
    for (int c = 0; c < D / 32; ++c) {
      mma16816(sc[nb], qa[c][0][0], 0u, qa[c][0][1], 0u, kr[nb][c].x, kr[nb][c].y);
      mma16816(sc[nb], qa[c][1][0], 0u, qa[c][1][1], 0u, kr[nb][c].z, kr[nb][c].w);
    }
  }
  // Row g's scores of keys k0 + nb*8 + 2q (+1); keys past the end masked.
  float mx = -INFINITY;
#pragma unroll
  for (int nb = 0; nb < 4; ++nb) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int key = k0 + nb * 8 + 2 * q + e;
      sc[nb][e] = key < end ? sc[nb][e] * sl2 : -INFINITY;
      mx = fmaxf(mx, sc[nb][e]);
    }
  }
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  const float mn = fmaxf(m, mx);  // finite: key k0 < end
  const float alpha = exp2f(m - mn);
  m = mn;
  float sum = 0.0f;
#pragma unroll
  for (int nb = 0; nb < 4; ++nb) {
    sc[nb][0] = exp2f(sc[nb][0] - mn);
    sc[nb][1] = exp2f(sc[nb][1] - mn);
    sum += sc[nb][0] + sc[nb][1];
  }
  l = l * alpha + sum;
#pragma unroll
  for (int i = 0; i < D / 8; ++i) {
    o[i][0] *= alpha;
    o[i][1] *= alpha;
  }
  before_pv();
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {
    const std::uint32_t a0 = pack_bf16x2(sc[2 * kk][0], sc[2 * kk][1]);
    const std::uint32_t a2 = pack_bf16x2(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
    const __nv_bfloat16* vrow = vs + (kk * 16 + (mi & 1) * 8 + lane % 8) * LD + (mi >> 1) * 8;
#pragma unroll
    for (int dn = 0; dn < D / 8; dn += 2) {
      std::uint32_t b[4];
      ldmatrix_x4_trans(b, vrow + dn * 8);
      mma16816(o[dn], a0, 0u, a2, 0u, b[0], b[1]);
      mma16816(o[dn + 1], a0, 0u, a2, 0u, b[2], b[3]);
    }
  }
}

// Q's A fragments of the tensor-core decode, permuted as K's B fragments: [32-dim slice][mma of the
// slice][a0, a2]; rows g ≥ G zero.
template <int D, int G>
__device__ __forceinline__ void tc_decode_q_fragments(const __nv_bfloat16 (&q_b)[G][D], int lane,
                                                      std::uint32_t (&qa)[D / 32][2][2]) {
  const int g = lane / 4, q = lane % 4;
#pragma unroll
  for (int c = 0; c < D / 32; ++c) {
    uint4 w4 = make_uint4(0, 0, 0, 0);
    if (g < G) w4 = *reinterpret_cast<const uint4*>(&q_b[g][c * 32 + q * 8]);
    qa[c][0][0] = w4.x;
    qa[c][0][1] = w4.y;
    qa[c][1][0] = w4.z;
    qa[c][1][1] = w4.w;
  }
}

// A warp's (m, l, O) of the tensor-core decode into shared memory for merge_warps_and_store (l summed
// over the quad of lanes that shares a row first).
template <int G, int W, int D>
__device__ __forceinline__ void tc_decode_store(float m, float l, const float (&o)[D / 8][4], int warp, int lane,
                                                float (&m_s)[W][G], float (&l_s)[W][G], float (&o_s)[W][G][D]) {
  const int g = lane / 4, q = lane % 4;
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  if (g < G) {
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      o_s[warp][g][i * 8 + 2 * q] = o[i][0];
      o_s[warp][g][i * 8 + 2 * q + 1] = o[i][1];
    }
    if (q == 0) {
      m_s[warp][g] = m;
      l_s[warp][g] = l;
    }
  }
}

// Grouped flash-decoding on tensor cores (bf16, head_dim 64, group G ≤ 8), the decode kernel of the
// 1B shape at every batch size (tune.tc_decode). Same grid, split, partials and result as
// decode_gqa_vec_kernel; ncu had that one issue-bound (batch 64: 17 µs a layer, ~880 instructions a
// warp per 32 keys at one issue per 11 cycles, DRAM 22% busy; this one: 12.8 µs, and −8% a step at
// batch 64, −5% at batch 1, bench/NOTES.md session 3). A warp's 32 keys cost 32 mma.sync m16n8k16:
// - S = Q Kᵀ with the G query heads as A's rows (rows ≥ G zero) and 8 keys per n-tile. Each lane loads
//   its keys' K rows as 16-byte pieces straight into B fragments: lane q's 8 contiguous dims are logical
//   k 2q, 2q+1, 2q+8, 2q+9 of two mmas, and Q's A fragments are permuted the same way (gemv.cu does the
//   same), so each dot product is the same sum.
// - softmax as prefill_tc_kernel (a quad of lanes shares a row; exp2 with the scale folded in); P is
//   rounded to bf16 for P·V, as there.
// - O += P V with V staged per warp in shared memory by cp.async (no registers; rows past the end
//   zero-filled) and read transposed by ldmatrix.
// The warps' (m, l, O) are merged through shared memory as in the vec kernel.
// EARLY (with ROPE, tune.early_decode): each warp requests its first chunk (V by cp.async into its
// tile, K into registers) before griddepcontrol.wait, as decode_gqa_ring_kernel does (same reasons,
// there), the new key left out: the prologue puts its V row into the tile and its K row into k_new,
// from which the lanes holding that key's fragments patch kr. Shared memory stays the tc kernel's.
template <int G, bool ROPE, bool EARLY = false>
__global__ void __launch_bounds__(block_threads, 4) decode_gqa_tc_kernel(
    const __nv_bfloat16* qkv, int heads, int kv_heads, float scale, int window, const std::int32_t* q_start,
    const std::int32_t* ctx_len, const std::int32_t* block_table, int table_stride, int block_size,
    const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache, int split_len, float* partials,
    __nv_bfloat16* out, attention_rope_kv rope) {
  constexpr int D = 64, LD = D + 8, W = warps;
  static_assert(G <= 8, "query rows beyond 8 would need A's second row block");
  __shared__ __align__(16) __nv_bfloat16 q_b[G][D];
  __shared__ __align__(16) __nv_bfloat16 v_s[W][32 * LD];
  __shared__ float m_s[W][G], l_s[W][G];
  __shared__ float o_s[W][G][D];
  static_assert(ROPE || !EARLY, "EARLY leaves out the key the fused prologue writes");
  __shared__ __align__(16) __nv_bfloat16 k_new[EARLY ? D : 1];
  if constexpr (!EARLY) {
    grid_dep_wait();
    grid_dep_trigger();
  }
  const int split = blockIdx.x, splits = gridDim.x, kvh = blockIdx.y, seq = blockIdx.z;
  const int row = q_start[seq];
  if (q_start[seq + 1] - row != 1) {
    if constexpr (EARLY) {
      grid_dep_wait();  // before the return, as every PDL kernel here (device_types.cuh)
      grid_dep_trigger();
    }
    return;
  }
  const int ctx = ctx_len[seq], pos = ctx - 1;
  const int lo = window > 0 ? max(0, pos - window + 1) : 0;
  const int begin = lo + split * split_len, end = min(ctx, begin + split_len);
  const int width = (heads + 2 * kv_heads) * D;
  const int h0 = kvh * G;
  const std::int32_t* table = block_table + static_cast<std::size_t>(seq) * table_stride;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  __nv_bfloat16* vs = v_s[warp];
  uint4 kr[4][D / 32];
  const int k_first = begin + warp * 32;
  if constexpr (EARLY) {
    if (k_first < end) {
      const int k0 = k_first, j = k0 + lane;
      const std::size_t at = j < end ? cache_index(table, block_size, j, kv_heads, kvh, D) : 0;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int piece = i * 32 + lane, r = piece / 8, cc = piece % 8;
        const std::size_t at_r = __shfl_sync(0xffffffffu, static_cast<unsigned long long>(at), r);
        if (k0 + r != pos) cp_async16(vs + r * LD + cc * 8, v_cache + at_r + cc * 8, k0 + r < end);
      }
      asm volatile("cp.async.commit_group;\n" ::);
#pragma unroll
      for (int nb = 0; nb < 4; ++nb) {
        const int r = nb * 8 + g;
        const std::size_t at_r = __shfl_sync(0xffffffffu, static_cast<unsigned long long>(at), r);
#pragma unroll
        for (int c = 0; c < D / 32; ++c) {
          kr[nb][c] = k0 + r < end && k0 + r != pos
                          ? *reinterpret_cast<const uint4*>(k_cache + at_r + c * 32 + q * 8)
                          : make_uint4(0, 0, 0, 0);
        }
      }
    }
    grid_dep_wait();
    grid_dep_trigger();
  }
  if constexpr (ROPE) {
    // EARLY: the new key's chunk nc was requested above (without it) where it is some warp's first.
    const int nc = (pos - begin) / 32, nr = (pos - begin) % 32;
    rope_kv_prologue<D, G, block_threads>(
        rope, row, width, heads, kv_heads, kvh, h0,
        [&](int g, int i, __nv_bfloat16 a, __nv_bfloat16 b) {
          q_b[g][i] = a;
          q_b[g][i + D / 2] = b;
        },
        [&](int i, __nv_bfloat16 ka, __nv_bfloat16 kb, __nv_bfloat16 va, __nv_bfloat16 vb) {
          if (EARLY && nc < W) {
            k_new[i] = ka;
            k_new[i + D / 2] = kb;
            v_s[nc][nr * LD + i] = va;
            v_s[nc][nr * LD + i + D / 2] = vb;
          }
        });
  } else {
    for (int idx = threadIdx.x; idx < G * D; idx += blockDim.x) {
      const int g = idx / D, d = idx % D;
      q_b[g][d] = qkv[static_cast<std::size_t>(row) * width + (h0 + g) * D + d];
    }
  }
  __syncthreads();

  std::uint32_t qa[D / 32][2][2];
  tc_decode_q_fragments<D, G>(q_b, lane, qa);
  const float sl2 = scale * 1.4426950408889634f;  // exp(x) = exp2(x log2 e)
  float o[D / 8][4];
  zero_fragments<D>(o);
  float m = -INFINITY, l = 0.0f;  // row g (log2 units); l: this lane's keys only until the end

  for (int k0 = k_first; k0 < end; k0 += W * 32) {
    if (EARLY && k0 == k_first) {  // requested before the wait; the new key's K from k_new
      const int r = pos - k0;
#pragma unroll
      for (int nb = 0; nb < 4; ++nb) {
        if (nb * 8 + g == r) {
#pragma unroll
          for (int c = 0; c < D / 32; ++c) kr[nb][c] = *reinterpret_cast<const uint4*>(&k_new[c * 32 + q * 8]);
        }
      }
      tc_decode_chunk<D, LD>(qa, kr, vs, k0, end, sl2, lane, m, l, o, [] {
        cp_async_wait_all();
        __syncwarp();
      });
      continue;
    }
    __syncwarp();  // the previous chunk's V reads are done before it is overwritten
    const int j = k0 + lane;
    const std::size_t at = j < end ? cache_index(table, block_size, j, kv_heads, kvh, D) : 0;
    // V: 32 rows × 8 pieces of 16 bytes, 8 a lane, into this warp's tile.
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int piece = i * 32 + lane, r = piece / 8, cc = piece % 8;
      const std::size_t at_r = __shfl_sync(0xffffffffu, static_cast<unsigned long long>(at), r);
      cp_async16(vs + r * LD + cc * 8, v_cache + at_r + cc * 8, k0 + r < end);
    }
    asm volatile("cp.async.commit_group;\n" ::);
    // K: key nb*8 + g of n-tile nb, lane q's 16 bytes of each 32-dim slice.
#pragma unroll
    for (int nb = 0; nb < 4; ++nb) {
      const int r = nb * 8 + g;
      const std::size_t at_r = __shfl_sync(0xffffffffu, static_cast<unsigned long long>(at), r);
#pragma unroll
      for (int c = 0; c < D / 32; ++c) {
        kr[nb][c] = k0 + r < end ? *reinterpret_cast<const uint4*>(k_cache + at_r + c * 32 + q * 8)
                                 : make_uint4(0, 0, 0, 0);
      }
    }
    tc_decode_chunk<D, LD>(qa, kr, vs, k0, end, sl2, lane, m, l, o, [] {
      cp_async_wait_all();
      __syncwarp();
    });
  }
  tc_decode_store<G, W, D>(m, l, o, warp, lane, m_s, l_s, o_s);
  __syncthreads();
  merge_warps_and_store<G, W, D, true>(m_s, l_s, o_s, D, heads, h0, seq, split, splits, row, partials, out);
}

// Dimension d of head h's result from its row's `splits` partial results (m, l, o[head_dim]): the
// combine launch and decode_gqa_ring_kernel's last split run this one expression. Loads bypass L1
// (__ldcg): other blocks wrote the partials during this kernel.
template <class T>
__device__ __forceinline__ T combine_splits(const float* partials, int seq, int heads, int h, int head_dim, int d,
                                            int splits) {
  const float* p = partials + (static_cast<std::size_t>(seq) * heads + h) * splits * (head_dim + 2);
  float m_all = -INFINITY;
  for (int i = 0; i < splits; ++i) m_all = fmaxf(m_all, __ldcg(p + i * (head_dim + 2)));
  float l_all = 0.0f, acc = 0.0f;
  for (int i = 0; i < splits; ++i) {
    const float* pi = p + i * (head_dim + 2);
    const float w = exp_diff(__ldcg(pi), m_all);
    l_all += __ldcg(pi + 1) * w;
    acc += __ldcg(pi + 2 + d) * w;
  }
  return from_f32<T>(acc / l_all);
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Bytes of decode_gqa_ring_kernel's ring of `stages` chunks a warp (head_dim 64): K tile 32 × 64 +
// V tile 32 × 72 bf16 a chunk, 4 warps.
constexpr std::size_t ring_chunk_bytes = (32 * 64 + 32 * 72) * sizeof(__nv_bfloat16);
constexpr std::size_t ring_smem_bytes(int stages) { return static_cast<std::size_t>(4 * stages) * ring_chunk_bytes; }

// decode_gqa_tc_kernel's arithmetic (the same chunks per warp, the same bits) with every key's K and V
// rows staged in shared memory by cp.async, K too (there it went through registers, loaded after the
// prologue). Each warp owns a ring of P chunk slots of 32 keys (slot = chunk mod 4P, so a warp's
// chunks w, w + 4, ... only ever use its own slots) and refills a slot with its chunk 4P further on
// as soon as it has consumed it. With ROPE (the fused decode step, one split) every warp requests its
// first P chunks before griddepcontrol.wait: the cached keys were written by earlier steps, and the
// plan's ints (q_start, ctx_len, the block table) are copied before a step's first kernel, so nothing
// the previous kernel writes is read early. Only the new key (position ctx - 1, which this block's
// prologue writes) is left out; the prologue puts its K and V rows into their slot as well. The K/V
// stream then runs under the previous kernel's tail and under the prologue's qkv load and sincos
// instead of after them (decode_gqa_tc_kernel at batch 64, contexts ~192: 11.5 µs a layer for ~25 MB,
// ~2.2 TB/s: prologue, one or two dependent 32-key round trips a warp, merge, all in series).
// K tiles: rows of 128 bytes whose 16-byte pieces are XOR-swizzled by (row & 1) << 2, so the
// B-fragment reads of rows g and g + 1 (one phase of a 16-byte ld.shared) hit different banks; V
// tiles: rows padded to LD as in decode_gqa_tc_kernel (ldmatrix.trans). Rows past the end are
// zero-filled (0 × garbage would be NaN in P V).
// Tried and dropped (sessions 24-25, bench/patches/oproj_poll.patch): each block counting its
// stored output for the o_proj GEMV to poll instead of waiting for this grid's end; the step was
// 0 to +5 µs (o_proj's share shrank, the attention's grew by as much).
// Tried and dropped (session 24, bench/patches/ring8.patch): 8 warps a block at batch 1, one chunk
// each where 4 warps take two at contexts of 129-256 keys; no faster (the attention's 7.3 µs a layer
// are the wait, the qkv-row round trip, the barriers and the merge, not the second chunk).
template <int G, bool ROPE, int P>
__global__ void __launch_bounds__(block_threads, 4) decode_gqa_ring_kernel(
    const __nv_bfloat16* qkv, int heads, int kv_heads, float scale, int window, const std::int32_t* q_start,
    const std::int32_t* ctx_len, const std::int32_t* block_table, int table_stride, int block_size,
    const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache, int split_len, float* partials,
    __nv_bfloat16* out, attention_rope_kv rope) {
  constexpr int D = 64, LD = D + 8, W = warps, S = W * P;
  constexpr int KT = 32 * D, SLOT = KT + 32 * LD;  // elements: K tile, then V tile
  static_assert(G <= 8, "query rows beyond 8 would need A's second row block");
  static_assert(SLOT * sizeof(__nv_bfloat16) == ring_chunk_bytes, "ring_smem_bytes");
  extern __shared__ __align__(16) unsigned char ring_bytes[];
  __nv_bfloat16* ring = reinterpret_cast<__nv_bfloat16*>(ring_bytes);
  __shared__ __align__(16) __nv_bfloat16 q_b[G][D];
  __shared__ float m_s[W][G], l_s[W][G];
  __shared__ float o_s[W][G][D];
  if constexpr (!ROPE) {
    grid_dep_wait();
    grid_dep_trigger();
  }
  const int split = blockIdx.x, splits = gridDim.x, kvh = blockIdx.y, seq = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = q_start[seq];
  if (q_start[seq + 1] - row != 1) {
    if constexpr (ROPE) {
      grid_dep_wait();  // before the return, as every PDL kernel here (device_types.cuh)
      grid_dep_trigger();
    }
    return;
  }
  const int ctx = ctx_len[seq], pos = ctx - 1;
  const int lo = window > 0 ? max(0, pos - window + 1) : 0;
  const int begin = lo + split * split_len, end = min(ctx, begin + split_len);
  const int chunks = end > begin ? (end - begin + 31) / 32 : 0;
  const int width = (heads + 2 * kv_heads) * D;
  const int h0 = kvh * G;
  const std::int32_t* table = block_table + static_cast<std::size_t>(seq) * table_stride;
  // Chunk c (if the block has it) into its slot, key `skip` left out; one commit group either way,
  // so the wait below counts groups alike in every warp.
  auto request = [&](int c, int skip) {
    if (c < chunks) {  // warp-uniform
      const int k0 = begin + c * 32, j = k0 + lane;
      const std::size_t at = j < end ? cache_index(table, block_size, j, kv_heads, kvh, D) : 0;
      __nv_bfloat16* ks = ring + (c % S) * SLOT;
      __nv_bfloat16* vs = ks + KT;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int piece = i * 32 + lane, r = piece / 8, cc = piece % 8;
        const std::size_t at_r = __shfl_sync(0xffffffffu, static_cast<unsigned long long>(at), r);
        if (k0 + r != skip) {
          const bool valid = k0 + r < end;
          cp_async16(ks + r * D + (cc ^ ((r & 1) << 2)) * 8, k_cache + at_r + cc * 8, valid);
          cp_async16(vs + r * LD + cc * 8, v_cache + at_r + cc * 8, valid);
        }
      }
    }
    cp_async_commit();
  };
  if constexpr (ROPE) {
#pragma unroll
    for (int i = 0; i < P; ++i) request(warp + i * W, pos);
    grid_dep_wait();
    if (!rope.late_trigger) grid_dep_trigger();
    // The new key: chunk nc, row nr of the split that owns it (pos in [begin, end): the only split
    // with one split). Its chunk was requested above without it when nc < S; a later chunk is
    // requested after the prologue, from the cache. Several splits (rope.split_done): each ropes the
    // query heads itself, only the owner writes the KV head, and none writes q back yet.
    const bool owner = pos >= begin && pos < end;
    const int nc = owner ? (pos - begin) / 32 : S, nr = owner ? (pos - begin) % 32 : 0;
    __nv_bfloat16* nks = ring + (nc % S) * SLOT + nr * D;
    __nv_bfloat16* nvs = ring + (nc % S) * SLOT + KT + nr * LD;
    const int sw = (nr & 1) << 2;
    rope_kv_prologue<D, G, block_threads>(
        rope, row, width, heads, kv_heads, kvh, h0,
        [&](int g, int i, __nv_bfloat16 a, __nv_bfloat16 b) {
          q_b[g][i] = a;
          q_b[g][i + D / 2] = b;
        },
        [&](int i, __nv_bfloat16 ka, __nv_bfloat16 kb, __nv_bfloat16 va, __nv_bfloat16 vb) {
          if (nc < S) {
            const int ib = i + D / 2;
            nks[((i / 8) ^ sw) * 8 + i % 8] = ka;
            nks[((ib / 8) ^ sw) * 8 + ib % 8] = kb;
            nvs[i] = va;
            nvs[ib] = vb;
          }
        },
        owner, splits == 1);
  } else {
#pragma unroll
    for (int i = 0; i < P; ++i) request(warp + i * W, -1);
    for (int idx = threadIdx.x; idx < G * D; idx += blockDim.x) {
      const int g = idx / D, d = idx % D;
      q_b[g][d] = qkv[static_cast<std::size_t>(row) * width + (h0 + g) * D + d];
    }
  }
  __syncthreads();
  if constexpr (ROPE) {
    if (rope.late_trigger) grid_dep_trigger();
  }

  const int g = lane / 4, q = lane % 4;
  std::uint32_t qa[D / 32][2][2];
  tc_decode_q_fragments<D, G>(q_b, lane, qa);
  const float sl2 = scale * 1.4426950408889634f;  // exp(x) = exp2(x log2 e)
  float o[D / 8][4];
  zero_fragments<D>(o);
  float m = -INFINITY, l = 0.0f;  // row g (log2 units); l: this lane's keys only until the end
  for (int c = warp; c < chunks; c += W) {
    cp_async_wait_group<P - 1>();  // this lane's pieces of chunk c are in
    __syncwarp();                  // and the other lanes'
    const __nv_bfloat16* ks = ring + (c % S) * SLOT;
    // K: key nb*8 + g of n-tile nb, lane q's 16 bytes of each 32-dim slice (piece 4 s + q).
    uint4 kr[4][D / 32];
#pragma unroll
    for (int nb = 0; nb < 4; ++nb) {
      const int r = nb * 8 + g;
#pragma unroll
      for (int cs = 0; cs < D / 32; ++cs) {
        kr[nb][cs] = *reinterpret_cast<const uint4*>(ks + r * D + ((cs * 4 + q) ^ ((r & 1) << 2)) * 8);
      }
    }
    tc_decode_chunk<D, LD>(qa, kr, ks + KT, begin + c * 32, end, sl2, lane, m, l, o, [] {});
    __syncwarp();  // the slot's reads are done before it is refilled
    request(c + S, -1);
  }
  tc_decode_store<G, W, D>(m, l, o, warp, lane, m_s, l_s, o_s);
  __syncthreads();
  merge_warps_and_store<G, W, D, true>(m_s, l_s, o_s, D, heads, h0, seq, split, splits, row, partials, out);
  if constexpr (ROPE) {
    if (splits > 1) {
      // The row's last split to finish merges them (combine_kernel's arithmetic, so the same bits)
      // and writes the roped query heads back: every split has read qkv by then.
      __shared__ bool last;
      __threadfence();  // this block's partials are visible before its count
      __syncthreads();
      if (threadIdx.x == 0) {
        unsigned* done = rope.split_done + static_cast<std::size_t>(seq) * kv_heads + kvh;
        last = atomicAdd(done, 1u) == static_cast<unsigned>(splits - 1);
        if (last) *done = 0u;  // zero for the next call
      }
      __syncthreads();
      if (last) {
        __threadfence();
        __nv_bfloat16* qrow = static_cast<__nv_bfloat16*>(rope.qkv) + static_cast<std::size_t>(row) * width;
        for (int idx = threadIdx.x; idx < G * D; idx += blockDim.x) {
          const int g = idx / D, d = idx % D, h = h0 + g;
          out[static_cast<std::size_t>(row) * heads * D + h * D + d] =
              combine_splits<__nv_bfloat16>(partials, seq, heads, h, D, d, splits);
          qrow[h * D + d] = q_b[g][d];
        }
      }
    }
  }
}

// grid (heads, seqs), block head_dim threads (≤ 256): merges a row's splits.
template <class T>
__global__ void combine_kernel(const std::int32_t* q_start, int heads, int head_dim, int splits,
                               const float* partials, T* out) {
  grid_dep_wait();
  grid_dep_trigger();
  const int h = blockIdx.x, seq = blockIdx.y, d = threadIdx.x;
  const int row = q_start[seq];
  if (q_start[seq + 1] - row != 1 || d >= head_dim) return;
  out[static_cast<std::size_t>(row) * heads * head_dim + h * head_dim + d] =
      combine_splits<T>(partials, seq, heads, h, head_dim, d, splits);
}

/// The grouped decode kernels' launch extras: PDL, and tune.decode_carveout (≥ 0) as the preferred
/// shared-memory carveout.
launch_extras decode_extras(const attention_tuning& tune) { return launch_extras{tune.pdl, tune.decode_carveout}; }

/// Raises `kernel`'s dynamic shared-memory limit to `bytes` on the current device, once per device
/// and kernel (bit per device ordinal; past 63, at every launch), as launch_prefill_gqa does.
template <auto kernel>
void raise_smem_once(std::size_t bytes) {
  static std::atomic<unsigned long long> raised{0};
  int dev = 0;
  CONVEYOR_CUDA_CHECK(cudaGetDevice(&dev));
  const unsigned long long bit = dev < 64 ? 1ull << dev : 0ull;
  if (bit == 0 || (raised.load(std::memory_order_relaxed) & bit) == 0) {
    CONVEYOR_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
    raised.fetch_or(bit, std::memory_order_relaxed);
  }
}

/// The rope_kv the caller handed over, run on its own (where the attention kernel cannot take it).
void run_rope_kv(const attention_rope_kv& r, dtype t, const attn_shape& sh, const attention_tuning& tune,
                 cudaStream_t s) {
  if (r.parts != nullptr) {  // the qkv linear's K slices into qkv first (bf16 only: the caller's check)
    const int width = (sh.num_heads + 2 * sh.num_kv_heads) * sh.head_dim;
    launch_sum_parts(r.parts, r.splits, r.n, width, r.bias, r.qkv, s, tune.pdl);
  }
  launch_rope_kv(t, r.qkv, r.n, sh, r.positions, r.inv_freq, r.scaling, r.slots, r.k_cache, r.v_cache, s, tune.pdl);
}

// Row-invariant splits (attention_tuning::split_len): runs of `len` keys from each row's first key,
// so a row's partial results, and the order the combine adds them, depend on its own context only;
// a split past a row's last key leaves (m = -inf, l = 0, o = 0), which adds exact zeros, and one
// non-empty split combined equals the single-split path's acc / l. Where the scratch cannot hold
// that many partial results the runs double (then rows are invariant only among calls alike).
void fixed_splits(const attention_batch& b, int heads, int D, int len, std::size_t partial_floats, int& splits,
                  int& split_len) {
  split_len = (len + 31) / 32 * 32;
  splits = std::max(1, (b.max_ctx_len + split_len - 1) / split_len);
  while (splits > 1 && attention_partial_floats(b.num_seqs, heads, D, splits) > partial_floats) {
    split_len *= 2;
    splits = std::max(1, (b.max_ctx_len + split_len - 1) / split_len);
  }
}

// launch_gqa's choices of kernel, apart from the dtype, head_dim and group checks.
bool wide_decode(const attention_tuning& tune, int splits, int base_blocks, int num_sms) {
  return tune.wide_decode && static_cast<long>(splits) * base_blocks < num_sms;
}
bool tc_decode_ring(const attention_tuning& tune, int splits, int base_blocks, int num_sms) {
  return tune.vec_decode && !wide_decode(tune, splits, base_blocks, num_sms) && tune.tc_decode && tune.ring_decode > 0;
}

template <class T, int DC, int G>
void launch_gqa(const T* qkv, const attn_shape& sh, const attention_batch& b, const kv_layout& layout, const T* k,
                const T* v, T* out, float* partials, std::size_t partial_floats, int num_sms,
                const attention_tuning& tune, cudaStream_t s, const attention_rope_kv* rope) {
  const int D = sh.head_dim;
  const int base_blocks = b.num_seqs * sh.num_kv_heads;
  int splits = std::max(1, (2 * num_sms + base_blocks - 1) / base_blocks);
  // At least split_min_keys (256) keys per split: a short context in one split needs no combine launch.
  const int min_keys = std::max(32, tune.split_min_keys);
  splits = std::min(splits, std::max(1, (b.max_ctx_len + min_keys - 1) / min_keys));
  // Up to one_split_max_keys keys, one split even at batch 1: the fused rope prologue and no combine
  // launch beat more blocks there (session 30, H100, b=1 at contexts 512-640: 1.068 vs 1.125 ms at 1024).
  if (b.max_ctx_len <= tune.one_split_max_keys) splits = 1;
  while (splits > 1 && attention_partial_floats(b.num_seqs, sh.num_heads, D, splits) > partial_floats) --splits;
  int split_len = (b.max_ctx_len + splits - 1) / splits;
  split_len = (split_len + 31) / 32 * 32;
  if (tune.split_len > 0) fixed_splits(b, sh.num_heads, D, tune.split_len, partial_floats, splits, split_len);
  const dim3 grid(splits, sh.num_kv_heads, b.num_seqs);
  bool launched = false, merged = false;  // merged: the kernel's last split combined the splits
  if constexpr (std::is_same_v<T, __nv_bfloat16> && (DC == 2 || (DC == 4 && G <= 4))) {
    if (tune.vec_decode && D == 32 * DC) {
      // Not under fixed splits (batch_invariant): a verification step hands attention one query row
      // per "sequence", and rows of one real sequence read each other's new keys, which a fused
      // prologue of another block may not have written yet; the unfused order also keeps plain decode
      // and verification on the same arithmetic.
      const bool fuse_one = rope != nullptr && splits == 1 && rope->n == b.num_seqs && tune.split_len == 0;
      // Several splits take the prologue too where the ring kernel runs (each split ropes the query
      // heads, the new key's split writes it, the last split merges): no rope_kv, no combine launch.
      const bool ring_runs = DC == 2 && G <= 8 && D == 64 && tc_decode_ring(tune, splits, base_blocks, num_sms);
      const bool fuse_split = rope != nullptr && splits > 1 && tune.fuse_splits && ring_runs && tune.rope_once &&
                              rope->n == b.num_seqs && tune.split_len == 0 && rope->split_done != nullptr &&
                              static_cast<long>(b.num_seqs) * sh.num_kv_heads <= rope->split_done_count;
      const bool fuse = fuse_one || fuse_split;
      if (rope != nullptr && !fuse) run_rope_kv(*rope, dtype::bf16, sh, tune, s);
      attention_rope_kv r = fuse ? *rope : attention_rope_kv{};
      r.once = tune.rope_once;
      r.late_trigger = tune.late_trigger;
      rope = nullptr;
      auto go = [&](auto kernel, int w) {
        launch_kx(decode_extras(tune), kernel, grid, dim3(32 * w), 0, s, qkv, sh.num_heads, sh.num_kv_heads, sh.scale,
                 sh.sliding_window, b.q_start, b.ctx_len, b.block_table, b.max_blocks_per_seq, layout.block_size, k,
                 v, split_len, partials, out, r);
      };
      const bool wide = wide_decode(tune, splits, base_blocks, num_sms);
      if constexpr (DC == 2 && G <= 8) {
        if (!wide && tune.tc_decode && tune.ring_decode > 0) {  // tc_decode_ring
          const int p = tune.ring_decode >= 2 ? 2 : 1;
          auto ring = [&](auto with_rope, auto stages) {
            constexpr auto kernel = &decode_gqa_ring_kernel<G, decltype(with_rope)::value, decltype(stages)::value>;
            const std::size_t smem = ring_smem_bytes(decltype(stages)::value);
            raise_smem_once<kernel>(smem);
            launch_kx(decode_extras(tune), kernel, grid, dim3(block_threads), smem, s, qkv, sh.num_heads, sh.num_kv_heads,
                     sh.scale, sh.sliding_window, b.q_start, b.ctx_len, b.block_table, b.max_blocks_per_seq,
                     layout.block_size, k, v, split_len, partials, out, r);
          };
          using one = std::integral_constant<int, 1>;
          using two = std::integral_constant<int, 2>;
          if (p == 1) {
            fuse ? ring(std::true_type{}, one{}) : ring(std::false_type{}, one{});
          } else {
            fuse ? ring(std::true_type{}, two{}) : ring(std::false_type{}, two{});
          }
          launched = true;
          merged = fuse && splits > 1;
        } else if (!wide && tune.tc_decode) {
          if (fuse && tune.early_decode) {
            go(decode_gqa_tc_kernel<G, true, true>, 4);
          } else {
            fuse ? go(decode_gqa_tc_kernel<G, true>, 4) : go(decode_gqa_tc_kernel<G, false>, 4);
          }
          launched = true;
        }
      }
      if (!launched && wide) {
        fuse ? go(decode_gqa_vec_kernel<32 * DC, G, true, 16>, 16) : go(decode_gqa_vec_kernel<32 * DC, G, false, 16>, 16);
      } else if (!launched) {
        fuse ? go(decode_gqa_vec_kernel<32 * DC, G, true, 4>, 4) : go(decode_gqa_vec_kernel<32 * DC, G, false, 4>, 4);
      }
      launched = true;
    }
  }
  if (rope != nullptr) run_rope_kv(*rope, std::is_same_v<T, float> ? dtype::f32 : dtype::bf16, sh, tune, s);
  if (!launched) {
    launch_k(tune.pdl, decode_gqa_kernel<T, DC, G>, grid, dim3(block_threads), 0, s, qkv, sh.num_heads,
             sh.num_kv_heads, D, sh.scale, sh.sliding_window, b.q_start, b.ctx_len, b.block_table,
             b.max_blocks_per_seq, layout.block_size, k, v, split_len, partials, out);
  }
  CONVEYOR_CUDA_LAUNCHED("attention decode gqa");
  if (splits > 1 && !merged) {
    launch_k(tune.pdl, combine_kernel<T>, dim3(sh.num_heads, b.num_seqs), dim3(D), 0, s, b.q_start, sh.num_heads, D,
             splits, partials, out);
    CONVEYOR_CUDA_LAUNCHED("attention combine");
  }
}

// Grouped decode where the group's accumulators stay few (G × DC ≤ 16 per lane).
template <class T, int DC>
bool try_gqa(const T* qkv, const attn_shape& sh, const attention_batch& b, const kv_layout& layout, const T* k,
             const T* v, T* out, float* partials, std::size_t partial_floats, int num_sms,
             const attention_tuning& tune, cudaStream_t s, const attention_rope_kv* rope) {
  if (sh.num_kv_heads <= 0 || sh.num_heads % sh.num_kv_heads != 0) return false;
  const int group = sh.num_heads / sh.num_kv_heads;
  if (group == 2) {
    launch_gqa<T, DC, 2>(qkv, sh, b, layout, k, v, out, partials, partial_floats, num_sms, tune, s, rope);
    return true;
  }
  if constexpr (DC <= 4) {
    if (group == 4) {
      launch_gqa<T, DC, 4>(qkv, sh, b, layout, k, v, out, partials, partial_floats, num_sms, tune, s, rope);
      return true;
    }
  }
  if constexpr (DC <= 2) {
    if (group == 8) {
      launch_gqa<T, DC, 8>(qkv, sh, b, layout, k, v, out, partials, partial_floats, num_sms, tune, s, rope);
      return true;
    }
  }
  return false;
}

template <class T, int DC>
void run(const T* qkv, const attn_shape& sh, const attention_batch& b, const kv_layout& layout, const T* k,
         const T* v, T* out, float* partials, std::size_t partial_floats, int num_sms, const attention_tuning& tune,
         cudaStream_t s, const attention_rope_kv* rope) {
  const int D = sh.head_dim;
  if (b.max_q_len == 1 && tune.gqa_decode &&
      try_gqa<T, DC>(qkv, sh, b, layout, k, v, out, partials, partial_floats, num_sms, tune, s, rope)) {
    return;
  }
  if (rope != nullptr) run_rope_kv(*rope, std::is_same_v<T, float> ? dtype::f32 : dtype::bf16, sh, tune, s);
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    if (b.max_q_len > 1 && tune.tc_prefill && sh.num_kv_heads > 0 && sh.num_heads % sh.num_kv_heads == 0 &&
        (D == 64 || D == 128)) {
      launch_prefill_tc(qkv, sh, b, layout, k, v, out, tune.gqa_prefill, s);  // attention_prefill.cu
      return;
    }
  }
  if (b.max_q_len == 1) {
    // Enough blocks to fill the GPU twice, at least 128 keys per split, within the scratch.
    const int base_blocks = b.num_seqs * sh.num_heads;
    int splits = std::max(1, (2 * num_sms + base_blocks - 1) / base_blocks);
    splits = std::min(splits, std::max(1, (b.max_ctx_len + 127) / 128));
    while (splits > 1 && attention_partial_floats(b.num_seqs, sh.num_heads, D, splits) > partial_floats) --splits;
    int split_len = (b.max_ctx_len + splits - 1) / splits;
    split_len = (split_len + 31) / 32 * 32;
    if (tune.split_len > 0) fixed_splits(b, sh.num_heads, D, tune.split_len, partial_floats, splits, split_len);
    decode_kernel<T, DC><<<dim3(splits, sh.num_heads, b.num_seqs), block_threads, 0, s>>>(
        qkv, sh.num_heads, sh.num_kv_heads, D, sh.scale, sh.sliding_window, b.q_start, b.ctx_len, b.block_table,
        b.max_blocks_per_seq, layout.block_size, k, v, split_len, partials, out);
    CONVEYOR_CUDA_LAUNCHED("attention decode");
    if (splits > 1) {
      combine_kernel<T><<<dim3(sh.num_heads, b.num_seqs), D, 0, s>>>(b.q_start, sh.num_heads, D, splits, partials,
                                                                     out);
      CONVEYOR_CUDA_LAUNCHED("attention combine");
    }
    return;
  }
  const std::size_t smem = sizeof(float) * (q_tile * D + key_tile * (D + 1) + key_tile * D);
  CONVEYOR_CUDA_CHECK(cudaFuncSetAttribute(prefill_kernel<T, DC>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem)));
  const dim3 grid((b.max_q_len + q_tile - 1) / q_tile, sh.num_heads, b.num_seqs);
  prefill_kernel<T, DC><<<grid, block_threads, smem, s>>>(qkv, sh.num_heads, sh.num_kv_heads, D, sh.scale,
                                                          sh.sliding_window, b.q_start, b.ctx_len, b.block_table,
                                                          b.max_blocks_per_seq, layout.block_size, k, v, out);
  CONVEYOR_CUDA_LAUNCHED("attention prefill");
}

template <class T>
void run_t(const void* qkv, const attn_shape& sh, const attention_batch& b, const kv_layout& layout,
           const void* k, const void* v, void* out, float* partials, std::size_t partial_floats, int num_sms,
           const attention_tuning& tune, cudaStream_t s, const attention_rope_kv* rope) {
  auto go = [&](auto dc) {
    run<T, decltype(dc)::value>(static_cast<const T*>(qkv), sh, b, layout, static_cast<const T*>(k),
                                static_cast<const T*>(v), static_cast<T*>(out), partials, partial_floats, num_sms,
                                tune, s, rope);
  };
  const int D = sh.head_dim;
  if (D <= 32) go(std::integral_constant<int, 1>{});
  else if (D <= 64) go(std::integral_constant<int, 2>{});
  else if (D <= 96) go(std::integral_constant<int, 3>{});
  else if (D <= 128) go(std::integral_constant<int, 4>{});
  else go(std::integral_constant<int, 8>{});
}

}  // namespace

std::size_t attention_partial_floats(int num_seqs, int num_heads, int head_dim, int splits) {
  return static_cast<std::size_t>(num_seqs) * num_heads * splits * (head_dim + 2);
}

void launch_attention(dtype t, const void* qkv, const attn_shape& shape, const attention_batch& batch,
                      const kv_layout& layout, const void* k_cache, const void* v_cache, void* out,
                      float* partials, std::size_t partial_floats, int num_sms, const attention_tuning& tune,
                      cudaStream_t s, const attention_rope_kv* rope) {
  if (rope != nullptr && (batch.num_seqs <= 0 || batch.max_q_len <= 0)) {
    run_rope_kv(*rope, t, shape, tune, s);
    rope = nullptr;
  }
  if (batch.num_seqs <= 0 || batch.max_q_len <= 0) return;
  if (shape.head_dim > 256 || shape.head_dim <= 0) {
    fail_cuda("attention", "head_dim above 256 is not implemented", __FILE__, __LINE__);
  }
  if (t == dtype::bf16) {
    run_t<__nv_bfloat16>(qkv, shape, batch, layout, k_cache, v_cache, out, partials, partial_floats, num_sms, tune,
                         s, rope);
  } else {
    run_t<float>(qkv, shape, batch, layout, k_cache, v_cache, out, partials, partial_floats, num_sms, tune, s, rope);
  }
}

}  // namespace conveyor::kernels::cuda
