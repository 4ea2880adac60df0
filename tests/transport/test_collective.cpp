// Collectives: the CPU group (threads of one process) for 1, 2 and 4 ranks; NCCL with one rank on a
// GPU machine (skipped here without a device).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <thread>

#include "conveyor/transport/cpu_collective.hpp"
#include "conveyor/transport/nccl_collective.hpp"

#if CONVEYOR_TEST_CUDA
#include <cuda_runtime.h>
#endif

namespace conveyor::transport {
namespace {

using kernels::dtype;

/// Runs `body(rank collective)` on `n` threads and returns each rank's status.
template <class F>
std::vector<status> run_ranks(cpu_group& g, F body) {
  std::vector<status> results(g.size());
  std::vector<std::thread> threads;
  for (int r = 0; r < g.size(); ++r) {
    threads.emplace_back([&, r] {
      auto c = g.rank(r);
      results[r] = body(*c);
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

class CpuCollective : public ::testing::TestWithParam<int> {};

TEST_P(CpuCollective, AllReduceSumMatchesAReferenceAndIsIdenticalOnEveryRank) {
  int n = GetParam();
  cpu_group g(n);
  // Sizes around the chunk and block boundaries, including fewer elements than ranks.
  for (std::size_t count : {std::size_t{1}, std::size_t{3}, std::size_t{4097}, std::size_t{1} << 20}) {
    std::vector<std::vector<float>> data(n, std::vector<float>(count));
    std::mt19937 rng(count);
    std::normal_distribution<float> dist;
    for (auto& d : data) for (auto& x : d) x = dist(rng);
    std::vector<double> ref(count, 0.0);
    for (int r = 0; r < n; ++r) for (std::size_t i = 0; i < count; ++i) ref[i] += data[r][i];
    for (int rep = 0; rep < 2; ++rep) {  // the group is reusable
      auto copy = data;
      auto st = run_ranks(g, [&](collective& c) { return c.all_reduce_sum(copy[c.rank()].data(), count, dtype::f32); });
      for (auto& s : st) ASSERT_TRUE(s.ok()) << s.err().message;
      for (std::size_t i = 0; i < count; ++i) ASSERT_NEAR(copy[0][i], ref[i], 1e-5 * n) << i;
      for (int r = 1; r < n; ++r) {
        ASSERT_EQ(0, std::memcmp(copy[r].data(), copy[0].data(), count * 4)) << "rank " << r << " differs, count " << count;
      }
    }
  }
}

// Many small all-reduces back to back, each rank's values different every time: the barriers'
// polling (before they sleep) must never let a rank read a buffer of the previous round or one not yet
// reduced. Each round's sum is checked on every rank.
TEST_P(CpuCollective, BackToBackSmallAllReducesStayExact) {
  const int n = GetParam();
  cpu_group g(n);
  constexpr int rounds = 3000, count = 17;
  auto st = run_ranks(g, [&](collective& c) -> status {
    std::vector<float> v(count);
    for (int k = 0; k < rounds; ++k) {
      for (int i = 0; i < count; ++i) v[i] = static_cast<float>(k * 7 + i + c.rank());
      CONVEYOR_TRY(c.all_reduce_sum(v.data(), count, dtype::f32));
      for (int i = 0; i < count; ++i) {
        const float want = static_cast<float>(n * (k * 7 + i) + n * (n - 1) / 2);
        if (v[i] != want) {
          return make_error(errc::internal, "round " + std::to_string(k) + " rank " + std::to_string(c.rank()) +
                                                " element " + std::to_string(i) + ": " + std::to_string(v[i]) +
                                                " != " + std::to_string(want));
        }
      }
    }
    return ok_status();
  });
  for (auto& s : st) EXPECT_TRUE(s.ok()) << s.err().message;
}

TEST_P(CpuCollective, AllGatherAndBroadcast) {
  int n = GetParam();
  cpu_group g(n);
  constexpr std::size_t count = 1000;
  std::vector<std::vector<float>> out(n, std::vector<float>(count * n, -1.0f));
  std::vector<std::vector<float>> in(n, std::vector<float>(count));
  for (int r = 0; r < n; ++r) for (std::size_t i = 0; i < count; ++i) in[r][i] = r * 10000.0f + i;
  auto st = run_ranks(g, [&](collective& c) { return c.all_gather(in[c.rank()].data(), out[c.rank()].data(), count, dtype::f32); });
  for (auto& s : st) ASSERT_TRUE(s.ok()) << s.err().message;
  for (int r = 0; r < n; ++r) {
    for (int q = 0; q < n; ++q) {
      ASSERT_EQ(0, std::memcmp(out[r].data() + q * count, in[q].data(), count * 4)) << "rank " << r << " slot " << q;
    }
  }
  int root = n - 1;
  st = run_ranks(g, [&](collective& c) { return c.broadcast(in[c.rank()].data(), count, dtype::f32, root); });
  for (auto& s : st) ASSERT_TRUE(s.ok()) << s.err().message;
  for (int r = 0; r < n; ++r) ASSERT_EQ(in[r], in[root]);
}

INSTANTIATE_TEST_SUITE_P(Ranks, CpuCollective, ::testing::Values(1, 2, 4),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

TEST(CpuCollectiveFailure, AMissingRankIsAnErrorOnTheOthersNotAHang) {
  cpu_group g(3, std::chrono::milliseconds(200));
  std::vector<float> a(16, 1.0f), b(16, 1.0f);
  std::vector<status> st(2);
  std::thread t0([&] { st[0] = g.rank(0)->all_reduce_sum(a.data(), 16, dtype::f32); });
  std::thread t1([&] { st[1] = g.rank(1)->all_reduce_sum(b.data(), 16, dtype::f32); });
  t0.join();
  t1.join();  // rank 2 never comes
  for (auto& s : st) {
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.err().message.find("waited"), std::string::npos) << s.err().message;
  }
  // Broken for good: the next op fails at once.
  EXPECT_FALSE(g.rank(0)->broadcast(a.data(), 16, dtype::f32, 0).ok());
}

TEST(CpuCollectiveFailure, UnsupportedDtypeAndBadRootAreErrors) {
  cpu_group g(1);
  auto c = g.rank(0);
  std::vector<float> a(4);
  EXPECT_EQ(c->all_reduce_sum(a.data(), 4, dtype::bf16).err().code, errc::unsupported);
  EXPECT_EQ(c->broadcast(a.data(), 4, dtype::f32, 3).err().code, errc::invalid_argument);
}

TEST(NcclCollective, SingleRankGroupAllReducesOnTheGpu) {
  if (!nccl_available()) GTEST_SKIP() << "built without CUDA/NCCL";
#if CONVEYOR_TEST_CUDA
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) GTEST_SKIP() << "no CUDA device";
  auto id = make_nccl_unique_id();
  ASSERT_TRUE(id.ok()) << id.err().message;
  EXPECT_FALSE(make_nccl_collective(std::span(*id).subspan(1), 1, 0, 0, nullptr).ok());
  auto c = make_nccl_collective(*id, 1, 0, 0, nullptr);
  ASSERT_TRUE(c.ok()) << c.err().message;
  std::vector<float> host(1024);
  for (std::size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i);
  float* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, host.size() * 4), cudaSuccess);
  cudaMemcpy(dev, host.data(), host.size() * 4, cudaMemcpyHostToDevice);
  ASSERT_TRUE((*c)->all_reduce_sum(dev, host.size(), dtype::f32).ok());
  ASSERT_TRUE((*c)->broadcast(dev, host.size(), dtype::f32, 0).ok());
  std::vector<float> back(host.size());
  cudaMemcpy(back.data(), dev, back.size() * 4, cudaMemcpyDeviceToHost);
  cudaFree(dev);
  EXPECT_EQ(back, host);  // one rank: the sum is the input
#endif
}

}  // namespace
}  // namespace conveyor::transport
