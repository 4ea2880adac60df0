#include "conveyor/transport/staging_pool.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

namespace conveyor::transport {

struct staging_pool::shared {
  struct slot {
    void* data;
    std::size_t capacity;
    bool pinned;
  };
  std::mutex mu;
  std::vector<slot> free;
  std::size_t max_free;
  bool try_pinned;
  std::size_t allocations = 0;

  static void release(const slot& s) {
    if (s.pinned) {
      pinned_free(s.data);
    } else {
      std::free(s.data);
    }
  }
  ~shared() {
    for (auto& s : free) release(s);
  }
};

staging_pool::buffer& staging_pool::buffer::operator=(buffer&& o) noexcept {
  if (this != &o) {
    give_back();
    pool_ = std::move(o.pool_);
    data_ = o.data_;
    size_ = o.size_;
    capacity_ = o.capacity_;
    pinned_ = o.pinned_;
    o.data_ = nullptr;
  }
  return *this;
}

void staging_pool::buffer::give_back() {
  if (data_ == nullptr) return;
  shared::slot s{data_, capacity_, pinned_};
  data_ = nullptr;
  {
    std::lock_guard lock(pool_->mu);
    if (pool_->free.size() < pool_->max_free) {
      pool_->free.push_back(s);
      pool_.reset();
      return;
    }
  }
  shared::release(s);
  pool_.reset();
}

staging_pool::staging_pool(std::size_t max_free, bool try_pinned) : s_(std::make_shared<shared>()) {
  s_->max_free = max_free;
  s_->try_pinned = try_pinned;
}

staging_pool::~staging_pool() = default;

std::size_t staging_pool::allocations() const {
  std::lock_guard lock(s_->mu);
  return s_->allocations;
}

result<staging_pool::buffer> staging_pool::acquire(std::size_t bytes) {
  buffer b;
  b.pool_ = s_;
  b.size_ = bytes;
  {
    std::lock_guard lock(s_->mu);
    // The smallest free buffer that fits.
    std::size_t best = s_->free.size();
    for (std::size_t i = 0; i < s_->free.size(); ++i) {
      if (s_->free[i].capacity >= bytes && (best == s_->free.size() || s_->free[i].capacity < s_->free[best].capacity)) best = i;
    }
    if (best != s_->free.size()) {
      auto s = s_->free[best];
      s_->free.erase(s_->free.begin() + static_cast<std::ptrdiff_t>(best));
      b.data_ = s.data;
      b.capacity_ = s.capacity;
      b.pinned_ = s.pinned;
      return b;
    }
    ++s_->allocations;
  }
  constexpr std::size_t step = std::size_t{1} << 20;
  std::size_t capacity = std::max<std::size_t>(step, (bytes + step - 1) / step * step);
  void* p = s_->try_pinned ? pinned_alloc(capacity) : nullptr;
  b.pinned_ = p != nullptr;
  if (p == nullptr) p = std::aligned_alloc(64, capacity);
  if (p == nullptr) {
    return make_error(errc::out_of_memory, "staging pool: cannot allocate " + std::to_string(capacity) + " bytes");
  }
  b.data_ = p;
  b.capacity_ = capacity;
  return b;
}

status convert_activations(const void* src, kernels::dtype src_type, void* dst, kernels::dtype dst_type,
                           std::size_t count) {
  using kernels::dtype;
  if (src_type == dst_type) {
    std::memcpy(dst, src, count * kernels::dtype_size(src_type));
    return ok_status();
  }
  if (src_type == dtype::f32 && dst_type == dtype::bf16) {
    const auto* s = static_cast<const float*>(src);
    auto* d = static_cast<std::uint16_t*>(dst);
    for (std::size_t i = 0; i < count; ++i) d[i] = kernels::f32_to_bf16(s[i]);
    return ok_status();
  }
  if (src_type == dtype::bf16 && dst_type == dtype::f32) {
    const auto* s = static_cast<const std::uint16_t*>(src);
    auto* d = static_cast<float*>(dst);
    for (std::size_t i = 0; i < count; ++i) d[i] = kernels::bf16_to_f32(s[i]);
    return ok_status();
  }
  return make_error(errc::unsupported, "activations: no conversion from " + std::string(kernels::dtype_name(src_type)) +
                                           " to " + std::string(kernels::dtype_name(dst_type)));
}

}  // namespace conveyor::transport
