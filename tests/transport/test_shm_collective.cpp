// The process-group collective: 2 and 4 real OS processes (forked) meet in shared memory and must get
// the same bits as the thread group (cpu_group) computed in the parent; a rank that dies is an error
// on the others within a bound; bad ids and mismatched groups are errors.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <thread>

#include "conveyor/transport/cpu_collective.hpp"
#include "conveyor/transport/shm_collective.hpp"

namespace conveyor::transport {
namespace {

using kernels::dtype;

/// Forks `n` processes running `body(rank)` (an exit code: 0 = passed) and returns their codes.
/// The children _exit, so gtest state in them never reaches the parent's report.
std::vector<int> run_processes(int n, const std::function<int(int)>& body) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    pid_t pid = ::fork();
    if (pid == 0) {
      // A child that hangs is killed by the alarm rather than hanging the test.
      ::alarm(60);
      int code = body(r);
      std::fflush(stderr);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  std::vector<int> codes;
  for (pid_t pid : pids) {
    int st = 0;
    ::waitpid(pid, &st, 0);
    codes.push_back(WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
  }
  return codes;
}

/// The thread group's result for every rank (cpu_group, the reference of the bits).
template <class F>
void run_threads(int n, F body) {
  cpu_group g(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto c = g.rank(r);
      ASSERT_TRUE(body(*c).ok());
    });
  }
  for (auto& t : threads) t.join();
}

shm_group_options small_slots() {
  shm_group_options o;
  o.slot_bytes = 64 << 10;  // forces large operations through several chunks
  o.timeout = std::chrono::seconds(30);
  return o;
}

class ShmCollective : public ::testing::TestWithParam<int> {};

TEST_P(ShmCollective, ProcessesGetTheSameBitsAsTheThreadGroup) {
  const int n = GetParam();
  const std::vector<std::size_t> counts = {1, 3, 4097, (std::size_t{1} << 20) + 5};
  // Inputs and the thread group's results, computed before forking.
  std::vector<std::vector<std::vector<float>>> in, want;
  for (std::size_t count : counts) {
    std::vector<std::vector<float>> data(n, std::vector<float>(count));
    std::mt19937 rng(static_cast<unsigned>(count));
    std::normal_distribution<float> dist;
    for (auto& d : data) for (auto& x : d) x = dist(rng);
    auto reduced = data;
    run_threads(n, [&](collective& c) { return c.all_reduce_sum(reduced[c.rank()].data(), count, dtype::f32); });
    in.push_back(std::move(data));
    want.push_back(std::move(reduced));
  }
  constexpr std::size_t gather_count = 40000;  // > one slot of 64 KiB
  std::vector<std::vector<float>> gather_in(n, std::vector<float>(gather_count));
  for (int r = 0; r < n; ++r) for (std::size_t i = 0; i < gather_count; ++i) gather_in[r][i] = r * 1e5f + i;
  std::vector<std::vector<float>> gather_want(n, std::vector<float>(gather_count * n));
  run_threads(n, [&](collective& c) {
    return c.all_gather(gather_in[c.rank()].data(), gather_want[c.rank()].data(), gather_count, dtype::f32);
  });

  auto id = make_shm_group_id();
  auto codes = run_processes(n, [&](int rank) -> int {
    auto c = join_shm_group(id, n, rank, small_slots());
    if (!c.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, c.err().message.c_str());
      return 10;
    }
    for (std::size_t k = 0; k < counts.size(); ++k) {
      for (int rep = 0; rep < 2; ++rep) {  // the group is reusable
        auto data = in[k][rank];
        if (auto st = (*c)->all_reduce_sum(data.data(), counts[k], dtype::f32); !st.ok()) {
          std::fprintf(stderr, "rank %d: %s\n", rank, st.err().message.c_str());
          return 11;
        }
        if (std::memcmp(data.data(), want[k][rank].data(), counts[k] * 4) != 0) {
          std::fprintf(stderr, "rank %d: all_reduce of %zu differs from the thread group\n", rank, counts[k]);
          return 12;
        }
      }
    }
    std::vector<std::int32_t> ints(1000, rank + 1);
    if (!(*c)->all_reduce_sum(ints.data(), ints.size(), dtype::i32).ok() || ints[999] != n * (n + 1) / 2) return 13;
    std::vector<float> out(gather_count * n, -1.0f);
    if (!(*c)->all_gather(gather_in[rank].data(), out.data(), gather_count, dtype::f32).ok()) return 14;
    if (out != gather_want[rank]) return 15;
    // In place: `in` aliases out + rank * count.
    std::vector<float> inplace(gather_count * n, 0.0f);
    std::copy(gather_in[rank].begin(), gather_in[rank].end(), inplace.begin() + rank * gather_count);
    if (!(*c)->all_gather(inplace.data() + rank * gather_count, inplace.data(), gather_count, dtype::f32).ok()) return 16;
    if (inplace != gather_want[rank]) return 17;
    auto b = gather_in[rank];
    if (!(*c)->broadcast(b.data(), gather_count, dtype::f32, n - 1).ok() || b != gather_in[n - 1]) return 18;
    return 0;
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r << " (codes: 1x = which check, see the test)";
}

INSTANTIATE_TEST_SUITE_P(Processes, ShmCollective, ::testing::Values(2, 4),
                         [](const auto& info) { return std::to_string(info.param) + "processes"; });

TEST(ShmCollectiveFailure, ARankThatDiesIsAnErrorOnTheOthersWithinABound) {
  auto id = make_shm_group_id();
  auto codes = run_processes(3, [&](int rank) -> int {
    auto c = join_shm_group(id, 3, rank, small_slots());
    if (!c.ok()) return 10;
    if (rank == 2) ::raise(SIGKILL);  // joined, then gone before the operation
    std::vector<float> a(100, 1.0f);
    auto t0 = std::chrono::steady_clock::now();
    auto st = (*c)->all_reduce_sum(a.data(), a.size(), dtype::f32);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (st.ok()) return 11;
    std::fprintf(stderr, "[ bound    ] rank %d saw the dead rank after %.0f ms: %s\n", rank, ms, st.err().message.c_str());
    if (st.err().message.find("died") == std::string::npos) return 12;
    if (ms > 2000) return 13;  // liveness checks every 100 ms; the group timeout (30 s) must not be what fired
    // Broken for good: the next operation fails at once.
    return (*c)->broadcast(a.data(), a.size(), dtype::f32, 0).ok() ? 14 : 0;
  });
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
  EXPECT_EQ(codes[2], 128 + SIGKILL);
}

TEST(ShmCollectiveFailure, BadIdsAndMismatchedGroupsAreErrors) {
  std::string bad = "no-slash";
  std::vector<std::byte> bad_id(bad.size());
  std::memcpy(bad_id.data(), bad.data(), bad.size());
  EXPECT_EQ(join_shm_group(bad_id, 1, 0).err().code, errc::invalid_argument);
  EXPECT_EQ(join_shm_group(make_shm_group_id(), 2, 2).err().code, errc::invalid_argument);
  // One rank alone is a group: its operations are copies.
  auto solo = join_shm_group(make_shm_group_id(), 1, 0);
  ASSERT_TRUE(solo.ok()) << solo.err().message;
  std::vector<float> a = {1, 2, 3};
  ASSERT_TRUE((*solo)->all_reduce_sum(a.data(), 3, dtype::f32).ok());
  EXPECT_EQ(a, (std::vector<float>{1, 2, 3}));
  EXPECT_EQ((*solo)->all_reduce_sum(a.data(), 3, dtype::bf16).err().code, errc::unsupported);
  // Ranks that disagree on the slot size: the second is refused with a reason.
  auto id = make_shm_group_id();
  auto codes = run_processes(2, [&](int rank) -> int {
    auto o = small_slots();
    o.timeout = std::chrono::milliseconds(1500);
    if (rank == 1) o.slot_bytes *= 2;
    auto c = join_shm_group(id, 2, rank, o);
    if (rank == 1) return !c.ok() && c.err().message.find("expects") != std::string::npos ? 0 : 20;
    return c.ok() ? 21 : 0;  // rank 0 then times out waiting for rank 1
  });
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
}

}  // namespace
}  // namespace conveyor::transport
