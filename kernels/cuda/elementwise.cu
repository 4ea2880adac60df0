// Memory-bound kernels of the CUDA backend: embedding, RMSNorm (+ fused residual add), add, bias,
// RoPE (+ fused KV-cache write), KV-cache writes, SwiGLU, row gather and dtype conversion; bf16 rows
// whose width allows it take 16-byte versions. Each one has a CPU twin in
// kernels/cpu and a parity test in tests/kernels/test_cuda_ops.cpp.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "device_types.cuh"
#include "launch.hpp"
#include "linear_epilogue.cuh"

namespace conveyor::kernels::cuda {

namespace {

constexpr unsigned threads = 256;

template <class T>
__global__ void embedding_kernel(const std::int32_t* ids, const T* table, int width, T* out) {
  const std::size_t row = blockIdx.y;
  const T* src = table + static_cast<std::size_t>(ids[row]) * width;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < width; i += gridDim.x * blockDim.x) {
    out[row * width + i] = src[i];
  }
}

template <class T>
__global__ void gather_kernel(const T* x, const std::int32_t* rows, int width, T* out) {
  const std::size_t row = blockIdx.y;
  const T* src = x + static_cast<std::size_t>(rows[row]) * width;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < width; i += gridDim.x * blockDim.x) {
    out[row * width + i] = src[i];
  }
}

// Sum of a block's values; every thread gets the total. Double, as the CPU twin, so the norm does
// not depend on the order of summation.
__device__ double block_sum(double v, double* shared) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  double total = 0.0;
  for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) total += shared[w];
  __syncthreads();
  return total;
}

// One block per row. With `residual`, the row is residual += x first (stored in T, as HF keeps the
// residual stream in the model dtype), and the rounded sum is what gets normalised.
template <class T>
__global__ void rmsnorm_kernel(T* residual, const T* x, int width, const float* w, float eps, T* out) {
  __shared__ double partial[32];
  const std::size_t base = static_cast<std::size_t>(blockIdx.x) * width;
  double ss = 0.0;
  for (int i = threadIdx.x; i < width; i += blockDim.x) {
    float v;
    if (residual != nullptr) {
      const T sum = from_f32<T>(to_f32(residual[base + i]) + to_f32(x[base + i]));
      residual[base + i] = sum;
      v = to_f32(sum);
    } else {
      v = to_f32(x[base + i]);
    }
    ss += static_cast<double>(v) * v;
  }
  ss = block_sum(ss, partial);
  const float inv = 1.0f / sqrtf(static_cast<float>(ss / width) + eps);
  const T* src = residual != nullptr ? residual : x;
  for (int i = threadIdx.x; i < width; i += blockDim.x) {
    out[base + i] = from_f32<T>(w[i] * (to_f32(src[base + i]) * inv));
  }
}

template <class T>
__global__ void add_kernel(T* acc, const T* x, std::size_t count) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    acc[i] = from_f32<T>(to_f32(acc[i]) + to_f32(x[i]));
  }
}

template <class T>
__global__ void add_bias_kernel(T* out, const float* bias, int width) {
  const std::size_t row = blockIdx.y;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < width; i += gridDim.x * blockDim.x) {
    out[row * width + i] = from_f32<T>(to_f32(out[row * width + i]) + bias[i]);
  }
}

