// Linear layers with int8 / FP8 E4M3 weights and a float32 scale per output row.
//
// Decode (n ≤ 16 tokens, bf16 activations): quant_gemv_kernel reads each weight byte once from HBM
// and dequantizes it in registers into the A operand of mma.sync m16n8k16 (bf16 in, f32 accumulate).
// The codes go in unscaled (int8 -127..127 and every E4M3 value are exact in bf16) and the row scale
// multiplies the f32 accumulator once at the end. A block owns 16 rows and all of K; its 8 warps take
// 64-column chunks in turn. Lane (g = lane / 4, t = lane % 4) loads 16 contiguous bytes of rows g and
// g + 8 (k = 16t .. 16t + 15 of the chunk) and feeds them to 4 mmas: in mma s its physical k
// 16t + 4s + {0,1,2,3} play logical k 2t, 2t+1, 2t+8, 2t+9. B (x) is loaded with the same
// permutation, so every dot product is the same sum and both operands stay 16-byte loads.
//
// int8 -> bf16: flip the sign bit (q + 128 as an unsigned byte), place each byte in the mantissa of
// 2^23 (prmt with 0x4B000000), subtract 2^23 + 128 in f32 and keep the upper halves (exact: the
// values are integers below 2^7). E4M3 -> bf16: the sm_89+ cvt to f16x2 (E4M3 subnormals become f16
// normals), move the f16 exponent/mantissa into bf16 position (which reads as value · 2^-112, normal
// for every nonzero code) and multiply by 2^112 in bf16x2.
//
// Prefill, batch > 16 and f32 compute: row tiles are dequantized into a scratch buffer and cuBLAS
// multiplies them (cuda_backend.cpp's quant_linear says why, and what it costs).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>

#include "device_types.cuh"
#include "quant_launch.hpp"

namespace conveyor::kernels::cuda {

namespace {

using bf16 = __nv_bfloat16;

/// Bytes 0,1 and 2,3 of four int8 codes as two bf16x2 words (lo = bytes 0,1).
__device__ __forceinline__ void i8x4_to_bf16(std::uint32_t w, std::uint32_t& lo, std::uint32_t& hi) {
  const std::uint32_t u = w ^ 0x80808080u;
  const float f0 = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7540)) - 8388736.0f;
  const float f1 = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7541)) - 8388736.0f;
  const float f2 = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7542)) - 8388736.0f;
  const float f3 = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7543)) - 8388736.0f;
  lo = __byte_perm(__float_as_uint(f0), __float_as_uint(f1), 0x7632);
  hi = __byte_perm(__float_as_uint(f2), __float_as_uint(f3), 0x7632);
}

/// Two E4M3 codes (low 16 bits of w) as one bf16x2 word.
__device__ __forceinline__ std::uint32_t e4m3x2_to_bf16(std::uint32_t w) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w & 0xffffu), __NV_E4M3);
  const std::uint32_t hb = static_cast<std::uint32_t>(h.x) | (static_cast<std::uint32_t>(h.y) << 16);
  const std::uint32_t scaled = ((hb >> 3) & 0x0fff0fffu) | (hb & 0x80008000u);  // value · 2^-112
  __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(&scaled);
  const __nv_bfloat162 k = __floats2bfloat162_rn(5.192296858534828e33f, 5.192296858534828e33f);  // 2^112
  v = __hmul2(v, k);
  return *reinterpret_cast<const std::uint32_t*>(&v);
}

template <bool FP8>
__device__ __forceinline__ void codes_to_bf16(std::uint32_t w, std::uint32_t& lo, std::uint32_t& hi) {
  if constexpr (FP8) {
    lo = e4m3x2_to_bf16(w);
    hi = e4m3x2_to_bf16(w >> 16);
  } else {
    i8x4_to_bf16(w, lo, hi);
  }
}

constexpr int gemv_warps = 8;
constexpr int chunk_cols = 64;

