#pragma once
// Element access shared by the .cu files: every kernel computes in float32 and converts at the edges.
#include <cuda_bf16.h>

#include <cstdint>

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

// Programmatic dependent launch (sm_90). A kernel launched with launch_k(pdl = true) may start while
// the kernel before it drains; grid_dep_wait() then blocks until that kernel has finished and its
// writes are visible. Every kernel that is ever launched this way calls grid_dep_wait() first, before
// any early return (so its completion still implies its predecessor's, for the kernel after it), and
// grid_dep_trigger() right after, which lets the next kernel launch. Launched without the attribute,
// both are no-ops.
__device__ __forceinline__ void grid_dep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void grid_dep_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/// kernel<<<grid, block, smem, s>>>(args...), as a programmatic dependent of the previous kernel
/// on `s` when `pdl` is set.
template <class... P, class... A>
void launch_k(bool pdl, void (*kernel)(P...), dim3 grid, dim3 block, std::size_t smem, cudaStream_t s,
              A&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  CONVEYOR_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, static_cast<P>(args)...));
}

/// d += A(16x16, row-major bf16 fragments a0..a3) x B(16x8, col-major b0, b1), f32 accumulators:
/// the one tensor-core MMA shape the GEMV, the quantized linear and flash attention use.
__device__ __forceinline__ void mma16816(float (&d)[4], std::uint32_t a0, std::uint32_t a1, std::uint32_t a2,
                                         std::uint32_t a3, std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
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
