#pragma once
// What the scheduler tests share: a sink that records what it is told, and a fixture that drives a
// batch_scheduler over the tiny-llama fixture split into two in-process stages.
#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

#include "../engine/golden.hpp"
#include "conveyor/engine/local_pipeline.hpp"
#include "conveyor/kernels/cpu_backend.hpp"
#include "conveyor/scheduler/batch_scheduler.hpp"

namespace conveyor::scheduler::testing {

struct collecting_sink : service::token_sink {
  std::vector<std::int32_t> tokens;
  std::optional<result<service::generate_summary>> done;
  std::mutex mu;
  std::condition_variable cv;
  void on_tokens(std::span<const std::int32_t> t) override {
    std::lock_guard l(mu);
    tokens.insert(tokens.end(), t.begin(), t.end());
  }
  void on_done(result<service::generate_summary> s) override {
    std::lock_guard l(mu);
    ASSERT_FALSE(done.has_value()) << "on_done called twice";
    done.emplace(std::move(s));
    cv.notify_all();
  }
  bool wait(double seconds = 30) {
    std::unique_lock l(mu);
    return cv.wait_for(l, std::chrono::duration<double>(seconds), [&] { return done.has_value(); });
  }
  bool ok() {
    std::lock_guard l(mu);
    return done.has_value() && done->ok();
  }
  /// The error code when it failed; nullopt while running or when it succeeded.
  std::optional<errc> code() {
    std::lock_guard l(mu);
    if (!done || done->ok()) return std::nullopt;
    return done->err().code;
  }
};

class scheduler_test : public ::testing::Test {
 protected:
  void SetUp() override {
    golden_ = conveyor::testing::load_golden("tiny-llama");
    backend_ = kernels::make_cpu_backend({});
    make_pipeline();
    opts_.chunks = 3;
    opts_.kv_blocks = 64;
    opts_.kv_block_size = 16;
    opts_.max_step_tokens = 24;
    opts_.max_seqs_per_step = 8;
    opts_.max_context = 512;
    opts_.vocab_size = 1024;
    opts_.eos_ids = {2};
  }

  /// Two stages of tiny-llama with an empty KV cache of 64 blocks of 16 (pipe_).
  void make_pipeline() { pipe_ = pipeline(2); }
  /// `stages` stages of tiny-llama, each with an empty KV cache of 64 blocks of 16.
  std::unique_ptr<engine::local_pipeline> pipeline(int stages) {
    engine::executor_options eo;
    eo.kv_blocks = 64;
    eo.kv_block_size = 16;
    eo.max_step_tokens = 24;
    eo.max_seqs = 8;
    auto p = engine::local_pipeline::create(*backend_, golden_.dir, stages, eo);
    EXPECT_TRUE(p.ok()) << p.err().message;
    return p.ok() ? std::move(p).value() : nullptr;
  }

  service::generate_request greedy(std::size_t prompt) {
    service::generate_request r;
    r.prompt = golden_.prompts[prompt].input_ids;
    r.max_new_tokens = 24;
    r.ignore_eos = true;
    return r;
  }

  /// Runs one step of microbatch m if it has one; false when it had none.
  bool step(batch_scheduler& s, int m, batch_scheduler::clock::time_point now = batch_scheduler::clock::now()) {
    auto plan = s.next_step(m, now);
    if (!plan) return false;
    auto out = pipe_->step(*plan);
    EXPECT_TRUE(out.ok()) << out.err().message;
    if (!out.ok()) return false;
    s.complete(m, out->tokens);
    return true;
  }

  /// Runs microbatches round-robin, one step each, until the scheduler is idle.
  void drain(batch_scheduler& s) {
    for (int guard = 0; s.has_work() && guard < 10000; ++guard) {
      bool any = false;
      for (int m = 0; m < s.chunks(); ++m) any = step(s, m) || any;
      if (!any && !idle(s)) break;
    }
    EXPECT_FALSE(s.has_work()) << "the scheduler did not drain";
  }

  /// Nothing ran: sleeps until the scheduler's next wakeup (a batching delay), as a driver would.
  /// False when nothing will ever change without a new request.
  static bool idle(batch_scheduler& s) {
    auto at = s.next_wakeup();
    if (!at) return false;
    std::this_thread::sleep_until(std::min(*at, batch_scheduler::clock::now() + std::chrono::seconds(1)));
    return true;
  }

  /// Like the coordinator: plans a step of every microbatch before any of them completes (all in
  /// flight at once), then runs and completes them in plan order, as the stages would.
  void drain_pipelined(batch_scheduler& s) {
    for (int guard = 0; s.has_work() && guard < 10000; ++guard) {
      std::vector<std::pair<int, engine::step_plan>> plans;
      for (int m = 0; m < s.chunks(); ++m) {
        if (auto plan = s.next_step(m)) plans.emplace_back(m, std::move(*plan));
      }
      if (plans.empty() && !idle(s)) break;
      for (auto& [m, plan] : plans) {
        auto out = pipe_->step(plan);
        ASSERT_TRUE(out.ok()) << out.err().message;
        s.complete(m, out->tokens);
      }
    }
    EXPECT_FALSE(s.has_work()) << "the scheduler did not drain";
  }

  conveyor::testing::golden_fixture golden_;
  std::unique_ptr<kernels::backend> backend_;
  std::unique_ptr<engine::local_pipeline> pipe_;
  scheduler_options opts_;
};

}  // namespace conveyor::scheduler::testing
