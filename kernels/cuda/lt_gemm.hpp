#pragma once
// bf16 decode linears through cuBLASLt with the algorithm chosen per shape by timing (host C++).
//
// At decode batch sizes cuBLAS's default choice ran the small layer GEMMs far under the copy
// bandwidth (batch 64 on the H200: qkv 7.9 µs and o_proj 7.3 µs for 12.6 and 8.4 MB of weights, the
// down projection split-K with a separate reduce; bench/NOTES.md). Here the first call of a shape
// asks cuBLASLt's heuristic for its candidates, times each (and cublasGemmEx's default) once on a
// side stream, with L2 flushed before every repetition as in a real step, where the weights come
// from memory, and keeps the fastest. Later calls of the shape run it directly.
//
// The choice is kept per (rows, cols, token bucket: the power of two ≥ n), process-wide, so every
// backend in a process rounds the same way; a token count that the bucket's algorithm does not
// support (cublasLtMatmulAlgoCheck) runs cublasGemmEx. Timing while the backend's stream is being
// captured is possible because the capture is relaxed and the side stream is not part of it; the
// tuning writes `out` (dead until the linear writes it) and a scratch buffer only.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <map>

namespace conveyor::kernels::cuda {

class lt_gemm {
 public:
  /// `workspace`: the cuBLAS workspace of the backend (only one GEMM runs at a time).
  lt_gemm(void* workspace, std::size_t workspace_bytes);
  ~lt_gemm();
  lt_gemm(const lt_gemm&) = delete;
  lt_gemm& operator=(const lt_gemm&) = delete;

  /// out[n, rows] = x[n, cols] · Wᵀ in bf16 with f32 accumulation, as linear()'s cublasGemmEx does.
  /// Returns false where the default path (cublasGemmEx) is the choice: the caller runs it then.
  /// `flush`/`flush_bytes`: scratch the tuning may overwrite to evict L2 (≥ the L2 size to be fair).
  /// `capturing`: `stream` is being captured (the tuning then cannot wait for it, and needs not).
  bool run(const void* w, const void* x, void* out, int rows, int n, int cols,
           cudaStream_t stream, bool capturing, void* flush, std::size_t flush_bytes);

 private:
  using key = std::array<int, 3>;  // rows, cols, n
  struct plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    bool use_lt = false;
    cublasLtMatmulAlgo_t algo{};
  };
  plan& plan_for(const void* w, const void* x, void* out, int rows, int n, int cols,
                 cudaStream_t stream, bool capturing, void* flush, std::size_t flush_bytes);
  void tune(plan& p, const void* w, const void* x, void* out, int rows, int n, int cols,
            cudaStream_t stream, bool capturing, void* flush, std::size_t flush_bytes);

  static constexpr int reps = 8;
  cublasLtHandle_t lt_ = nullptr;
  cublasHandle_t blas_ = nullptr;  ///< on side_, for timing cublasGemmEx's own choice
  std::array<cudaEvent_t, 2 * reps + 1> ev_{};
  void* ws_;
  std::size_t ws_bytes_;
  cudaStream_t side_ = nullptr;
  std::map<key, plan> plans_;
};

}  // namespace conveyor::kernels::cuda