template <int NT, bool FP8>
__global__ void __launch_bounds__(gemv_warps * 32)
    quant_gemv_kernel(const std::uint8_t* __restrict__ q, const float* __restrict__ scales,
                      const float* __restrict__ bias, const bf16* __restrict__ x, int n, int rows, int cols,
                      bf16* __restrict__ out) {
  __shared__ float red[gemv_warps][NT][4][32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int row0 = blockIdx.x * 16;
  // Rows past the end read the last row (in bounds) and are not written.
  const int ra = min(row0 + g, rows - 1), rb = min(row0 + g + 8, rows - 1);
  const std::uint8_t* qa = q + static_cast<std::size_t>(ra) * cols;
  const std::uint8_t* qb = q + static_cast<std::size_t>(rb) * cols;
  float acc[NT][4] = {};
  const int chunks = (cols + chunk_cols - 1) / chunk_cols;
  // Chunks per warp per step. A step's weights and x are all loaded before its math, and the next
  // step's before that: x loaded chunk by chunk inside the loop exposed an L2 round trip per chunk.
  constexpr int U = NT == 1 ? 4 : 2;
  const int stride = gemv_warps * U;
  struct step_regs {
    uint4 wa[U], wb[U];
    uint4 xv[U][NT][2];
  };
  auto load = [&](int c0, step_regs& r) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int k = (c0 + u) * chunk_cols + 16 * t;
      const bool in = c0 + u < chunks && k < cols;  // cols % 16 == 0: a 16-byte run is all in or all out
      r.wa[u] = in ? __ldcs(reinterpret_cast<const uint4*>(qa + k)) : make_uint4(0, 0, 0, 0);
      r.wb[u] = in ? __ldcs(reinterpret_cast<const uint4*>(qb + k)) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const int tok = j * 8 + g;
        if (in && tok < n) {
          const uint4* xp = reinterpret_cast<const uint4*>(x + static_cast<std::size_t>(tok) * cols + k);
          r.xv[u][j][0] = __ldg(xp);
          r.xv[u][j][1] = __ldg(xp + 1);
        } else {
          r.xv[u][j][0] = r.xv[u][j][1] = make_uint4(0, 0, 0, 0);
        }
      }
    }
  };
  step_regs cur;
  load(warp * U, cur);
  for (int c0 = warp * U; c0 < chunks; c0 += stride) {
    step_regs next;
    load(c0 + stride, next);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const std::uint32_t wa_w[4] = {cur.wa[u].x, cur.wa[u].y, cur.wa[u].z, cur.wa[u].w};
      const std::uint32_t wb_w[4] = {cur.wb[u].x, cur.wb[u].y, cur.wb[u].z, cur.wb[u].w};
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        std::uint32_t a_lo, a_hi, b_lo, b_hi;  // row g: k (4s, 4s+1) and (4s+2, 4s+3); row g+8 likewise
        codes_to_bf16<FP8>(wa_w[s], a_lo, a_hi);
        codes_to_bf16<FP8>(wb_w[s], b_lo, b_hi);
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          const uint4& x0 = cur.xv[u][j][0];
          const uint4& x1 = cur.xv[u][j][1];
          const std::uint32_t xw[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
          mma16816(acc[j], a_lo, b_lo, a_hi, b_hi, xw[2 * s], xw[2 * s + 1]);
        }
      }
    }
    cur = next;
  }
#pragma unroll
  for (int j = 0; j < NT; ++j) {
#pragma unroll
    for (int i = 0; i < 4; ++i) red[warp][j][i][lane] = acc[j][i];
  }
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int j = 0; j < NT; ++j) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float v = 0.0f;
#pragma unroll
      for (int w = 0; w < gemv_warps; ++w) v += red[w][j][i][lane];
      // C fragment: i 0,1 -> row g, tokens 2t, 2t+1; i 2,3 -> row g + 8.
      const int row = row0 + g + (i >= 2 ? 8 : 0);
      const int tok = j * 8 + 2 * t + (i & 1);
      if (row < rows && tok < n) {
        v *= scales[row];
        if (bias != nullptr) v += bias[row];
        out[static_cast<std::size_t>(tok) * rows + row] = __float2bfloat16_rn(v);
      }
    }
  }
}

template <bool FP8>
__device__ __forceinline__ float decode_code(std::uint8_t b) {
  if constexpr (FP8) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(b), __NV_E4M3);
    return __half2float(__half(h));
  } else {
    return static_cast<float>(static_cast<std::int8_t>(b));
  }
}

/// Four codes (one 32-bit word) as floats.
template <bool FP8>
__device__ __forceinline__ void decode4(std::uint32_t w, float (&f)[4]) {
  if constexpr (FP8) {
    const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w & 0xffffu), __NV_E4M3);
    const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w >> 16), __NV_E4M3);
    const float2 a = __half22float2(__half2(lo)), b = __half22float2(__half2(hi));
    f[0] = a.x;
    f[1] = a.y;
    f[2] = b.x;
    f[3] = b.y;
  } else {
    const std::uint32_t u = w ^ 0x80808080u;
    f[0] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7540)) - 8388736.0f;
    f[1] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7541)) - 8388736.0f;
    f[2] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7542)) - 8388736.0f;
    f[3] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7543)) - 8388736.0f;
  }
}

// Any shape: one element per thread (the f32 golden runs and cols % 16 != 0).
template <class T, bool FP8>
__global__ void dequantize_kernel(const std::uint8_t* __restrict__ q, const float* __restrict__ scales, int row_begin,
                                  int rows, int cols, T* __restrict__ dst) {
  const std::size_t total = static_cast<std::size_t>(rows) * cols;
  const std::uint8_t* src = q + static_cast<std::size_t>(row_begin) * cols;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const int r = static_cast<int>(i / cols);
    dst[i] = from_f32<T>(decode_code<FP8>(src[i]) * scales[row_begin + r]);
  }
}