// One thread per (token, group of 8 heads, frequency): rotates the pair (i, i + half) of each q or k
// head in its group with one sine and cosine (one per head cost prefill a double-precision sincos per
// element). With KV it also stores the k and v heads into their cache slots (rope and kv_write in one
// pass). Angle rounded to float32 as torch does; cos/sin in double and rounded, as the CPU twin.
constexpr int rope_group = 8;
template <class T, bool KV>
__global__ void rope_kv_kernel(T* qkv, int n, int heads, int kv_heads, int head_dim, const std::int32_t* positions,
                               const float* inv_freq, float scaling, const std::int32_t* slots, T* k_cache,
                               T* v_cache) {
  grid_dep_wait();
  grid_dep_trigger();
  const int half = head_dim / 2;
  const int roped = heads + kv_heads;
  const int all = KV ? roped + kv_heads : roped;
  const int groups = (all + rope_group - 1) / rope_group;
  const int per_token = groups * half;
  const std::size_t idx = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (idx >= static_cast<std::size_t>(n) * per_token) return;
  const int t = static_cast<int>(idx / per_token);
  const int rem = static_cast<int>(idx % per_token);
  const int h0 = (rem / half) * rope_group, i = rem % half;
  const int width = (heads + 2 * kv_heads) * head_dim;
  T* row = qkv + static_cast<std::size_t>(t) * width;
  float cos_v = 0.0f, sin_v = 0.0f;
  if (h0 < roped) {
    const float angle = static_cast<float>(positions[t]) * inv_freq[i];
    double sn, cs;
    sincos(static_cast<double>(angle), &sn, &cs);
    cos_v = static_cast<float>(cs) * scaling;
    sin_v = static_cast<float>(sn) * scaling;
  }
  const std::size_t slot = KV ? static_cast<std::size_t>(slots[t]) : 0;
  // Every head's pair is loaded before the first store: loads after a store to the same row could
  // alias it, so the compiler kept them in order (one memory round trip per head: rope_kv ran at a
  // quarter of the copy bandwidth in prefill).
  T pa[rope_group], pb[rope_group];
#pragma unroll
  for (int u = 0; u < rope_group; ++u) {
    const int h = h0 + u;
    if (h < all) {
      const T* x = row + static_cast<std::size_t>(h) * head_dim;
      pa[u] = x[i];
      pb[u] = x[i + half];
    }
  }
#pragma unroll
  for (int u = 0; u < rope_group; ++u) {
    const int h = h0 + u;
    if (h >= all) break;
    T* x = row + static_cast<std::size_t>(h) * head_dim;
    T a = pa[u], b = pb[u];
    if (h < roped) {
      const float xa = to_f32(a), xb = to_f32(b);
      a = from_f32<T>(xa * cos_v - xb * sin_v);
      b = from_f32<T>(xb * cos_v + xa * sin_v);
      x[i] = a;
      x[i + half] = b;
    }
    if (KV && h >= heads) {
      const bool is_k = h < roped;
      const int kvh = is_k ? h - heads : h - roped;
      T* dst = (is_k ? k_cache : v_cache) + (slot * kv_heads + kvh) * head_dim;
      dst[i] = a;
      dst[i + half] = b;
    }
  }
}

template <class T>
__global__ void kv_write_kernel(const T* qkv, int q_width, int kv_width, int width, const std::int32_t* slots,
                                T* k_cache, T* v_cache) {
  const std::size_t t = blockIdx.y;
  const std::size_t slot = static_cast<std::size_t>(slots[t]);
  const T* row = qkv + t * width + q_width;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < kv_width; i += gridDim.x * blockDim.x) {
    k_cache[slot * kv_width + i] = row[i];
    v_cache[slot * kv_width + i] = row[kv_width + i];
  }
}

template <class T>
__global__ void silu_mul_kernel(const T* gate_up, int ffn, T* out) {
  const std::size_t row = blockIdx.y;
  const T* g = gate_up + row * 2 * ffn;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < ffn; i += gridDim.x * blockDim.x) {
    const float gv = to_f32(g[i]);
    out[row * ffn + i] = from_f32<T>(gv / (1.0f + expf(-gv)) * to_f32(g[ffn + i]));
  }
}

template <class T>
__global__ void from_f32_kernel(const float* src, std::size_t count, T* dst) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    dst[i] = from_f32<T>(src[i]);
  }
}

// A small upload read by the GPU straight from pinned host memory, with `ovl_words` words from
// device memory laid over it at `ovl_at` (a decode step's ids taken from the previous step's draw).
// A thread's first upload_early host words are read before griddepcontrol.wait: the host wrote them
// before the launch and no kernel writes them, so launched as a programmatic dependent of the
// sampling kernel (cuda_backend_options::upload_pdl) the PCIe round trip (~2 µs) overlaps that
// kernel's drain; the overlay, which that kernel writes, and every store come after the wait.
constexpr int upload_early = 4;
__global__ void upload_words_kernel(std::uint32_t* dst, const std::uint32_t* host, int words,
                                    const std::uint32_t* ovl, int ovl_at, int ovl_words) {
  const int first = blockIdx.x * blockDim.x + threadIdx.x, stride = gridDim.x * blockDim.x;
  std::uint32_t early[upload_early];
#pragma unroll
  for (int j = 0; j < upload_early; ++j) {
    const int i = first + j * stride;
    early[j] = host != nullptr && i < words ? host[i] : 0u;
  }
  grid_dep_wait();
  grid_dep_trigger();
  auto put = [&](int i, std::uint32_t from_host) {
    const unsigned k = static_cast<unsigned>(i - ovl_at);
    dst[i] = k < static_cast<unsigned>(ovl_words) ? ovl[k] : from_host;
  };
#pragma unroll
  for (int j = 0; j < upload_early; ++j) {
    const int i = first + j * stride;
    if (i < words) put(i, early[j]);
  }
  for (int i = first + upload_early * stride; i < words; i += stride) put(i, host != nullptr ? host[i] : 0u);
}

