// Token sampling on the device, the twin of kernels/cpu/sampling.cpp's sample_row: temperature, then
// top-k, then top-p, then an inverse-CDF draw with the host-computed sample_uniform(seed, step).
// To pick the very token the CPU picks, the candidates are put in the CPU's order (descending logit,
// ties by lower index: a stable descending radix sort of (logit, index)) and the probabilities are
// summed in double in that order. The only cub in the backend lives in this file (slow to compile).
#include <algorithm>
#include <climits>

#include <cub/device/device_segmented_radix_sort.cuh>

#include "device_types.cuh"
#include "launch.hpp"

namespace conveyor::kernels::cuda {

namespace {

constexpr unsigned threads = 256;

// The end of both argmax kernels: each thread's (best, best_i) (best_i == vocab: nothing seen yet)
// reduced over the block of NT threads by torch.argmax's rule (the larger value; ties by the lower
// index), and written by thread 0. NaN is never a candidate (as in the CPU twin, whose comparisons
// skip it, except that it keeps a NaN at index 0); an all-NaN row gets token 0 on both.
template <unsigned NT>
__device__ __forceinline__ void argmax_block_finish(float best, int best_i, int vocab, std::int32_t* token) {
  __shared__ float sv[NT / 32];
  __shared__ int si[NT / 32];
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, o);
    const int oi = __shfl_xor_sync(0xffffffffu, best_i, o);
    if (oi != vocab && (best_i == vocab || ov > best || (ov == best && oi < best_i))) { best = ov; best_i = oi; }
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) { sv[warp] = best; si[warp] = best_i; }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) {
      if (si[w] != vocab && (best_i == vocab || sv[w] > best || (sv[w] == best && si[w] < best_i))) {
        best = sv[w];
        best_i = si[w];
      }
    }
    *token = best_i == vocab ? 0 : best_i;
  }
}

// One block per row: index of the first maximum (torch.argmax's tie rule), for greedy rows.
template <class T>
__global__ void argmax_kernel(const T* logits, int vocab, const device_sample_params* params, std::int32_t* tokens) {
  const int row = blockIdx.x;
  if (params != nullptr && !params[row].greedy) return;  // nullptr: every row greedy
  const T* x = logits + static_cast<std::size_t>(row) * vocab;
  float best = -INFINITY;
  int best_i = vocab;  // sentinel: loses every tie
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float v = to_f32(x[i]);
    if (v == v && (best_i == vocab || v > best)) {  // ascending i: this share's first maximum; NaN never
      best = v;
      best_i = i;
    }
  }
  argmax_block_finish<threads>(best, best_i, vocab, tokens + row);
}

// The same rule with 1024 threads and 16-byte loads (bf16 rows whose length is a multiple of 8): one
// block of 256 threads with 2-byte loads took tens of microseconds per 128k-vocab row, a visible
// share of a batch-1 decode step. Each thread still visits its indices in ascending order.
constexpr unsigned wide_threads = 1024;
__global__ void __launch_bounds__(wide_threads) argmax_bf16x8_kernel(const __nv_bfloat16* logits, int vocab,
                                                                     const device_sample_params* params,
                                                                     std::int32_t* tokens) {
  const int row = blockIdx.x;
  if (params != nullptr && !params[row].greedy) return;  // nullptr: every row greedy
  const uint4* x = reinterpret_cast<const uint4*>(logits + static_cast<std::size_t>(row) * vocab);
  float best = -INFINITY;
  int best_i = vocab;
#pragma unroll 4
  for (int c = threadIdx.x; c < vocab / 8; c += blockDim.x) {
    const uint4 u = x[c];
    const __nv_bfloat16* h = reinterpret_cast<const __nv_bfloat16*>(&u);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float v = __bfloat162float(h[e]);
      if (v == v && (best_i == vocab || v > best)) {
        best = v;
        best_i = c * 8 + e;
      }
    }
  }
  argmax_block_finish<wide_threads>(best, best_i, vocab, tokens + row);
}

