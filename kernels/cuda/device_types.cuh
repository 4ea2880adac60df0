#pragma once
// Element access shared by the .cu files: every kernel computes in float32 and converts at the edges.
#include <cuda_bf16.h>

#include <cstdint>
#include <utility>

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
// grid_dep_trigger() right after, which lets the next kernel launch (a few call it later, where their
// options say so: the next kernel's early requests would queue before their own loads; when it is
// called never changes what the next kernel reads, since that one's grid_dep_wait() waits for this
// kernel's completion either way). Launched without the attribute,
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

/// Diagnostics (block stamps: gemv_args::stamps, skinny_wgmma's SKINNY_WGMMA_STAMPS, the fused
/// kernel's trace): the GPU's %globaltimer in nanoseconds, and the SM a block runs on.
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ unsigned smid() {
  unsigned id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  return id;
}

/// The low and the high bf16 of a packed pair as floats, and two floats rounded into such a pair:
/// how the 16-byte kernels read and write eight bf16 at a time.
__device__ __forceinline__ float bf_lo(std::uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float bf_hi(std::uint32_t u) { return __uint_as_float(u & 0xffff0000u); }
__device__ __forceinline__ std::uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const std::uint32_t*>(&v);
}

/// The sum of `v` over the 32 lanes of a warp, in every lane.
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/// What a launch asks for besides its shape: to start as a programmatic dependent of the previous
/// kernel on the stream (`pdl`), a preferred shared-memory carveout (`carveout` percent, a hint the
/// driver may override; -1: the driver's choice) and thread-block clusters of `cluster_x` blocks
/// along x (1: none).
struct launch_extras {
  bool pdl = false;
  int carveout = -1;
  int cluster_x = 1;
  /// a cooperative launch: the driver starts it only when every block can be resident at once (for
  /// kernels whose blocks wait for each other)
  bool cooperative = false;
};

/// kernel<<<grid, block, smem, s>>>(args...) with the attributes `x` asks for.
template <class... P, class... A>
void launch_kx(const launch_extras& x, void (*kernel)(P...), dim3 grid, dim3 block, std::size_t smem,
               cudaStream_t s, A&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[4];
  unsigned n = 0;
  if (x.pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (x.carveout >= 0) {
    attr[n].id = cudaLaunchAttributePreferredSharedMemoryCarveout;
    attr[n++].val.sharedMemCarveout = static_cast<unsigned>(x.carveout);
  }
  if (x.cluster_x > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = static_cast<unsigned>(x.cluster_x);
    attr[n].val.clusterDim.y = 1;
    attr[n++].val.clusterDim.z = 1;
  }
  if (x.cooperative) {
    attr[n].id = cudaLaunchAttributeCooperative;
    attr[n++].val.cooperative = 1;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  CONVEYOR_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, static_cast<P>(args)...));
}

/// kernel<<<grid, block, smem, s>>>(args...), as a programmatic dependent of the previous kernel
/// on `s` when `pdl` is set.
template <class... P, class... A>
void launch_k(bool pdl, void (*kernel)(P...), dim3 grid, dim3 block, std::size_t smem, cudaStream_t s,
              A&&... args) {
  launch_kx(launch_extras{pdl}, kernel, grid, block, smem, s, std::forward<A>(args)...);
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
