#pragma once
// Helpers of the CUDA parity tests: a backend per dtype (or a skip reason), device tensors that are
// poisoned before each op, fresh random inputs, and error norms.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "conveyor/kernels/backend.hpp"
#include "conveyor/kernels/cuda_backend.hpp"

namespace conveyor::testing {

/// The CUDA backend `o` describes, or nullptr with `why` set (no device here).
inline std::unique_ptr<kernels::backend> try_cuda_backend(const kernels::cuda_backend_options& o, std::string& why) {
  auto b = kernels::make_cuda_backend(o);
  if (!b) {
    why = b.err().message;
    return nullptr;
  }
  return std::move(b).value();
}

/// The CUDA backend in `t`, or nullptr with `why` set (no device here).
inline std::unique_ptr<kernels::backend> try_cuda_backend(kernels::dtype t, std::string& why,
                                                          std::size_t attention_workspace = 64ull << 20) {
  kernels::cuda_backend_options o;
  o.compute_dtype = t;
  o.attention_workspace_bytes = attention_workspace;
  return try_cuda_backend(o, why);
}

/// Seed of this run's random inputs: fresh each run, printed so a failure can be replayed
/// (CONVEYOR_TEST_SEED=n fixes it).
inline std::uint64_t test_seed() {
  static const std::uint64_t seed = [] {
    if (const char* s = std::getenv("CONVEYOR_TEST_SEED")) return static_cast<std::uint64_t>(std::stoull(s));
    return static_cast<std::uint64_t>(std::random_device{}()) << 32 | std::random_device{}();
  }();
  return seed;
}

/// Rounds to what the backend's activation dtype can hold, so the CPU twin sees the same inputs.
inline float representable(kernels::dtype t, float x) {
  return t == kernels::dtype::bf16 ? kernels::bf16_to_f32(kernels::f32_to_bf16(x)) : x;
}

inline std::vector<float> random_values(std::mt19937_64& rng, std::size_t n, kernels::dtype t, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = representable(t, d(rng));
  return v;
}

/// Activations in backend memory.
class dev_acts {
 public:
  dev_acts(kernels::backend& b, std::size_t count) : b_(b), count_(count) {
    ptr_ = b.alloc(count * kernels::dtype_size(b.caps().act_dtype));
  }
  dev_acts(kernels::backend& b, const std::vector<float>& host) : dev_acts(b, host.size()) { set(host); }
  ~dev_acts() { b_.release(ptr_); }
  dev_acts(const dev_acts&) = delete;
  dev_acts& operator=(const dev_acts&) = delete;
  void set(const std::vector<float>& host) { b_.write_f32(ptr_, host.data(), host.size()); }
  /// NaN in every element (all-ones bits are NaN in f32 and bf16): an unwritten output shows.
  void poison() { b_.fill_bytes(ptr_, 0xff, count_ * kernels::dtype_size(b_.caps().act_dtype)); }
  std::vector<float> get() const {
    std::vector<float> v(count_);
    b_.read_f32(ptr_, count_, v.data());
    return v;
  }
  void* get_ptr() const { return ptr_; }

 private:
  kernels::backend& b_;
  std::size_t count_;
  void* ptr_ = nullptr;
};

/// Raw bytes in backend memory (index arrays, float32 tables).
class dev_bytes {
 public:
  template <class T>
  dev_bytes(kernels::backend& b, const std::vector<T>& host) : b_(b) {
    ptr_ = b.alloc(std::max<std::size_t>(host.size() * sizeof(T), 4));
    if (!host.empty()) b.upload(ptr_, host.data(), host.size() * sizeof(T));
  }
  ~dev_bytes() { b_.release(ptr_); }
  dev_bytes(const dev_bytes&) = delete;
  dev_bytes& operator=(const dev_bytes&) = delete;
  template <class T>
  T* as() const { return static_cast<T*>(ptr_); }

 private:
  kernels::backend& b_;
  void* ptr_ = nullptr;
};

struct error_stats {
  double rel = 0.0;      ///< ‖out − ref‖ / ‖ref‖
  double max_abs = 0.0;
  std::size_t non_finite = 0;
};

inline error_stats compare(const std::vector<float>& out, const std::vector<float>& ref) {
  error_stats e;
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i])) { ++e.non_finite; continue; }
    const double d = static_cast<double>(out[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
    e.max_abs = std::max(e.max_abs, std::fabs(d));
  }
  e.rel = den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
  return e;
}

/// Relative-error tolerance of one op's output in a dtype: float32 arithmetic vs a bf16 output rounding.
inline double tolerance(kernels::dtype t) { return t == kernels::dtype::bf16 ? 1e-2 : 2e-5; }

}  // namespace conveyor::testing

/// Expects out ≈ ref within relative error `bound`, with no unwritten (NaN) elements.
#define EXPECT_CLOSE_WITHIN(out, ref, bound, what)                                                     \
  do {                                                                                                 \
    ASSERT_EQ((out).size(), (ref).size()) << what;                                                     \
    const auto stats_ = ::conveyor::testing::compare(out, ref);                                        \
    EXPECT_EQ(stats_.non_finite, 0u) << what << ": unwritten or non-finite outputs";                   \
    EXPECT_LE(stats_.rel, bound)                                                                       \
        << what << ": max |diff| " << stats_.max_abs << ", seed " << ::conveyor::testing::test_seed(); \
    ::conveyor::testing::record_error(what, stats_);                                                   \
  } while (0)

/// Expects out ≈ ref within the dtype's tolerance, with no unwritten (NaN) elements.
#define EXPECT_CLOSE(out, ref, t, what) EXPECT_CLOSE_WITHIN(out, ref, ::conveyor::testing::tolerance(t), what)

namespace conveyor::testing {
/// One line per comparison, "[parity] what rel max_abs", for scripts/gpu-suite's summary.
inline void record_error(const std::string& what, const error_stats& e) {
  std::printf("[parity] %-56s rel %.3e  max_abs %.3e\n", what.c_str(), e.rel, e.max_abs);
}
}  // namespace conveyor::testing
