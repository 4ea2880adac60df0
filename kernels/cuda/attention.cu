// Attention over the paged KV cache (layout contract in backend.hpp).
// - prefill_kernel: FlashAttention-style. A block owns BQ query rows of one head; K/V tiles of 32 keys
//   are staged in shared memory and folded in with an online softmax, so no T×T matrix exists.
// - decode_kernel + combine_kernel: flash-decoding. With one query row per sequence a block per
//   (sequence, head) leaves the GPU idle on long contexts, so the keys are split across blocks that
//   each write (max, sum, unnormalised output) and a second kernel merges the splits.
// Arithmetic is float32 on CUDA cores throughout. TODO(perf): tensor-core (wgmma) tiles, K/V
// staged once per GQA group instead of per query head, 16-byte loads.
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "device_types.cuh"
#include "launch.hpp"

namespace conveyor::kernels::cuda {

namespace {

constexpr int warps = 4;
constexpr int block_threads = warps * 32;
constexpr int key_tile = 32;
constexpr int rows_per_warp = 8;
constexpr int q_tile = warps * rows_per_warp;

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/// Cache element index of key `j` of a sequence (its block table row `table`), kv head `kvh`.
__device__ __forceinline__ std::size_t cache_index(const std::int32_t* table, int block_size, int j, int kv_heads,
                                                   int kvh, int head_dim) {
  const std::size_t slot = static_cast<std::size_t>(table[j / block_size]) * block_size + j % block_size;
  return (slot * kv_heads + kvh) * head_dim;
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

// grid (heads, seqs), block head_dim threads (≤ 256): merges a row's splits.
template <class T>
__global__ void combine_kernel(const std::int32_t* q_start, int heads, int head_dim, int splits,
                               const float* partials, T* out) {
  const int h = blockIdx.x, seq = blockIdx.y, d = threadIdx.x;
  const int row = q_start[seq];
  if (q_start[seq + 1] - row != 1 || d >= head_dim) return;
  const float* p = partials + (static_cast<std::size_t>(seq) * heads + h) * splits * (head_dim + 2);
  float m_all = -INFINITY;
  for (int i = 0; i < splits; ++i) m_all = fmaxf(m_all, p[i * (head_dim + 2)]);
  float l_all = 0.0f, acc = 0.0f;
  for (int i = 0; i < splits; ++i) {
    const float* pi = p + i * (head_dim + 2);
    const float w = exp_diff(pi[0], m_all);
    l_all += pi[1] * w;
    acc += pi[2 + d] * w;
  }
  out[static_cast<std::size_t>(row) * heads * head_dim + h * head_dim + d] = from_f32<T>(acc / l_all);
}

template <class T, int DC>
void run(const T* qkv, const attn_shape& sh, const attention_batch& b, const kv_layout& layout, const T* k,
         const T* v, T* out, float* partials, std::size_t partial_floats, int num_sms, cudaStream_t s) {
  const int D = sh.head_dim;
  if (b.max_q_len == 1) {
    // Enough blocks to fill the GPU twice, at least 128 keys per split, within the scratch.
    const int base_blocks = b.num_seqs * sh.num_heads;
    int splits = std::max(1, (2 * num_sms + base_blocks - 1) / base_blocks);
    splits = std::min(splits, std::max(1, (b.max_ctx_len + 127) / 128));
    while (splits > 1 && attention_partial_floats(b.num_seqs, sh.num_heads, D, splits) > partial_floats) --splits;
    int split_len = (b.max_ctx_len + splits - 1) / splits;
    split_len = (split_len + 31) / 32 * 32;
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
           cudaStream_t s) {
  auto go = [&](auto dc) {
    run<T, decltype(dc)::value>(static_cast<const T*>(qkv), sh, b, layout, static_cast<const T*>(k),
                                static_cast<const T*>(v), static_cast<T*>(out), partials, partial_floats, num_sms,
                                s);
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
                      float* partials, std::size_t partial_floats, int num_sms, cudaStream_t s) {
  if (batch.num_seqs <= 0 || batch.max_q_len <= 0) return;
  if (shape.head_dim > 256 || shape.head_dim <= 0) {
    fail_cuda("attention", "head_dim above 256 is not implemented", __FILE__, __LINE__);
  }
  if (t == dtype::bf16) {
    run_t<__nv_bfloat16>(qkv, shape, batch, layout, k_cache, v_cache, out, partials, partial_floats, num_sms, s);
  } else {
    run_t<float>(qkv, shape, batch, layout, k_cache, v_cache, out, partials, partial_floats, num_sms, s);
  }
}

}  // namespace conveyor::kernels::cuda
