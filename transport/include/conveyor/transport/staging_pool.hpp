#pragma once
// Reused host buffers for activations on their way to or from a channel (Debian's UCX cannot read
// device memory, so device activations are staged through host memory). Page-locked
// (cudaHostAlloc) when this build has CUDA and a device is present, so the device copy into them is
// a full-speed DMA and no pageable bounce; 64-byte-aligned plain memory otherwise. A few per channel
// (one per frame in flight, plus the one being filled), never one allocation per frame.
#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include "conveyor/base/result.hpp"
#include "conveyor/kernels/dtype.hpp"

namespace conveyor::transport {

/// Page-locked host memory when available (CUDA build with a device), else nullptr.
void* pinned_alloc(std::size_t bytes);
void pinned_free(void* p);

class staging_pool {
  struct shared;

 public:
  /// A buffer taken from the pool; it goes back when destroyed (the pool may be gone by then).
  class buffer {
   public:
    buffer() = default;
    buffer(buffer&& o) noexcept { *this = std::move(o); }
    buffer& operator=(buffer&& o) noexcept;
    ~buffer() { give_back(); }
    void* data() const { return data_; }
    std::size_t size() const { return size_; }
    bool pinned() const { return pinned_; }

   private:
    friend class staging_pool;
    void give_back();
    std::shared_ptr<shared> pool_;
    void* data_ = nullptr;
    std::size_t size_ = 0, capacity_ = 0;
    bool pinned_ = false;
  };

  /// Keeps up to `max_free` buffers for reuse; `try_pinned` false forces plain memory (tests).
  explicit staging_pool(std::size_t max_free = 8, bool try_pinned = true);
  ~staging_pool();
  staging_pool(const staging_pool&) = delete;
  staging_pool& operator=(const staging_pool&) = delete;

  /// A buffer of `bytes`: a free one that is big enough, else a fresh one (capacity rounded up to
  /// 1 MiB steps so slowly growing batches reuse it). An error only when memory runs out.
  result<buffer> acquire(std::size_t bytes);
  /// Buffers allocated so far (to show in tests and benchmarks that frames reuse them).
  std::size_t allocations() const;

 private:
  std::shared_ptr<shared> s_;
};

/// Converts `count` activations from `src_type` to `dst_type` on the host: f32 <-> bf16 (round to
/// nearest even, as the backends do, so bf16 -> f32 -> bf16 is exact) or a copy when they are equal.
/// Other pairs are errc::unsupported.
status convert_activations(const void* src, kernels::dtype src_type, void* dst, kernels::dtype dst_type,
                           std::size_t count);

}  // namespace conveyor::transport