// The same rule over many blocks a row (bf16 rows whose length is a multiple of 8): one block a row
// spent ~13 µs on a 128k vocabulary (16 dependent 16-byte loads a thread, one SM), as long as a
// layer's GEMV at batch 1. Here each of `gridDim.x` blocks takes a slice of the row, finds its first
// maximum, and folds it into the row's key with one 64-bit atomicMax: the float's bits made
// order-preserving in the high word, the complement of the index in the low one, so the larger
// value wins and, among equal values, the lower index (torch.argmax's rule). NaN is never a
// candidate (the CPU twin's comparisons never pick one either); a row with no candidate gets token
// 0. The row's last block to finish writes the token (also into `host_tokens`, pinned host memory,
// when given: no copy back after the kernel) and clears the key and its count for the next call, so
// the workspace needs no reset launch. A thread's loads are all issued before any is compared (the
// loop of one load and its compares waited a DRAM latency per load): 5.1 -> 3.5 µs at batch 1,
// 11-12 -> 9.5 at batch 64 (bench/NOTES.md, session 9; why b=64 stays at 1.7 TB/s is open).
constexpr unsigned split_threads = 256;
constexpr int split_unroll = 4;
/// Slices a row: as many blocks as fit on the GPU at once over the batch (8 an SM: 256 threads of
/// 32 registers; batch 1: 64 slices, one 16-byte load a thread on a 128k vocabulary), at least 16
/// (batch 64: 1024 blocks, ~4 loads a thread). Rounded down: until session 18 it was rounded up, 17
/// slices at batch 64 on 132 SMs, i.e. 1088 blocks, and the last 32 ran as a second wave (argmax
/// 9.5-10.3 µs a step for 16 MB of logits in session 18's H100 timeline).
int split_slices(int rows, int num_sms) { return std::clamp(8 * num_sms / rows, 16, 64); }
__device__ __forceinline__ unsigned long long argmax_key(float v, int i) {
  const unsigned u = __float_as_uint(v == 0.0f ? 0.0f : v);  // -0 ties with +0, as the CPU compares
  const unsigned ordered = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return static_cast<unsigned long long>(ordered) << 32 | (0xffffffffu - static_cast<unsigned>(i));
}
__global__ void __launch_bounds__(split_threads) argmax_split_bf16x8_kernel(
    const __nv_bfloat16* logits, int vocab, const device_sample_params* params, unsigned long long* keys,
    unsigned* done, std::int32_t* tokens, std::int32_t* host_tokens) {
  // The upload of the next step's plan (launch_upload_words, a programmatic dependent) may launch
  // once every block here has started: its host reads then cross the bus while this kernel runs,
  // and it waits for this kernel's completion before it reads the tokens or stores anything.
  grid_dep_trigger();
  const int row = blockIdx.y;
  if (params != nullptr && !params[row].greedy) return;  // nullptr: every row greedy
  const int chunks = vocab / 8, per = (chunks + gridDim.x - 1) / gridDim.x;
  const int c0 = blockIdx.x * per, c1 = min(chunks, c0 + per);
  const uint4* x = reinterpret_cast<const uint4*>(logits + static_cast<std::size_t>(row) * vocab);
  // The thread's first maximum as (value, index): -0 == +0 and the lower index wins a tie, as in
  // the key; the key is built once at the end.
  float best_v = -INFINITY;
  int best_i = INT_MAX;  // none yet (loses every tie; -inf is still a candidate)
  for (int c = c0 + static_cast<int>(threadIdx.x); c < c1; c += split_threads * split_unroll) {
    uint4 u[split_unroll];
#pragma unroll
    for (int j = 0; j < split_unroll; ++j) {
      const int cj = c + j * static_cast<int>(split_threads);
      if (cj < c1) u[j] = x[cj];
    }
#pragma unroll
    for (int j = 0; j < split_unroll; ++j) {
      const int cj = c + j * static_cast<int>(split_threads);
      if (cj >= c1) break;
      const __nv_bfloat16* h = reinterpret_cast<const __nv_bfloat16*>(&u[j]);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float v = __bfloat162float(h[e]);
        const int i = cj * 8 + e;
        if (v > best_v || (v == best_v && i < best_i)) {  // false for NaN
          best_v = v;
          best_i = i;
        }
      }
    }
  }
  unsigned long long best = best_i == INT_MAX ? 0ull : argmax_key(best_v, best_i);  // 0: no candidate
  for (int o = 16; o > 0; o >>= 1) best = max(best, __shfl_xor_sync(0xffffffffu, best, o));
  __shared__ unsigned long long warp_best[split_threads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_best[warp] = best;
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 1; w < static_cast<int>(split_threads / 32); ++w) best = max(best, warp_best[w]);
  if (best != 0) atomicMax(keys + row, best);
  __threadfence();  // the key before the count: the last block must see every slice's key
  if (atomicAdd(done + row, 1u) + 1 != gridDim.x) return;
  __threadfence();
  const unsigned long long k = atomicExch(keys + row, 0ull);
  done[row] = 0;
  const std::int32_t token =
      k == 0 ? 0 : static_cast<std::int32_t>(0xffffffffu - static_cast<unsigned>(k & 0xffffffffu));
  tokens[row] = token;
  if (host_tokens != nullptr) host_tokens[row] = token;
}

