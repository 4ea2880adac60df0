#pragma once
// Receive buffers reused across frames (private to transport/). A fresh 64 MiB buffer per frame costs
// an mmap, 16k page faults and an munmap — measured at ~40% of shared-memory bandwidth lost.
#include <cstddef>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

namespace conveyor::transport {

class buffer_pool {
 public:
  explicit buffer_pool(std::size_t max_pooled_bytes) : max_pooled_(max_pooled_bytes) {}
  ~buffer_pool() {
    for (auto& [cap, list] : free_) for (auto* p : list) std::free(p);
  }

  /// Capacity a request of `size` bytes gets. Four classes per power of two (at most 25% slack): with
  /// 64-byte classes, every microbatch shape parked buffers of its own and a worker's RSS climbed for
  /// minutes under varied load (the soak test measured +16% in 2 minutes) until max_pooled_bytes.
  static std::size_t capacity_for(std::size_t size) {
    if (size <= 4096) return 4096;
    std::size_t octave = std::size_t{1} << (63 - __builtin_clzll(size - 1));  // largest 2^k < size
    std::size_t step = octave / 4;
    return (size + step - 1) / step * step;
  }

  /// Buffers kept per size class. A receiver holds the frames in flight plus those delivered and not
  /// yet dropped: transport_bench's sink held 5-8 64-MiB frames (31 of 1 MiB on a loaded 2-core box)
  /// with 4 in flight, and each buffer past the cap was freed and faulted in again later (16k page
  /// faults per 64 MiB). max_pooled_bytes bounds the total.
  static constexpr std::size_t max_per_class = 16;

  std::byte* take(std::size_t capacity) {
    {
      std::lock_guard lock(mu_);
      auto it = free_.find(capacity);
      if (it != free_.end() && !it->second.empty()) {
        std::byte* p = it->second.back();
        it->second.pop_back();
        pooled_ -= capacity;
        return p;
      }
    }
    return static_cast<std::byte*>(std::aligned_alloc(64, capacity));
  }

  void give(std::byte* p, std::size_t capacity) {
    {
      std::lock_guard lock(mu_);
      auto& list = free_[capacity];
      if (pooled_ + capacity <= max_pooled_ && list.size() < max_per_class) {
        list.push_back(p);
        pooled_ += capacity;
        return;
      }
    }
    std::free(p);
  }

 private:
  std::mutex mu_;
  std::map<std::size_t, std::vector<std::byte*>> free_;
  std::size_t pooled_ = 0;
  std::size_t max_pooled_;
};

}  // namespace conveyor::transport
