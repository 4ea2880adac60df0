#pragma once
// Element access shared by the .cu files: every kernel computes in float32 and converts at the edges.
#include <cuda_bf16.h>

#include "check.hpp"
#include "conveyor/kernels/dtype.hpp"

namespace conveyor::kernels::cuda {

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

inline unsigned blocks_for(std::size_t count, unsigned threads) {
  return static_cast<unsigned>((count + threads - 1) / threads);
}

}  // namespace conveyor::kernels::cuda

/// Calls `body` (a generic lambda taking a T* tag) with T = float or __nv_bfloat16 for dtype `t`.
#define CONVEYOR_DISPATCH_T(t, ...)                                                     \
  do {                                                                                  \
    if ((t) == ::conveyor::kernels::dtype::bf16) {                                      \
      using T = __nv_bfloat16;                                                          \
      __VA_ARGS__;                                                                      \
    } else {                                                                            \
      using T = float;                                                                  \
      __VA_ARGS__;                                                                      \
    }                                                                                   \
  } while (0)
