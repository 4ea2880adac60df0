#pragma once
// The store every bf16 linear kernel ends with (gemv.cu, skinny_gemm.cu, skinny_wgmma.cu), so that
// their outputs round exactly as the op-by-op path does (the parity tests compare them bit for bit).
#include <cuda_bf16.h>

namespace conveyor::kernels::cuda {

__device__ __forceinline__ float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

/// `*out` = the f32 sum `acc` rounded to bf16, plus `bias[row]` when there is a bias: the op-by-op
/// path adds the bias to the rounded product, and rounds again.
__device__ __forceinline__ void store_linear_out(float acc, const float* bias, int row, __nv_bfloat16* out) {
  float y = round_bf16(acc);
  if (bias != nullptr) y += bias[row];
  *out = __float2bfloat16_rn(y);
}

}  // namespace conveyor::kernels::cuda