// --- 16-byte (8 × bf16) versions of the memory-bound kernels, used where widths allow ---
using bf16 = __nv_bfloat16;

// One block per row, each thread up to 4 chunks of 8 held in registers between the two passes.
constexpr int norm_chunks_per_thread = 4;
// Threads a block of the 16-byte norm kernels: as few as hold a row's chunks at
// norm_chunks_per_thread each (at most 1024), a whole number of warps.
unsigned norm_bf16x8_threads(int width) {
  const int chunks = width / 8;
  const int per_thread = (chunks + 1023) / 1024;
  const int per_block = (chunks + per_thread - 1) / per_thread;
  return static_cast<unsigned>(std::max(32, (per_block + 31) / 32 * 32));
}
// The norm weights of a thread's chunks (8 floats a chunk), held in registers until the row is normed.
template <int CH>
struct norm_w8 {
  float4 lo[CH], hi[CH];
};
template <int CH>
__device__ __forceinline__ void load_norm_w8(norm_w8<CH>& nw, const float* w, int chunks) {
#pragma unroll
  for (int j = 0; j < CH; ++j) {
    const int c = threadIdx.x + j * blockDim.x;
    if (c >= chunks) break;
    nw.lo[j] = reinterpret_cast<const float4*>(w)[2 * c];
    nw.hi[j] = reinterpret_cast<const float4*>(w)[2 * c + 1];
  }
}
// The second half of both 16-byte norm kernels: out = w * (v * inv), v the row's chunks in registers.
template <int CH>
__device__ __forceinline__ void store_normed_bf16x8(uint4 (&v)[CH], const norm_w8<CH>& nw, float inv, int chunks,
                                                    bf16* out_row) {
#pragma unroll
  for (int j = 0; j < CH; ++j) {
    const int c = threadIdx.x + j * blockDim.x;
    if (c >= chunks) break;
    const float wv[8] = {nw.lo[j].x, nw.lo[j].y, nw.lo[j].z, nw.lo[j].w, nw.hi[j].x, nw.hi[j].y, nw.hi[j].z, nw.hi[j].w};
    std::uint32_t* p = reinterpret_cast<std::uint32_t*>(&v[j]);
#pragma unroll
    for (int e = 0; e < 4; ++e) p[e] = pack_bf16x2(wv[2 * e] * (bf_lo(p[e]) * inv), wv[2 * e + 1] * (bf_hi(p[e]) * inv));
    reinterpret_cast<uint4*>(out_row)[c] = v[j];
  }
}
/// v += r, eight bf16 pairs, each sum rounded to bf16 (the residual add of the op-by-op path).
__device__ __forceinline__ void add_bf16x8(uint4& v, const uint4& r) {
  std::uint32_t* p = reinterpret_cast<std::uint32_t*>(&v);
  const std::uint32_t* rp = reinterpret_cast<const std::uint32_t*>(&r);
#pragma unroll
  for (int e = 0; e < 4; ++e) p[e] = pack_bf16x2(bf_lo(rp[e]) + bf_lo(p[e]), bf_hi(rp[e]) + bf_hi(p[e]));
}
__device__ __forceinline__ double sum_squares_bf16x8(const uint4& v) {
  const std::uint32_t* p = reinterpret_cast<const std::uint32_t*>(&v);
  double ss = 0.0;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const double a = bf_lo(p[e]), b = bf_hi(p[e]);
    ss += a * a + b * b;
  }
  return ss;
}

