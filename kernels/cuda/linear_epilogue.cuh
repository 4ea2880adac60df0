#pragma once
// The store every bf16 linear kernel ends with (gemv.cu, skinny_gemm.cu, skinny_wgmma.cu), so that
// their outputs round exactly as the op-by-op path does (the parity tests compare them bit for bit).
#include <cuda_bf16.h>

#include <cstdint>

#include "device_types.cuh"

namespace conveyor::kernels::cuda {

__device__ __forceinline__ float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

/// The bf16 value the op-by-op path stores for the f32 sum `acc` of output row `row`: the product
/// rounded, plus `bias[row]` when there is a bias, rounded again.
__device__ __forceinline__ float linear_out_value(float acc, const float* bias, int row) {
  const float y = round_bf16(acc);
  return bias != nullptr ? round_bf16(y + bias[row]) : y;
}
__device__ __forceinline__ void store_linear_out(float acc, const float* bias, int row, __nv_bfloat16* out) {
  *out = __float2bfloat16_rn(linear_out_value(acc, bias, row));
}
/// silu(g) * u of two stored (bf16-valued) gate and up entries, as silu_mul's kernels compute it.
__device__ __forceinline__ __nv_bfloat16 silu_mul_out(float g, float u) {
  return __float2bfloat16_rn(g / (1.0f + expf(-g)) * u);
}
/// silu(g) * u of two packed bf16 pairs, as silu_mul_bf16x8_kernel computes it.
__device__ __forceinline__ std::uint32_t silu_pair(std::uint32_t g, std::uint32_t u) {
  const float g0 = bf_lo(g), g1 = bf_hi(g);
  return pack_bf16x2(g0 / (1.0f + expf(-g0)) * bf_lo(u), g1 / (1.0f + expf(-g1)) * bf_hi(u));
}

}  // namespace conveyor::kernels::cuda
