#pragma once
// Return-code checks for CUDA and cuBLAS calls inside the backend. A failing call after the backend
// was created is a bug or a dead device, not bad input, so it aborts with the call and the reason
// (DESIGN.md: a bug asserts with context).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

namespace conveyor::kernels::cuda {

[[noreturn]] inline void fail_cuda(const char* what, const char* reason, const char* file, int line) {
  std::fprintf(stderr, "conveyor cuda: %s failed: %s (%s:%d)\n", what, reason, file, line);
  std::abort();
}

}  // namespace conveyor::kernels::cuda

#define CONVEYOR_CUDA_CHECK(call)                                                            \
  do {                                                                                       \
    const cudaError_t conveyor_err_ = (call);                                                \
    if (conveyor_err_ != cudaSuccess)                                                        \
      ::conveyor::kernels::cuda::fail_cuda(#call, cudaGetErrorString(conveyor_err_), __FILE__, \
                                           __LINE__);                                        \
  } while (0)

#define CONVEYOR_CUBLAS_CHECK(call)                                                                 \
  do {                                                                                              \
    const cublasStatus_t conveyor_st_ = (call);                                                     \
    if (conveyor_st_ != CUBLAS_STATUS_SUCCESS)                                                      \
      ::conveyor::kernels::cuda::fail_cuda(#call, cublasGetStatusString(conveyor_st_), __FILE__, __LINE__); \
  } while (0)

/// After a kernel launch: a bad configuration shows up here, not at the next sync.
#define CONVEYOR_CUDA_LAUNCHED(what) CONVEYOR_CUDA_CHECK(cudaGetLastError())