// AHEAD (cuda_backend_options::norm_loads_ahead): 1, every load a thread needs is in flight before it
// uses any; 2, and the norm weights are requested before griddepcontrol.wait (no kernel writes them).
// With 0 the weights come after the block's sum (one more L2 round trip on the critical path), and the
// split kernel reads the residual after its slices and its slices one at a time below 4 (nvcc unrolls
// that runtime loop by 4 and issues the remainder one by one): up to 4 round trips at S = 2 against 1.
// The same sums in the same order either way, so the outputs are bit-identical. CH: chunks a thread
// (norm_bf16x8_threads), fixed at compile time so that the registers are those of CH chunks, not of
// norm_chunks_per_thread: a block may have 1024 threads, i.e. at most 64 registers a thread.
template <int AHEAD, int CH>
__global__ void __launch_bounds__(1024) rmsnorm_bf16x8_kernel(bf16* residual, const bf16* x, int width, const float* w, float eps,
                                      bf16* out, bool late_trigger) {
  __shared__ double partial[32];
  const std::size_t base = static_cast<std::size_t>(blockIdx.x) * width;
  const int chunks = width / 8;
  norm_w8<CH> nw;
  if constexpr (AHEAD == 2) load_norm_w8(nw, w, chunks);
  grid_dep_wait();
  if (!late_trigger) grid_dep_trigger();
  if constexpr (AHEAD == 1) load_norm_w8(nw, w, chunks);
  uint4 v[CH], r[CH];
#pragma unroll
  for (int j = 0; j < CH; ++j) {
    const int c = threadIdx.x + j * blockDim.x;
    if (c >= chunks) break;
    v[j] = reinterpret_cast<const uint4*>(x + base)[c];
    if (residual != nullptr) r[j] = reinterpret_cast<const uint4*>(residual + base)[c];
  }
  double ss = 0.0;
#pragma unroll
  for (int j = 0; j < CH; ++j) {
    const int c = threadIdx.x + j * blockDim.x;
    if (c >= chunks) break;
    if (residual != nullptr) {
      add_bf16x8(v[j], r[j]);
      reinterpret_cast<uint4*>(residual + base)[c] = v[j];
    }
    ss += sum_squares_bf16x8(v[j]);
  }
  ss = block_sum(ss, partial);
  if (late_trigger) grid_dep_trigger();  // every load of this block is in
  if constexpr (AHEAD == 0) load_norm_w8(nw, w, chunks);
  store_normed_bf16x8(v, nw, 1.0f / sqrtf(static_cast<float>(ss / width) + eps), chunks, out + base);
}

// Asks L2 for pf's bytes, a row a thread across the grid (l2_prefetch). Called before
// griddepcontrol.wait: weights never depend on the kernel before, and HBM idles while this
// kernel waits for and works on its small inputs. The requests complete on their own; nothing
// here waits for them.
__device__ __forceinline__ void issue_l2_prefetch(const l2_prefetch& pf) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (pf.base == nullptr) return;
  const int stride = static_cast<int>(gridDim.x * blockDim.x);
  for (int r = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); r < pf.rows; r += stride) {
    const char* p = static_cast<const char*>(pf.base) + static_cast<std::size_t>(r) * pf.pitch;
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(pf.row_bytes) : "memory");
  }
#endif
}

// The K slices split_add_rmsnorm_bf16x8_kernel<true> reads at once (lt_gemm::max_split; the
// launcher takes the one-at-a-time kernel for more).
constexpr int split_norm_ahead_max = 4;

