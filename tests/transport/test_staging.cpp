// Staging of activations for the transport: buffers are reused across frames (not one allocation
// per frame), and the f32 <-> bf16 wire conversion is exact where it must be (a bf16 activation
// survives f32 and back) and rounds like the backends elsewhere.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "conveyor/transport/staging_pool.hpp"

namespace conveyor::transport {
namespace {

using kernels::dtype;

TEST(StagingPool, BuffersAreReusedAcrossFrames) {
  staging_pool pool(4);
  void* first = nullptr;
  {
    auto a = pool.acquire(3u << 20);
    ASSERT_TRUE(a.ok()) << a.err().message;
    first = a->data();
    std::memset(a->data(), 1, a->size());  // the whole size is usable
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(first) % 64, 0u);
  }
  for (int frame = 0; frame < 100; ++frame) {
    auto b = pool.acquire((2u << 20) + frame);  // slightly varying shapes fit the same buffer
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(b->data(), first);
  }
  EXPECT_EQ(pool.allocations(), 1u);
  // Frames in flight at once each hold their own buffer; afterwards they are all reused.
  {
    std::vector<staging_pool::buffer> in_flight;
    for (int i = 0; i < 4; ++i) in_flight.push_back(std::move(pool.acquire(1u << 20).value()));
    for (int i = 1; i < 4; ++i) EXPECT_NE(in_flight[i].data(), in_flight[0].data());
  }
  EXPECT_EQ(pool.allocations(), 4u);
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(pool.acquire(1u << 20).ok());
  EXPECT_EQ(pool.allocations(), 4u);
}

TEST(StagingPool, ABufferMayOutliveItsPool) {
  staging_pool::buffer kept;
  {
    staging_pool pool(2);
    kept = std::move(pool.acquire(100).value());
  }
  std::memset(kept.data(), 0, kept.size());  // still valid; freed when `kept` goes
  SUCCEED();
}

TEST(ActivationWire, Bf16ValuesSurviveF32AndBackBitForBit) {
  std::mt19937 rng(7);
  std::vector<std::uint16_t> bf16(10000);
  for (auto& x : bf16) {
    do x = static_cast<std::uint16_t>(rng()); while ((x & 0x7f80) == 0x7f80);  // finite values
  }
  std::vector<float> f32(bf16.size());
  ASSERT_TRUE(convert_activations(bf16.data(), dtype::bf16, f32.data(), dtype::f32, bf16.size()).ok());
  std::vector<std::uint16_t> back(bf16.size());
  ASSERT_TRUE(convert_activations(f32.data(), dtype::f32, back.data(), dtype::bf16, f32.size()).ok());
  EXPECT_EQ(back, bf16);
}

TEST(ActivationWire, F32ToBf16RoundsToNearestEvenLikeTheBackends) {
  std::vector<float> f = {1.0f, 1.00390625f /* tie: to even (1.0) */, 1.01171875f /* tie: up */, -3.14159f,
                          std::numeric_limits<float>::infinity(), 1e-40f};
  std::vector<std::uint16_t> b(f.size());
  ASSERT_TRUE(convert_activations(f.data(), dtype::f32, b.data(), dtype::bf16, f.size()).ok());
  for (std::size_t i = 0; i < f.size(); ++i) EXPECT_EQ(b[i], kernels::f32_to_bf16(f[i])) << i;
  EXPECT_EQ(b[1], 0x3f80);
  EXPECT_EQ(b[2], 0x3f82);
  // Same dtype: a copy.
  std::vector<float> copy(f.size());
  ASSERT_TRUE(convert_activations(f.data(), dtype::f32, copy.data(), dtype::f32, f.size()).ok());
  EXPECT_EQ(0, std::memcmp(copy.data(), f.data(), f.size() * 4));
  EXPECT_EQ(convert_activations(f.data(), dtype::f32, b.data(), dtype::f16, 1).err().code, errc::unsupported);
}

}  // namespace
}  // namespace conveyor::transport
