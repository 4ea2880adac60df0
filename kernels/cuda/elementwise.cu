// Memory-bound kernels of the CUDA backend: embedding, RMSNorm (+ fused residual add), add, bias,
// RoPE, KV-cache writes, SwiGLU, row gather and dtype conversion. Each one has a CPU twin in
// kernels/cpu and a parity test in tests/kernels/test_cuda_ops.cpp.
#include <cmath>

#include "device_types.cuh"
#include "launch.hpp"

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

// One thread per (token, frequency); it rotates that pair in every q and k head, so each angle's
// sine and cosine are computed once. Angle rounded to float32 as torch does; cos/sin in double and
// rounded, as the CPU twin.
template <class T>
__global__ void rope_kernel(T* qkv, int n, int heads, int head_dim, int width, const std::int32_t* positions,
                            const float* inv_freq, float scaling) {
  const int half = head_dim / 2;
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= n * half) return;
  const int t = idx / half, i = idx % half;
  const float angle = static_cast<float>(positions[t]) * inv_freq[i];
  double s, c;
  sincos(static_cast<double>(angle), &s, &c);
  const float cos_v = static_cast<float>(c) * scaling;
  const float sin_v = static_cast<float>(s) * scaling;
  T* row = qkv + static_cast<std::size_t>(t) * width;
  for (int h = 0; h < heads; ++h) {
    T* x = row + static_cast<std::size_t>(h) * head_dim;
    const float a = to_f32(x[i]), b = to_f32(x[i + half]);
    x[i] = from_f32<T>(a * cos_v - b * sin_v);
    x[i + half] = from_f32<T>(b * cos_v + a * sin_v);
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

void launch_rmsnorm(dtype t, void* residual, const void* x, int n, int width, const float* w, float eps,
                    void* out, cudaStream_t s) {
  if (n <= 0) return;
  const unsigned tpb = width >= 1024 ? 512 : 128;
  CONVEYOR_DISPATCH_T(t, {
    rmsnorm_kernel<T><<<n, tpb, 0, s>>>(static_cast<T*>(residual), static_cast<const T*>(x), width, w, eps,
                                        static_cast<T*>(out));
    CONVEYOR_CUDA_LAUNCHED("rmsnorm");
  });
}

void launch_add(dtype t, void* acc, const void* x, std::size_t count, cudaStream_t s) {
  if (count == 0) return;
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
  const int width = (shape.num_heads + 2 * shape.num_kv_heads) * shape.head_dim;
  const std::size_t work = static_cast<std::size_t>(n) * (shape.head_dim / 2);
  CONVEYOR_DISPATCH_T(t, {
    rope_kernel<T><<<blocks_for(work, threads), threads, 0, s>>>(
        static_cast<T*>(qkv), n, shape.num_heads + shape.num_kv_heads, shape.head_dim, width, positions, inv_freq,
        attention_scaling);
    CONVEYOR_CUDA_LAUNCHED("rope");
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

void launch_silu_mul(dtype t, const void* gate_up, int n, int ffn, void* out, cudaStream_t s) {
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

void launch_from_f32(dtype t, const float* src, std::size_t count, void* dst, cudaStream_t s) {
  if (count == 0) return;
  CONVEYOR_DISPATCH_T(t, {
    from_f32_kernel<T><<<flat_blocks(count), threads, 0, s>>>(src, count, static_cast<T*>(dst));
    CONVEYOR_CUDA_LAUNCHED("from_f32");
  });
}

}  // namespace conveyor::kernels::cuda