// Sort keys: logit / temperature (float, as the CPU computes it), and the index.
template <class T>
__global__ void prepare_kernel(const T* logits, int vocab, const device_sample_params* params, float* keys,
                               std::int32_t* idx) {
  const int row = blockIdx.y;
  const float temp = params[row].greedy ? 1.0f : params[row].temperature;
  const std::size_t base = static_cast<std::size_t>(row) * vocab;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < vocab; i += gridDim.x * blockDim.x) {
    keys[base + i] = to_f32(logits[base + i]) / temp;
    idx[base + i] = i;
  }
}

__global__ void offsets_kernel(std::int32_t* offsets, int rows, int vocab) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i <= rows) offsets[i] = i * vocab;
}

// One warp per non-greedy row over its sorted candidates. Every lane computes 32 probabilities at
// once, then all lanes add them in index order (the CPU's order), so every lane holds the same sums.
__global__ void finish_kernel(const float* keys, const std::int32_t* idx, int vocab,
                              const device_sample_params* params, std::int32_t* tokens) {
  const int row = blockIdx.x, lane = threadIdx.x;
  const device_sample_params p = params[row];
  if (p.greedy) return;
  const float* k = keys + static_cast<std::size_t>(row) * vocab;
  const std::int32_t* id = idx + static_cast<std::size_t>(row) * vocab;
  int keep = (p.top_k > 0 && p.top_k < vocab) ? p.top_k : vocab;
  const double max_logit = k[0];
  auto prob = [&](int i) { return i < keep ? exp(static_cast<double>(k[i]) - max_logit) : 0.0; };
  double total = 0.0;
  for (int base = 0; base < keep; base += 32) {
    const double pi = prob(base + lane);
    for (int j = 0; j < 32; ++j) total += __shfl_sync(0xffffffffu, pi, j);  // adding 0.0 past keep is exact
  }
  if (p.top_p < 1.0f) {
    double cum = 0.0;
    int cut = keep;
    bool found = false;
    for (int base = 0; base < keep && !found; base += 32) {
      const double pi = prob(base + lane);
      for (int j = 0; j < 32; ++j) {
        const double pj = __shfl_sync(0xffffffffu, pi, j);
        if (!found && base + j < keep) {
          cum += pj / total;
          if (cum >= p.top_p) { cut = base + j + 1; found = true; }
        }
      }
    }
    keep = cut;
    total = 0.0;
    for (int base = 0; base < keep; base += 32) {
      const double pi = prob(base + lane);
      for (int j = 0; j < 32; ++j) total += __shfl_sync(0xffffffffu, pi, j);
    }
  }
  const double u = p.u * total;
  double cum = 0.0;
  int chosen = keep - 1;
  bool found = false;
  for (int base = 0; base < keep && !found; base += 32) {
    const double pi = prob(base + lane);
    for (int j = 0; j < 32; ++j) {
      const double pj = __shfl_sync(0xffffffffu, pi, j);
      if (!found && base + j < keep) {
        cum += pj;
        if (u < cum) { chosen = base + j; found = true; }
      }
    }
  }
  if (lane == 0) tokens[row] = id[chosen];
}

}  // namespace