// rmsnorm_bf16x8_kernel after a linear cut along K (lt_gemm::run_split): the linear's output is first
// summed from its `splits` float32 slices (in slice order) and rounded to bf16 as the GEMM would
// store it (its bias added after, as launch_add_bias does), written to delta, then
// residual += delta and out = rmsnorm(residual) * w exactly as rmsnorm_bf16x8_kernel rounds them.
template <int AHEAD, int CH>
__global__ void __launch_bounds__(1024) split_add_rmsnorm_bf16x8_kernel(const float* parts, int splits, std::size_t slice,
                                                const float* bias, bf16* delta, bf16* residual, int width,
                                                const float* w, float eps, bf16* out, bool late_trigger,
                                                l2_prefetch pf) {
  __shared__ double partial[32];
  const std::size_t base = static_cast<std::size_t>(blockIdx.x) * width;
  const int chunks = width / 8;
  norm_w8<CH> nw;
  if constexpr (AHEAD == 2) load_norm_w8(nw, w, chunks);
  issue_l2_prefetch(pf);
  grid_dep_wait();
  if (!late_trigger) grid_dep_trigger();
  if constexpr (AHEAD == 1) load_norm_w8(nw, w, chunks);
  uint4 v[CH];
  double ss = 0.0;
#pragma unroll
  for (int j = 0; j < CH; ++j) {
    const int c = threadIdx.x + j * blockDim.x;
    if (c >= chunks) break;
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    uint4 r;
    auto add = [&](const float4& a, const float4& b) {
      acc[0] += a.x;
      acc[1] += a.y;
      acc[2] += a.z;
      acc[3] += a.w;
      acc[4] += b.x;
      acc[5] += b.y;
      acc[6] += b.z;
      acc[7] += b.w;
    };
    if constexpr (AHEAD > 0) {
      float4 pa[split_norm_ahead_max], pb[split_norm_ahead_max];
#pragma unroll
      for (int sp = 0; sp < split_norm_ahead_max; ++sp) {
        if (sp < splits) {
          const float4* src = reinterpret_cast<const float4*>(parts + sp * slice + base) + 2 * c;
          pa[sp] = __ldcg(src);
          pb[sp] = __ldcg(src + 1);
        }
      }
      r = reinterpret_cast<const uint4*>(residual + base)[c];
#pragma unroll
      for (int sp = 0; sp < split_norm_ahead_max; ++sp) {
        if (sp < splits) add(pa[sp], pb[sp]);
      }
    } else {
      for (int sp = 0; sp < splits; ++sp) {
        const float4* src = reinterpret_cast<const float4*>(parts + sp * slice + base) + 2 * c;
        add(__ldcg(src), __ldcg(src + 1));
      }
    }
    std::uint32_t* p = reinterpret_cast<std::uint32_t*>(&v[j]);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      p[e] = pack_bf16x2(linear_out_value(acc[2 * e], bias, c * 8 + 2 * e),
                         linear_out_value(acc[2 * e + 1], bias, c * 8 + 2 * e + 1));
    }
    reinterpret_cast<uint4*>(delta + base)[c] = v[j];
    if constexpr (AHEAD == 0) r = reinterpret_cast<const uint4*>(residual + base)[c];
    add_bf16x8(v[j], r);
    reinterpret_cast<uint4*>(residual + base)[c] = v[j];
    ss += sum_squares_bf16x8(v[j]);
  }
  ss = block_sum(ss, partial);
  if (late_trigger) grid_dep_trigger();  // every load of this block is in
  if constexpr (AHEAD == 0) load_norm_w8(nw, w, chunks);
  store_normed_bf16x8(v, nw, 1.0f / sqrtf(static_cast<float>(ss / width) + eps), chunks, out + base);
}

// launch_sum_parts: one thread an entry (the fallback of a qkv left as K slices; the decode
// attention's prologue sums them itself).
__global__ void sum_parts_bf16_kernel(const float* parts, int splits, std::size_t count, int width, const float* bias,
                                      bf16* out) {
  grid_dep_wait();
  grid_dep_trigger();
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    float sum = 0.0f;
    for (int sp = 0; sp < splits; ++sp) sum += __ldcg(parts + sp * count + i);
    store_linear_out(sum, bias, static_cast<int>(i % width), out + i);
  }
}

__global__ void silu_mul_bf16x8_kernel(const bf16* gate_up, int n, int ffn, bf16* out, l2_prefetch pf) {
  issue_l2_prefetch(pf);
  grid_dep_wait();
  grid_dep_trigger();
  const int per_row = ffn / 8;
  const std::size_t total = static_cast<std::size_t>(n) * per_row;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t row = i / per_row, c = i % per_row;
    const bf16* g = gate_up + row * 2 * ffn;
    const uint4 gv = reinterpret_cast<const uint4*>(g)[c];
    const uint4 uv = reinterpret_cast<const uint4*>(g + ffn)[c];
    reinterpret_cast<uint4*>(out + row * ffn)[c] = make_uint4(silu_pair(gv.x, uv.x), silu_pair(gv.y, uv.y),
                                                             silu_pair(gv.z, uv.z), silu_pair(gv.w, uv.w));
  }
}

__global__ void add_bf16x8_kernel(bf16* acc, const bf16* x, std::size_t chunks) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < chunks;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    uint4 a = reinterpret_cast<const uint4*>(acc)[i];
    const uint4 b = reinterpret_cast<const uint4*>(x)[i];
    std::uint32_t* ap = reinterpret_cast<std::uint32_t*>(&a);
    const std::uint32_t* bp = reinterpret_cast<const std::uint32_t*>(&b);
#pragma unroll
    for (int e = 0; e < 4; ++e) ap[e] = pack_bf16x2(bf_lo(ap[e]) + bf_lo(bp[e]), bf_hi(ap[e]) + bf_hi(bp[e]));
    reinterpret_cast<uint4*>(acc)[i] = a;
  }
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// Grid for row kernels: y = rows (≤ 65535 per launch, so callers loop), x covers the width.
dim3 row_grid(int rows, int width) {
  return dim3(std::min(blocks_for(width, threads), 64u), static_cast<unsigned>(rows));
}
constexpr int max_grid_y = 65535;
unsigned flat_blocks(std::size_t count) { return std::min(blocks_for(count, threads), 65535u * 4); }

}  // namespace

