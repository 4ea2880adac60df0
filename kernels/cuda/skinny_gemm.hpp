#pragma once
// Launcher of the skinny GEMM (skinny_gemm.cu), callable from host C++. Its own header rather than
// launch.hpp, so adding it does not rebuild every other kernel file.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace conveyor::kernels::cuda {

/// out[n, rows] = x[n, cols] · wᵀ (+ bias), bf16, the decode-batch linear (n ≤ skinny_gemm_max_tokens)
/// on our own tensor-core GEMM: a cp.async weight ring, K split over a thread-block cluster where the
/// row tiles alone do not fill the GPU. Pointers 16-byte aligned.
struct skinny_gemm_args {
  const __nv_bfloat16* w = nullptr;
  const float* bias = nullptr;  ///< added to the bf16-rounded product, as the op-by-op path does
  const __nv_bfloat16* x = nullptr;
  __nv_bfloat16* out = nullptr;
  int rows = 0, cols = 0, n = 0;
};
constexpr int skinny_gemm_max_tokens = 128;
/// Shapes launch_skinny_gemm takes (cols a multiple of 8; the caller also checks dtype and alignment).
bool skinny_gemm_supported(int n, int rows, int cols);
/// Raises the kernels' shared-memory limit on the current device (once per device, before a launch).
void skinny_gemm_init();
/// `pdl`: launch as a programmatic dependent of the previous kernel (it requests weights early).
void launch_skinny_gemm(const skinny_gemm_args& a, bool pdl, int sms, cudaStream_t s);

}  // namespace conveyor::kernels::cuda
