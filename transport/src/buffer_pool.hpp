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

  /// Capacity a request of `size` bytes gets: size classes keep reuse likely when shapes vary a little.
  static std::size_t capacity_for(std::size_t size) {
    if (size <= (1u << 20)) return (size + 63) / 64 * 64;
    std::size_t step = std::size_t{1} << 20;
    return (size + step - 1) / step * step;
  }

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
      if (pooled_ + capacity <= max_pooled_) {
        free_[capacity].push_back(p);
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