void launch_embedding(dtype t, const std::int32_t* ids, int n, const void* table, int width, void* out,
                      cudaStream_t s) {
  CONVEYOR_DISPATCH_T(t, {
    for (int r0 = 0; r0 < n; r0 += max_grid_y) {
      const int rows = std::min(max_grid_y, n - r0);
      embedding_kernel<T><<<row_grid(rows, width), threads, 0, s>>>(
          ids + r0, static_cast<const T*>(table), width, static_cast<T*>(out) + static_cast<std::size_t>(r0) * width);
      CONVEYOR_CUDA_LAUNCHED("embedding");
    }
  });
}

void launch_gather_rows(dtype t, const void* x, const std::int32_t* rows, int n, int width, void* out,
                        cudaStream_t s) {
  CONVEYOR_DISPATCH_T(t, {
    for (int r0 = 0; r0 < n; r0 += max_grid_y) {
      const int cnt = std::min(max_grid_y, n - r0);
      gather_kernel<T><<<row_grid(cnt, width), threads, 0, s>>>(
          static_cast<const T*>(x), rows + r0, width, static_cast<T*>(out) + static_cast<std::size_t>(r0) * width);
      CONVEYOR_CUDA_LAUNCHED("gather_rows");
    }
  });
}

bool norm_bf16x8_fits(int width) { return width > 0 && width % 8 == 0 && width / 8 <= 1024 * norm_chunks_per_thread; }

namespace {
// The instances of a norm kernel by [ahead][chunks a thread: 1, 2, 3-4].
template <class K>
K pick_norm_kernel(int ahead, int width, const K (&kernels)[3][3]) {
  const int per_thread = (width / 8 + 1023) / 1024;
  return kernels[std::clamp(ahead, 0, 2)][per_thread <= 1 ? 0 : per_thread == 2 ? 1 : 2];
}
#define CONVEYOR_NORM_ROW(k, a) {k<a, 1>, k<a, 2>, k<a, 4>}
constexpr decltype(&rmsnorm_bf16x8_kernel<0, 1>) norm_kernels[3][3] = {CONVEYOR_NORM_ROW(rmsnorm_bf16x8_kernel, 0),
                                                                       CONVEYOR_NORM_ROW(rmsnorm_bf16x8_kernel, 1),
                                                                       CONVEYOR_NORM_ROW(rmsnorm_bf16x8_kernel, 2)};
// Rows of more than 8192 keep the split kernel's loads one chunk at a time: 2-4 chunks' slices at once
// would spill (216 bytes at 4).
constexpr decltype(&split_add_rmsnorm_bf16x8_kernel<0, 1>) split_norm_kernels[3][3] = {
    CONVEYOR_NORM_ROW(split_add_rmsnorm_bf16x8_kernel, 0),
    {split_add_rmsnorm_bf16x8_kernel<1, 1>, split_add_rmsnorm_bf16x8_kernel<0, 2>, split_add_rmsnorm_bf16x8_kernel<0, 4>},
    {split_add_rmsnorm_bf16x8_kernel<2, 1>, split_add_rmsnorm_bf16x8_kernel<0, 2>, split_add_rmsnorm_bf16x8_kernel<0, 4>}};
#undef CONVEYOR_NORM_ROW
}  // namespace

void launch_rmsnorm(dtype t, void* residual, const void* x, int n, int width, const float* w, float eps,
                    void* out, cudaStream_t s, norm_launch how) {
  if (n <= 0) return;
  if (t == dtype::bf16 && norm_bf16x8_fits(width) && aligned16(x) && aligned16(out) && aligned16(w) &&
      (residual == nullptr || aligned16(residual))) {
    const unsigned tpb = norm_bf16x8_threads(width);
    launch_k(how.pdl, pick_norm_kernel<decltype(&rmsnorm_bf16x8_kernel<0, 1>)>(how.loads_ahead, width, norm_kernels),
             dim3(n), dim3(tpb), 0, s, static_cast<bf16*>(residual), static_cast<const bf16*>(x), width, w, eps,
             static_cast<bf16*>(out), how.pdl && how.late_trigger);
    CONVEYOR_CUDA_LAUNCHED("rmsnorm bf16x8");
    return;
  }
  const unsigned tpb = width >= 1024 ? 512 : 128;
  CONVEYOR_DISPATCH_T(t, {
    rmsnorm_kernel<T><<<n, tpb, 0, s>>>(static_cast<T*>(residual), static_cast<const T*>(x), width, w, eps,
                                        static_cast<T*>(out));
    CONVEYOR_CUDA_LAUNCHED("rmsnorm");
  });
}