// cols % 16 == 0, bf16 out: 16 codes per thread (one 16-byte load, two 16-byte stores). The per-
// element kernel above spent most of prefill's extra time on a 64-bit division per element.
template <bool FP8>
__global__ void dequantize16_kernel(const std::uint8_t* __restrict__ q, const float* __restrict__ scales,
                                    int row_begin, int rows, int cols, bf16* __restrict__ dst) {
  const int groups_per_row = cols / 16;
  const int groups = rows * groups_per_row;  // a scratch tile: well inside int
  const uint4* src = reinterpret_cast<const uint4*>(q + static_cast<std::size_t>(row_begin) * cols);
  uint4* out = reinterpret_cast<uint4*>(dst);
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < groups; i += gridDim.x * blockDim.x) {
    const float s = scales[row_begin + i / groups_per_row];
    const uint4 w = __ldcs(src + i);
    const std::uint32_t words[4] = {w.x, w.y, w.z, w.w};
    std::uint32_t packed[8];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      float f[4];
      decode4<FP8>(words[k], f);
      const __nv_bfloat162 lo = __floats2bfloat162_rn(f[0] * s, f[1] * s);
      const __nv_bfloat162 hi = __floats2bfloat162_rn(f[2] * s, f[3] * s);
      packed[2 * k] = *reinterpret_cast<const std::uint32_t*>(&lo);
      packed[2 * k + 1] = *reinterpret_cast<const std::uint32_t*>(&hi);
    }
    out[2 * i] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
    out[2 * i + 1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
  }
}

}  // namespace

bool quant_gemv_supported(int n, int rows, int cols, const void* x, const void* q, const void* out) {
  auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  return n >= 1 && n <= quant_gemv_max_n && rows >= 1 && cols >= 16 && cols % 16 == 0 && aligned(x) &&
         aligned(q) && aligned(out);
}

void launch_quant_gemv(dtype qtype, const void* x, int n, const void* q, const float* scales, const float* bias,
                       int rows, int cols, void* out, cudaStream_t s) {
  const dim3 grid((rows + 15) / 16), block(gemv_warps * 32);
  const auto* qp = static_cast<const std::uint8_t*>(q);
  const auto* xp = static_cast<const bf16*>(x);
  auto* op = static_cast<bf16*>(out);
  const bool fp8 = qtype == dtype::f8e4m3;
  if (n <= 8) {
    if (fp8) {
      quant_gemv_kernel<1, true><<<grid, block, 0, s>>>(qp, scales, bias, xp, n, rows, cols, op);
    } else {
      quant_gemv_kernel<1, false><<<grid, block, 0, s>>>(qp, scales, bias, xp, n, rows, cols, op);
    }
  } else {
    if (fp8) {
      quant_gemv_kernel<2, true><<<grid, block, 0, s>>>(qp, scales, bias, xp, n, rows, cols, op);
    } else {
      quant_gemv_kernel<2, false><<<grid, block, 0, s>>>(qp, scales, bias, xp, n, rows, cols, op);
    }
  }
  CONVEYOR_CUDA_LAUNCHED("quant_gemv_kernel");
}

void launch_dequantize_rows(dtype t, dtype qtype, const void* q, const float* scales, int row_begin, int rows,
                            int cols, void* dst, cudaStream_t s) {
  const std::size_t total = static_cast<std::size_t>(rows) * cols;
  const unsigned threads = 256;
  const auto* qp = static_cast<const std::uint8_t*>(q);
  const bool fp8 = qtype == dtype::f8e4m3;
  const bool aligned = reinterpret_cast<std::uintptr_t>(q) % 16 == 0 && reinterpret_cast<std::uintptr_t>(dst) % 16 == 0;
  if (t == dtype::bf16 && cols % 16 == 0 && aligned) {
    const unsigned blocks = static_cast<unsigned>(std::min<std::size_t>(blocks_for(total / 16, threads), 132u * 8u));
    if (fp8) {
      dequantize16_kernel<true><<<blocks, threads, 0, s>>>(qp, scales, row_begin, rows, cols, static_cast<bf16*>(dst));
    } else {
      dequantize16_kernel<false><<<blocks, threads, 0, s>>>(qp, scales, row_begin, rows, cols, static_cast<bf16*>(dst));
    }
    CONVEYOR_CUDA_LAUNCHED("dequantize16_kernel");
    return;
  }
  const unsigned blocks = static_cast<unsigned>(std::min<std::size_t>(blocks_for(total, threads), 132u * 16u));
  CONVEYOR_DISPATCH_T(t, {
    if (fp8) {
      dequantize_kernel<T, true><<<blocks, threads, 0, s>>>(qp, scales, row_begin, rows, cols, static_cast<T*>(dst));
    } else {
      dequantize_kernel<T, false><<<blocks, threads, 0, s>>>(qp, scales, row_begin, rows, cols, static_cast<T*>(dst));
    }
  });
  CONVEYOR_CUDA_LAUNCHED("dequantize_kernel");
}

}  // namespace conveyor::kernels::cuda
