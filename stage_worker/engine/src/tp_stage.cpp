#include "conveyor/engine/tp_stage.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

namespace conveyor::engine {

/// One thread per rank past the first, started with the stage: a step hands each the same job and
/// waits until all have run it (the caller runs rank 0's part itself). Both sides poll for up to
/// 50 µs before they sleep, as the CPU collective's barriers do: woken by a condition variable alone
/// these threads made a tp 2 step slower than a thread started per step (bench/NOTES.md, session 31).
class tp_stage::rank_threads {
 public:
  explicit rank_threads(std::size_t ranks) {
    for (std::size_t r = 1; r < ranks; ++r) threads_.emplace_back([this, r] { loop(r); });
  }
  ~rank_threads() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
  }
  /// job(r) for every rank r, rank 0 on the calling thread; returns once every rank's call returned.
  void run(const std::function<void(std::size_t)>& job) {
    {
      std::lock_guard lock(mu_);
      job_ = &job;
      pending_.store(threads_.size());
      generation_.fetch_add(1);
    }
    wake_.notify_all();
    job(0);
    poll([&] { return pending_.load() == 0; });
    std::unique_lock lock(mu_);
    done_.wait(lock, [&] { return pending_.load() == 0; });
    job_ = nullptr;
  }

 private:
  template <class P>
  static void poll(P ready) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(50);
    while (!ready() && std::chrono::steady_clock::now() < until) {
    }
  }
  void loop(std::size_t r) {
    std::uint64_t seen = 0;
    for (;;) {
      poll([&] { return generation_.load() != seen; });
      const std::function<void(std::size_t)>* job = nullptr;
      {
        std::unique_lock lock(mu_);
        wake_.wait(lock, [&] { return stop_ || generation_.load() != seen; });
        if (stop_) return;
        seen = generation_.load();
        job = job_;
      }
      (*job)(r);
      std::lock_guard lock(mu_);
      if (pending_.fetch_sub(1) == 1) done_.notify_one();
    }
  }
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(std::size_t)>* job_ = nullptr;
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<std::size_t> pending_{0};
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

tp_stage::~tp_stage() = default;

result<std::unique_ptr<tp_stage>> tp_stage::create(const std::vector<kernels::backend*>& rank_backends,
                                                   checkpoint& ckpt, const model_config& config, stage_range range,
                                                   const executor_options& options, const tp_group_factory& make_group) {
  const int tp = static_cast<int>(rank_backends.size());
  if (tp < 1) return make_error(errc::invalid_argument, "a stage needs at least one backend");
  if (tp > 1 && !make_group) return make_error(errc::invalid_argument, "tensor parallelism needs a collective factory");
  if (auto layout = make_tp_layout(config, 0, tp); !layout) return layout.err();
  std::unique_ptr<tp_stage> s(new tp_stage());
  if (tp > 1) {
    CONVEYOR_TRY_ASSIGN(group, make_group(tp));
    s->group_ = std::move(group);
  }
  for (int r = 0; r < tp; ++r) {
    CONVEYOR_TRY_ASSIGN(ex, stage_executor::create(*rank_backends[r], ckpt, config, range, options,
                                                   tp > 1 ? s->group_[r].get() : nullptr));
    s->ranks_.push_back(std::move(ex));
  }
  s->act_dtype_ = rank_backends[0]->caps().act_dtype;
  if (tp > 1) s->threads_ = std::make_unique<rank_threads>(static_cast<std::size_t>(tp));
  return s;
}

template <class F>
result<step_output> tp_stage::on_every_rank(F run_rank) {
  if (ranks_.size() == 1) return run_rank(0);
  std::vector<std::optional<result<step_output>>> outs(ranks_.size());
  threads_->run([&](std::size_t r) { outs[r].emplace(run_rank(r)); });
  if (!outs[0]->ok()) return std::move(*outs[0]);
  for (std::size_t r = 1; r < outs.size(); ++r) {
    if (!outs[r]->ok()) return outs[r]->err();
  }
  return std::move(*outs[0]);
}

result<step_output> tp_stage::run(const step_plan& plan, std::span<const float> hidden) {
  return on_every_rank([&](std::size_t r) { return ranks_[r]->run(plan, hidden); });
}

result<step_output> tp_stage::run_raw(const step_plan& plan, const void* hidden_in, void* hidden_out) {
  return on_every_rank([&](std::size_t r) { return ranks_[r]->run_raw(plan, hidden_in, r == 0 ? hidden_out : nullptr); });
}

status tp_stage::begin(const step_plan& plan, bool chain) {
  auto r = on_every_rank([&](std::size_t k) -> result<step_output> {
    CONVEYOR_TRY(ranks_[k]->begin(plan, chain));
    return step_output{};
  });
  if (!r) return r.err();
  return ok_status();
}

result<step_output> tp_stage::end() {
  return on_every_rank([&](std::size_t k) { return ranks_[k]->end(); });
}

std::size_t tp_stage::weight_bytes() const {
  std::size_t n = 0;
  for (const auto& r : ranks_) n += r->weight_bytes();
  return n;
}

}  // namespace conveyor::engine