bool launch_split_add_rmsnorm(const float* parts, int splits, const float* bias, void* delta, void* residual, int n,
                              int width, const float* w, float eps, void* out, cudaStream_t s, norm_launch how) {
  if (n <= 0 || !norm_bf16x8_fits(width) || !aligned16(delta) || !aligned16(residual) || !aligned16(out) ||
      !aligned16(w) || !aligned16(parts)) {
    return false;
  }
  const unsigned tpb = norm_bf16x8_threads(width);
  const int ahead = splits <= split_norm_ahead_max ? how.loads_ahead : 0;
  launch_k(how.pdl, pick_norm_kernel<decltype(&split_add_rmsnorm_bf16x8_kernel<0, 1>)>(ahead, width, split_norm_kernels),
           dim3(n), dim3(tpb), 0, s, parts, splits, static_cast<std::size_t>(n) * width, bias, static_cast<bf16*>(delta),
           static_cast<bf16*>(residual), width, w, eps, static_cast<bf16*>(out), how.pdl && how.late_trigger,
           how.prefetch);
  CONVEYOR_CUDA_LAUNCHED("split add rmsnorm bf16x8");
  return true;
}

void launch_sum_parts(const float* parts, int splits, int n, int width, const float* bias, void* out, cudaStream_t s,
                      bool pdl) {
  const std::size_t count = static_cast<std::size_t>(n) * width;
  if (count == 0) return;
  launch_k(pdl, sum_parts_bf16_kernel, dim3(flat_blocks(count)), dim3(threads), 0, s, parts, splits, count, width, bias,
           static_cast<bf16*>(out));
  CONVEYOR_CUDA_LAUNCHED("sum parts bf16");
}

void launch_add(dtype t, void* acc, const void* x, std::size_t count, cudaStream_t s) {
  if (count == 0) return;
  if (t == dtype::bf16 && count % 8 == 0 && aligned16(acc) && aligned16(x)) {
    add_bf16x8_kernel<<<flat_blocks(count / 8), threads, 0, s>>>(static_cast<bf16*>(acc), static_cast<const bf16*>(x),
                                                                 count / 8);
    CONVEYOR_CUDA_LAUNCHED("add bf16x8");
    return;
  }
  CONVEYOR_DISPATCH_T(t, {
    add_kernel<T><<<flat_blocks(count), threads, 0, s>>>(static_cast<T*>(acc), static_cast<const T*>(x), count);
    CONVEYOR_CUDA_LAUNCHED("add");
  });
}

void launch_add_bias(dtype t, void* out, const float* bias, int n, int width, cudaStream_t s) {
  CONVEYOR_DISPATCH_T(t, {
    for (int r0 = 0; r0 < n; r0 += max_grid_y) {
      const int rows = std::min(max_grid_y, n - r0);
      add_bias_kernel<T><<<row_grid(rows, width), threads, 0, s>>>(
          static_cast<T*>(out) + static_cast<std::size_t>(r0) * width, bias, width);
      CONVEYOR_CUDA_LAUNCHED("add_bias");
    }
  });
}

void launch_rope(dtype t, void* qkv, int n, const attn_shape& shape, const std::int32_t* positions,
                 const float* inv_freq, float attention_scaling, cudaStream_t s) {
  if (n <= 0) return;
  const int groups = (shape.num_heads + shape.num_kv_heads + rope_group - 1) / rope_group;
  const std::size_t work = static_cast<std::size_t>(n) * groups * (shape.head_dim / 2);
  CONVEYOR_DISPATCH_T(t, {
    rope_kv_kernel<T, false><<<blocks_for(work, threads), threads, 0, s>>>(
        static_cast<T*>(qkv), n, shape.num_heads, shape.num_kv_heads, shape.head_dim, positions, inv_freq,
        attention_scaling, nullptr, nullptr, nullptr);
    CONVEYOR_CUDA_LAUNCHED("rope");
  });
}

void launch_rope_kv(dtype t, void* qkv, int n, const attn_shape& shape, const std::int32_t* positions,
                    const float* inv_freq, float attention_scaling, const std::int32_t* slots, void* k_cache,
                    void* v_cache, cudaStream_t s, bool pdl) {
  if (n <= 0) return;
  const int groups = (shape.num_heads + 2 * shape.num_kv_heads + rope_group - 1) / rope_group;
  const std::size_t work = static_cast<std::size_t>(n) * groups * (shape.head_dim / 2);
  CONVEYOR_DISPATCH_T(t, {
    launch_k(pdl, rope_kv_kernel<T, true>, dim3(blocks_for(work, threads)), dim3(threads), 0, s, static_cast<T*>(qkv),
             n, shape.num_heads, shape.num_kv_heads, shape.head_dim, positions, inv_freq, attention_scaling, slots,
             static_cast<T*>(k_cache), static_cast<T*>(v_cache));
    CONVEYOR_CUDA_LAUNCHED("rope_kv");
  });
}

