#pragma once
// What the cluster tests share: a sink that records a request's tokens and outcome, and the options
// of a small CPU cluster on loopback whose workers are this build's `conveyor worker`.
#include <condition_variable>
#include <future>
#include <mutex>
#include <optional>

#include "../engine/golden.hpp"
#include "conveyor/coordinator/cluster.hpp"

namespace conveyor::coordinator {

struct collecting_sink : service::token_sink {
  std::vector<std::int32_t> tokens;
  std::optional<result<service::generate_summary>> done;
  std::mutex mu;
  std::condition_variable cv;
  void on_tokens(std::span<const std::int32_t> t) override {
    std::lock_guard l(mu);
    tokens.insert(tokens.end(), t.begin(), t.end());
    cv.notify_all();
  }
  void on_done(result<service::generate_summary> s) override {
    std::lock_guard l(mu);
    done.emplace(std::move(s));
    cv.notify_all();
  }
  bool wait(double seconds = 60) {
    std::unique_lock l(mu);
    return cv.wait_for(l, std::chrono::duration<double>(seconds), [&] { return done.has_value(); });
  }
  bool wait_tokens(std::size_t n, double seconds = 60) {
    std::unique_lock l(mu);
    return cv.wait_for(l, std::chrono::duration<double>(seconds), [&] { return tokens.size() >= n || done.has_value(); });
  }
};

inline cluster_options base_options(const std::string& fixture, int stages) {
  cluster_options o;
  o.model_dir = testing::fixture_dir(fixture);
  o.stages = stages;
  o.chunks = stages;
  o.kv_blocks = 128;
  o.max_step_tokens = 256;
  o.worker_threads = 1;
  o.executable = CONVEYOR_BINARY;
  o.startup_timeout = std::chrono::seconds(60);
  o.ucx_tls = "tcp";
  return o;
}

inline service::generate_request greedy(const testing::golden_prompt& p) {
  service::generate_request r;
  r.prompt = p.input_ids;
  r.max_new_tokens = static_cast<int>(p.greedy.size());
  r.ignore_eos = true;
  return r;
}

inline service::stats_report stats_of(service::inference_service& svc) {
  auto p = std::make_shared<std::promise<service::stats_report>>();
  auto f = p->get_future();
  svc.stats([p](service::stats_report r) { p->set_value(std::move(r)); });
  return f.get();
}

}  // namespace conveyor::coordinator