std::size_t sample_sort_temp_bytes(int rows, int vocab) {
  std::size_t bytes = 0;
  CONVEYOR_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortPairsDescending(
      nullptr, bytes, static_cast<const float*>(nullptr), static_cast<float*>(nullptr),
      static_cast<const std::int32_t*>(nullptr), static_cast<std::int32_t*>(nullptr),
      static_cast<std::int64_t>(rows) * vocab, rows, static_cast<std::int32_t*>(nullptr),
      static_cast<std::int32_t*>(nullptr), 0, 32));
  return bytes;
}

void launch_sample_init(const sample_workspace& ws, cudaStream_t s) {
  offsets_kernel<<<blocks_for(ws.rows + 1, threads), threads, 0, s>>>(ws.offsets, ws.rows, ws.vocab);
  CONVEYOR_CUDA_LAUNCHED("sample offsets");
}

bool launch_sample(dtype t, const void* logits, int n, int vocab, const device_sample_params* params,
                   bool any_random, const sample_workspace& ws, std::int32_t* tokens, cudaStream_t s,
                   std::int32_t* host_tokens, int num_sms) {
  if (n <= 0) return false;
  bool wrote_host = false;
  const bool wide = t == dtype::bf16 && vocab % 8 == 0 && reinterpret_cast<std::uintptr_t>(logits) % 16 == 0;
  CONVEYOR_DISPATCH_T(t, {
    if (wide && ws.argmax_keys != nullptr && n <= ws.rows) {
      // Random rows' tokens come later (finish_kernel), so the host copy is written here only
      // when every row is greedy.
      std::int32_t* host = any_random ? nullptr : host_tokens;
      argmax_split_bf16x8_kernel<<<dim3(split_slices(n, num_sms), n), split_threads, 0, s>>>(
          static_cast<const __nv_bfloat16*>(logits), vocab, params, ws.argmax_keys, ws.argmax_done, tokens, host);
      wrote_host = host != nullptr;
    } else if (wide) {
      argmax_bf16x8_kernel<<<n, wide_threads, 0, s>>>(static_cast<const __nv_bfloat16*>(logits), vocab, params,
                                                      tokens);
    } else {
      argmax_kernel<T><<<n, threads, 0, s>>>(static_cast<const T*>(logits), vocab, params, tokens);
    }
    CONVEYOR_CUDA_LAUNCHED("sample argmax");
    if (any_random) {
      prepare_kernel<T><<<dim3(std::min(blocks_for(vocab, threads), 64u), n), threads, 0, s>>>(
          static_cast<const T*>(logits), vocab, params, ws.keys_in, ws.idx_in);
      CONVEYOR_CUDA_LAUNCHED("sample prepare");
    }
  });
  if (!any_random) return wrote_host;
  std::size_t temp_bytes = ws.sort_temp_bytes;
  // Radix sort is stable: equal logits keep ascending index order, the CPU's tie rule.
  CONVEYOR_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortPairsDescending(
      ws.sort_temp, temp_bytes, ws.keys_in, ws.keys_out, ws.idx_in, ws.idx_out,
      static_cast<std::int64_t>(n) * vocab, n, ws.offsets, ws.offsets + 1, 0, 32, s));
  finish_kernel<<<n, 32, 0, s>>>(ws.keys_out, ws.idx_out, vocab, params, tokens);
  CONVEYOR_CUDA_LAUNCHED("sample finish");
  return false;
}

}  // namespace conveyor::kernels::cuda