void launch_kv_write(dtype t, const void* qkv, int n, const attn_shape& shape, const std::int32_t* slots,
                     void* k_cache, void* v_cache, cudaStream_t s) {
  const int q_width = shape.num_heads * shape.head_dim;
  const int kv_width = shape.num_kv_heads * shape.head_dim;
  const int width = q_width + 2 * kv_width;
  CONVEYOR_DISPATCH_T(t, {
    for (int r0 = 0; r0 < n; r0 += max_grid_y) {
      const int rows = std::min(max_grid_y, n - r0);
      kv_write_kernel<T><<<row_grid(rows, kv_width), threads, 0, s>>>(
          static_cast<const T*>(qkv) + static_cast<std::size_t>(r0) * width, q_width, kv_width, width, slots + r0,
          static_cast<T*>(k_cache), static_cast<T*>(v_cache));
      CONVEYOR_CUDA_LAUNCHED("kv_write");
    }
  });
}

l2_prefetch l2_prefetch_rows(const void* w, int rows, std::size_t row_bytes, std::size_t budget) {
  if (w == nullptr || rows <= 0 || budget == 0 || !aligned16(w) || row_bytes % 16 != 0) return {};
  constexpr std::size_t piece = 16384;  // the whole matrix: a few large requests, not one a row
  const std::size_t total = static_cast<std::size_t>(rows) * row_bytes;
  if (total <= budget && total % piece == 0) return {w, static_cast<int>(total / piece), piece, piece};
  const std::size_t head = std::min(row_bytes, budget / static_cast<std::size_t>(rows) / 256 * 256);
  if (head < 256) return {};
  return {w, rows, row_bytes, static_cast<unsigned>(head)};
}

void launch_silu_mul(dtype t, const void* gate_up, int n, int ffn, void* out, cudaStream_t s, bool pdl,
                     const l2_prefetch& prefetch) {
  if (n <= 0) return;
  if (t == dtype::bf16 && ffn % 8 == 0 && aligned16(gate_up) && aligned16(out)) {
    const std::size_t chunks = static_cast<std::size_t>(n) * (ffn / 8);
    launch_k(pdl, silu_mul_bf16x8_kernel, dim3(flat_blocks(chunks)), dim3(threads), 0, s,
             static_cast<const bf16*>(gate_up), n, ffn, static_cast<bf16*>(out), prefetch);
    CONVEYOR_CUDA_LAUNCHED("silu_mul bf16x8");
    return;
  }
  CONVEYOR_DISPATCH_T(t, {
    for (int r0 = 0; r0 < n; r0 += max_grid_y) {
      const int rows = std::min(max_grid_y, n - r0);
      silu_mul_kernel<T><<<row_grid(rows, ffn), threads, 0, s>>>(
          static_cast<const T*>(gate_up) + static_cast<std::size_t>(r0) * 2 * ffn, ffn,
          static_cast<T*>(out) + static_cast<std::size_t>(r0) * ffn);
      CONVEYOR_CUDA_LAUNCHED("silu_mul");
    }
  });
}

void launch_upload_words(std::uint32_t* dst, const std::uint32_t* host, int words, const std::uint32_t* ovl,
                         int ovl_at, int ovl_words, cudaStream_t s, bool pdl) {
  if (words <= 0) return;
  launch_k(pdl, upload_words_kernel, dim3(std::min(blocks_for(static_cast<std::size_t>(words), threads), 64u)),
           dim3(threads), 0, s, dst, host, words, ovl, ovl_at, ovl_words);
  CONVEYOR_CUDA_LAUNCHED("upload_words");
}

void launch_from_f32(dtype t, const float* src, std::size_t count, void* dst, cudaStream_t s) {
  if (count == 0) return;
  CONVEYOR_DISPATCH_T(t, {
    from_f32_kernel<T><<<flat_blocks(count), threads, 0, s>>>(src, count, static_cast<T*>(dst));
    CONVEYOR_CUDA_LAUNCHED("from_f32");
  });
}

}  // namespace conveyor::kernels::cuda
