// CPU collective over threads of one process. all_reduce_sum is a reduce-scatter in place (rank r
// sums chunk r of every rank's buffer into its own, in rank order) then an all-gather of chunks:
// each element is summed exactly once, so every rank gets the same bits.
#include "conveyor/transport/cpu_collective.hpp"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace conveyor::transport {

using kernels::dtype;

/// Shared by the ranks: pointer slots and a reusable barrier that can time out and break.
class cpu_group_state {
 public:
  cpu_group_state(int size, std::chrono::milliseconds timeout)
      : in_(size), out_(size), size_(size), timeout_(timeout) {}

  int size() const { return size_; }

  /// Waits until every rank arrived. Once one rank times out, the group is broken for good:
  /// the others' buffers may be in any state, so no later op may trust them.
  status arrive(int rank) {
    std::unique_lock lock(mu_);
    if (broken_) return make_error(errc::internal, "cpu collective: the group is broken: " + why_);
    std::uint64_t gen = generation_.load();
    if (++arrived_ == size_) {
      arrived_ = 0;
      generation_.fetch_add(1);
      cv_.notify_all();
      return ok_status();
    }
    // The others are usually a few microseconds behind (ranks run the same ops): poll the generation
    // for a while before sleeping, since a condition variable's wake-up costs ~15 µs a barrier
    // (bench/tp_step_bench, bench/NOTES.md session 31).
    lock.unlock();
    const auto spin_until = std::chrono::steady_clock::now() + spin_for;
    while (generation_.load() == gen && std::chrono::steady_clock::now() < spin_until) {
    }
    lock.lock();
    if (!cv_.wait_for(lock, timeout_, [&] { return generation_.load() != gen || broken_; })) {
      broken_ = true;
      why_ = "rank " + std::to_string(rank) + " waited " + std::to_string(timeout_.count()) +
             " ms for the other ranks (did one skip or stop calling the collective?)";
      cv_.notify_all();
    }
    if (generation_.load() != gen) return ok_status();
    return make_error(errc::internal, "cpu collective: " + why_);
  }

  std::vector<const void*> in_;
  std::vector<void*> out_;

 private:
  int size_;
  std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  static constexpr std::chrono::microseconds spin_for{50};
  std::atomic<std::uint64_t> generation_{0};  // written under mu_; read without it while polling
  bool broken_ = false;
  std::string why_;

  friend class cpu_group;
};

namespace {

class cpu_collective final : public collective {
 public:
  cpu_collective(std::shared_ptr<cpu_group_state> g, int rank) : g_(std::move(g)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_->size(); }

  status all_reduce_sum(void* data, std::size_t count, dtype type) override {
    if (type != dtype::f32 && type != dtype::i32) {
      // TODO(perf): bf16/f16 (sum in f32, round once) when the CPU engine keeps activations in them.
      return make_error(errc::unsupported, "cpu collective: all_reduce_sum supports f32 and i32, not " +
                                               std::string(kernels::dtype_name(type)));
    }
    int n = size();
    std::size_t esz = kernels::dtype_size(type);
    g_->out_[rank_] = data;
    CONVEYOR_TRY(g_->arrive(rank_));
    // Phase 1: only this rank reads or writes chunk rank_ of its own buffer, so it may sum in place.
    std::size_t begin = count * rank_ / n, end = count * (rank_ + 1) / n;
    if (type == dtype::f32) {
      reduce_chunk<float>(static_cast<float*>(data), begin, end);
    } else {
      reduce_chunk<std::int32_t>(static_cast<std::int32_t*>(data), begin, end);
    }
    CONVEYOR_TRY(g_->arrive(rank_));
    // Phase 2: every chunk is final in its owner's buffer; copy the others' chunks.
    for (int q = 0; q < n; ++q) {
      if (q == rank_) continue;
      std::size_t b = count * q / n, e = count * (q + 1) / n;
      std::memcpy(static_cast<char*>(data) + b * esz, static_cast<const char*>(g_->out_[q]) + b * esz, (e - b) * esz);
    }
    // Phase 3: nobody may reuse its buffer while another rank still copies from it.
    return g_->arrive(rank_);
  }

  status all_gather(const void* in, void* out, std::size_t count, dtype type) override {
    std::size_t bytes = count * kernels::dtype_size(type);
    g_->in_[rank_] = in;
    CONVEYOR_TRY(g_->arrive(rank_));
    for (int q = 0; q < size(); ++q) {
      auto* dst = static_cast<char*>(out) + q * bytes;
      if (g_->in_[q] != dst) std::memmove(dst, g_->in_[q], bytes);
    }
    return g_->arrive(rank_);
  }

  status broadcast(void* data, std::size_t count, dtype type, int root) override {
    if (root < 0 || root >= size()) {
      return make_error(errc::invalid_argument, "cpu collective: broadcast root " + std::to_string(root) +
                                                    " outside [0, " + std::to_string(size()) + ")");
    }
    std::size_t bytes = count * kernels::dtype_size(type);
    g_->out_[rank_] = data;
    CONVEYOR_TRY(g_->arrive(rank_));
    if (rank_ != root) std::memcpy(data, g_->out_[root], bytes);
    return g_->arrive(rank_);
  }

 private:
  /// dst[begin, end) = sum over ranks q = 0..n-1 (in that order) of rank q's buffer, in blocks that
  /// stay in L1 while every rank's slice is added.
  template <class T>
  void reduce_chunk(T* dst, std::size_t begin, std::size_t end) {
    constexpr std::size_t block = 2048;
    T acc[block];
    int n = size();
    for (std::size_t b = begin; b < end; b += block) {
      std::size_t len = std::min(block, end - b);
      const T* first = static_cast<const T*>(g_->out_[0]) + b;
      std::copy(first, first + len, acc);
      for (int q = 1; q < n; ++q) {
        const T* src = static_cast<const T*>(g_->out_[q]) + b;
        for (std::size_t i = 0; i < len; ++i) acc[i] += src[i];
      }
      std::copy(acc, acc + len, dst + b);
    }
  }

  std::shared_ptr<cpu_group_state> g_;
  int rank_;
};

}  // namespace

cpu_group::cpu_group(int size, std::chrono::milliseconds timeout)
    : state_(std::make_shared<cpu_group_state>(size, timeout)) {
  assert(size >= 1);
}
cpu_group::~cpu_group() = default;
int cpu_group::size() const { return state_->size(); }

std::vector<std::unique_ptr<collective>> cpu_group::all_ranks() {
  std::vector<std::unique_ptr<collective>> out;
  for (int r = 0; r < size(); ++r) out.push_back(rank(r));
  return out;
}

std::unique_ptr<collective> cpu_group::rank(int rank) {
  assert(rank >= 0 && rank < state_->size());
  return std::make_unique<cpu_collective>(state_, rank);
}

}  // namespace conveyor::transport
