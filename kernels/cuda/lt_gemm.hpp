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
#include <string>
#include <vector>

#include "tuning_cache.hpp"

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

  /// The same product cut along K into S strided batches with float32 outputs:
  /// parts[s][n, rows] = x[:, s·cols/S ..] · W[:, s·cols/S ..]ᵀ, for a following kernel that sums the
  /// S slices anyway (cuda_backend's linear_add_rmsnorm). split_for() returns the S of {2, 4} whose
  /// time beats the plain GEMM's by more than `margin_us` (run()'s choice with `plain_tuned`, else
  /// cublasGemmEx's own; timed as run()'s choice is, on the first call of a shape's bucket), 0 where
  /// none does or the shape does not cut evenly; run_split() runs it.
  /// parts must hold max_split · n · rows floats.
  int split_for(const void* w, const void* x, float* parts, int rows, int n, int cols, cudaStream_t stream,
                bool capturing, void* flush, std::size_t flush_bytes, float margin_us, bool plain_tuned);
  void run_split(const void* w, const void* x, float* parts, int rows, int n, int cols, int splits,
                 cudaStream_t stream);
  static constexpr int max_split = 4;

  /// Keep the choices in a tuning cache file (tuning_cache.hpp): those already there for
  /// `device_key` become this process's (where it has not timed the shape itself), and each new
  /// choice is merged into the file as it is made. A file that cannot be read or written is said
  /// once on stderr and the tuning goes on without it.
  void use_cache(const std::string& path, const std::string& device_key);

 private:
  /// Merges one new choice into the cache file, if there is one (with choices_mu held).
  void remember(const tuned_gemm& e);
  using key = std::array<int, 3>;  // rows, cols, n
  struct plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    bool use_lt = false;
    cublasLtMatmulAlgo_t algo{};
  };
  plan& plan_for(const void* w, const void* x, void* out, int rows, int n, int cols,
                 cudaStream_t stream, bool capturing, void* flush, std::size_t flush_bytes);
  /// Returns the chosen path's time (ms); ms_default: cublasGemmEx's own choice's.
  float tune(plan& p, const void* w, const void* x, void* out, int rows, int n, int cols,
             cudaStream_t stream, bool capturing, void* flush, std::size_t flush_bytes, float& ms_default);
  /// The split GEMM's descriptors for (rows, cols, n, splits); ok: an algorithm is set.
  struct split_plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    bool ok = false;
    cublasLtMatmulAlgo_t algo{};
  };
  split_plan& split_plan_for(int rows, int n, int cols, int splits);
  /// Median time (ms) of `launch` on the side stream, L2 overwritten before each repetition.
  template <class Launch>
  float time_on_side(Launch&& launch, void* flush, std::size_t flush_bytes);
  static constexpr int max_candidates = 16;
  /// cuBLASLt's heuristic candidates for the descriptors (within the workspace); how many, 0 on error.
  int candidates(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                 cublasLtMatrixLayout_t d, std::array<cublasLtMatmulHeuristicResult_t, max_candidates>& out);
  /// Waits on the side stream for the work queued on `stream` (not while it is captured).
  void side_after(cudaStream_t stream, bool capturing);

  static constexpr int reps = 8;
  cublasLtHandle_t lt_ = nullptr;
  cublasHandle_t blas_ = nullptr;  ///< on side_, for timing cublasGemmEx's own choice
  std::array<cudaEvent_t, 2 * reps + 1> ev_{};
  void* ws_;
  std::size_t ws_bytes_;
  cudaStream_t side_ = nullptr;
  std::string cache_path_, device_key_;
  bool cache_warned_ = false;
  std::map<key, plan> plans_;
  std::map<std::array<int, 4>, split_plan> split_plans_;  // rows, cols, n, splits
};

}  // namespace conveyor::kernels::cuda
