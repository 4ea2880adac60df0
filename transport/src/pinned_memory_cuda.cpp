// Page-locked host memory through the CUDA runtime (CUDA builds). Without a usable device
// cudaHostAlloc fails and callers fall back to plain memory.
#include <cuda_runtime.h>

#include "conveyor/transport/staging_pool.hpp"

namespace conveyor::transport {

void* pinned_alloc(std::size_t bytes) {
  void* p = nullptr;
  if (cudaHostAlloc(&p, bytes, cudaHostAllocPortable) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free error so later CUDA calls do not see it
    return nullptr;
  }
  return p;
}

void pinned_free(void* p) { cudaFreeHost(p); }

}  // namespace conveyor::transport
