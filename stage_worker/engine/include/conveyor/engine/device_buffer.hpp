#pragma once
// Owning handle of one allocation in a backend's memory.
#include <cstddef>
#include <utility>

#include "conveyor/kernels/backend.hpp"

namespace conveyor::engine {

class device_buffer {
 public:
  device_buffer() = default;
  device_buffer(kernels::backend& b, std::size_t bytes) : backend_(&b), bytes_(bytes), ptr_(b.alloc(bytes)) {}
  /// Takes ownership of memory the backend allocated elsewhere (e.g. by upload_weight).
  static device_buffer adopt(kernels::backend& b, void* ptr, std::size_t bytes) {
    device_buffer buf;
    buf.backend_ = &b;
    buf.ptr_ = ptr;
    buf.bytes_ = bytes;
    return buf;
  }
  device_buffer(device_buffer&& o) noexcept { *this = std::move(o); }
  device_buffer& operator=(device_buffer&& o) noexcept {
    if (this != &o) {
      reset();
      backend_ = std::exchange(o.backend_, nullptr);
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() { reset(); }

  void reset() {
    if (backend_ != nullptr && ptr_ != nullptr) backend_->release(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  /// False when the allocation failed (out of memory).
  bool valid() const { return ptr_ != nullptr; }
  void* get() const { return ptr_; }
  template <class T>
  T* as() const { return static_cast<T*>(ptr_); }
  std::size_t bytes() const { return bytes_; }

 private:
  kernels::backend* backend_ = nullptr;
  std::size_t bytes_ = 0;
  void* ptr_ = nullptr;
};

}  // namespace conveyor::engine
