// /metrics of the HTTP gateway in front of a real 2-stage CPU cluster (stage workers are separate
// processes, wired over UCX): the page parses as Prometheus text, and the serving counters (prefix
// cache, preemptions, rejections, errors by kind, microbatches) and every worker's activation-frame
// counters (bytes and send latency per hop, labelled with stage, TP rank and host) move with traffic.
#include <gtest/gtest.h>
#include <unistd.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "../engine/golden.hpp"
#include "conveyor/coordinator/cluster.hpp"
#include "http_test_util.hpp"

namespace conveyor::coordinator {
namespace {

using json = nlohmann::json;

struct waiting_sink : service::token_sink {
  std::optional<result<service::generate_summary>> done;
  std::vector<std::int32_t> tokens;
  std::mutex mu;
  std::condition_variable cv;
  void on_tokens(std::span<const std::int32_t> t) override {
    std::lock_guard l(mu);
    tokens.insert(tokens.end(), t.begin(), t.end());
  }
  void on_done(result<service::generate_summary> s) override {
    std::lock_guard l(mu);
    done.emplace(std::move(s));
    cv.notify_all();
  }
  bool wait() {
    std::unique_lock l(mu);
    return cv.wait_for(l, std::chrono::seconds(120), [&] { return done.has_value(); });
  }
};

double at(const std::map<std::string, double>& m, const std::string& key) {
  auto it = m.find(key);
  return it == m.end() ? -1.0 : it->second;
}

/// The value of the one series whose key starts with `prefix` (labels after it unknown), else -1.
double at_prefix(const std::map<std::string, double>& m, const std::string& prefix) {
  auto it = m.lower_bound(prefix);
  return it != m.end() && it->first.compare(0, prefix.size(), prefix) == 0 ? it->second : -1.0;
}

TEST(cluster_metrics, prometheus_page_moves_with_traffic_through_two_stages) {
  const auto golden = testing::load_golden("tiny-llama");
  cluster_options o;
  o.model_dir = golden.dir;
  o.stages = 2;
  o.chunks = 2;
  o.kv_blocks = 8;  // of 16 tokens: one 100 + 24 token sequence at a time, so two of them preempt
  o.kv_block_size = 16;
  o.max_step_tokens = 256;
  o.worker_threads = 1;
  o.executable = CONVEYOR_BINARY;
  o.startup_timeout = std::chrono::seconds(60);
  o.ucx_tls = "tcp";
  o.heartbeat = std::chrono::milliseconds(100);  // the frame counters arrive with the heartbeat
  o.policy.job_queue_size = 1;                   // a burst overflows the queue
  auto c = cluster::start(o);
  ASSERT_TRUE(c.ok()) << c.err().message;
  auto& svc = (*c)->service();
  http::http_server_options ho;
  ho.listen = "127.0.0.1:0";
  ho.model_name = "tiny-llama";
  auto server = http::start_http_server(svc, nullptr, ho);
  ASSERT_TRUE(server.ok()) << server.err().message;
  httplib::Client web("127.0.0.1", (*server)->port());
  web.set_read_timeout(120, 0);
  auto scrape = [&] {
    auto r = web.Get("/metrics");
    std::map<std::string, double> v;
    EXPECT_TRUE(r);
    if (!r) return v;
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(http::testing::check_prometheus(r->body, v), "") << r->body;
    return v;
  };
  char name[256] = {};
  ASSERT_EQ(::gethostname(name, sizeof name - 1), 0);
  const std::string host = name;
  auto hop = [&](const std::string& metric, int stage, int peer) {
    return metric + "{stage=\"" + std::to_string(stage) + "\",tp_rank=\"0\",host=\"" + host + "\",peer_stage=\"" +
           std::to_string(peer) + "\"}";
  };
  // The workers report with the heartbeat: wait for both stages' first report.
  std::map<std::string, double> before;
  for (int i = 0; i < 50; ++i) {
    before = scrape();
    if (at(before, hop("conveyor_activation_frames_sent_total", 0, 1)) >= 0 &&
        at(before, hop("conveyor_activation_frames_received_total", 1, 0)) >= 0) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(at(before, "conveyor_microbatches"), 2);
  ASSERT_GE(at(before, hop("conveyor_activation_frames_sent_total", 0, 1)), 0) << "no hop series for stage 0";
  ASSERT_GE(at(before, hop("conveyor_activation_frames_received_total", 1, 0)), 0) << "no hop series for stage 1";

  // The 100-token prompt twice through HTTP: the second finds its 6 full blocks cached.
  const auto& p3 = golden.prompts[3];
  for (int i = 0; i < 2; ++i) {
    auto r = web.Post("/v1/completions",
                      json{{"prompt", p3.input_ids}, {"max_tokens", 24}, {"temperature", 0}, {"ignore_eos", true}}.dump(),
                      "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(json::parse(r->body)["choices"][0]["token_ids"].get<std::vector<std::int32_t>>(), p3.greedy);
  }
  // A burst of the same long prompt: two start (one per microbatch; they preempt each other for the
  // 8 blocks), one waits, the queue cap of 1 turns the rest away; every accepted one completes.
  std::vector<std::shared_ptr<waiting_sink>> burst;
  for (int i = 0; i < 8; ++i) {
    service::generate_request r;
    r.prompt = p3.input_ids;
    r.max_new_tokens = 24;
    r.ignore_eos = true;
    burst.push_back(std::make_shared<waiting_sink>());
    svc.submit(r, burst.back());
  }
  int accepted = 0, rejected = 0;
  for (auto& s : burst) {
    ASSERT_TRUE(s->wait());
    if (s->done->ok()) {
      ++accepted;
      EXPECT_EQ(s->tokens, p3.greedy) << "preemption must not change the tokens";
    } else {
      EXPECT_EQ(s->done->err().code, errc::overloaded) << s->done->err().message;
      ++rejected;
    }
  }
  EXPECT_GE(accepted, 2);
  EXPECT_GE(rejected, 1);
  // A deadline no request can meet, enforced by the coordinator's scheduler.
  {
    service::generate_request r;
    r.prompt = {1, 2, 3};
    r.max_new_tokens = 400;
    r.ignore_eos = true;
    r.deadline_s = 0.001;
    auto late = std::make_shared<waiting_sink>();
    svc.submit(r, late);
    ASSERT_TRUE(late->wait());
    ASSERT_FALSE(late->done->ok());
    EXPECT_EQ(late->done->err().code, errc::deadline_exceeded) << late->done->err().message;
  }

  // The workers' counters reach the coordinator with the next heartbeats; once the pipeline is quiet,
  // every frame sent has been received and timed.
  std::map<std::string, double> after;
  const auto sent = hop("conveyor_activation_frames_sent_total", 0, 1);
  const auto received = hop("conveyor_activation_frames_received_total", 1, 0);
  const auto timed = hop("conveyor_activation_frame_send_seconds", 0, 1).insert(
      std::string("conveyor_activation_frame_send_seconds").size(), "_count");
  for (int i = 0; i < 100; ++i) {
    after = scrape();
    // Steps come with the ping's pong, frames with the metrics reply: two answers, maybe two heartbeats.
    const std::string steps1 = "conveyor_stage_steps_total{stage=\"1\",host=\"";
    if (at(after, sent) > at(before, sent) && at(after, sent) == at(after, received) && at(after, sent) == at(after, timed) &&
        at_prefix(after, steps1) > at_prefix(before, steps1))
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_GT(at(after, sent), at(before, sent));
  EXPECT_EQ(at(after, sent), at(after, received));
  EXPECT_EQ(at(after, timed), at(after, sent)) << "every completed send is timed";
  const auto bytes_sent = hop("conveyor_activation_bytes_sent_total", 0, 1);
  EXPECT_GT(at(after, bytes_sent), at(before, bytes_sent));
  EXPECT_EQ(at(after, bytes_sent), at(after, hop("conveyor_activation_bytes_received_total", 1, 0)));
  // Hidden states are f32 rows of hidden_size: whole rows only.
  EXPECT_EQ(static_cast<std::int64_t>(at(after, bytes_sent)) % (4 * svc.info().hidden_size), 0);
  const std::string sum = hop("conveyor_activation_frame_send_seconds", 0, 1).insert(
      std::string("conveyor_activation_frame_send_seconds").size(), "_sum");
  EXPECT_GT(at(after, sum), 0.0);
  EXPECT_EQ(at(after, hop("conveyor_activation_sends_in_flight", 0, 1)), 0);
  EXPECT_LT(at(after, hop("conveyor_activation_frames_sent_total", 1, 2)), 0) << "the last stage sends no activations";
  // Stage series carry the host their worker reported, like the hop series.
  const std::string steps1 = "conveyor_stage_steps_total{stage=\"1\",host=\"";
  EXPECT_GT(at_prefix(after, steps1), at_prefix(before, steps1));
  EXPECT_GE(at_prefix(after, "conveyor_stage_busy_seconds_total{stage=\"0\",host=\""), 0.0) << "busy time labelled with its host";

  EXPECT_GE(at(after, "conveyor_prefix_cache_hits_total"), at(before, "conveyor_prefix_cache_hits_total") + 96);
  EXPECT_GT(at(after, "conveyor_prefix_cache_queries_total"), at(before, "conveyor_prefix_cache_queries_total"));
  EXPECT_GT(at(after, "conveyor_preemptions_total"), at(before, "conveyor_preemptions_total"));
  EXPECT_EQ(at(after, "conveyor_requests_rejected_total") - at(before, "conveyor_requests_rejected_total"), rejected);
  EXPECT_EQ(at(after, "conveyor_request_errors_total{kind=\"overloaded\"}"), rejected);
  EXPECT_EQ(at(after, "conveyor_request_errors_total{kind=\"deadline_exceeded\"}"), 1);
  EXPECT_EQ(at(after, "conveyor_microbatches_in_flight"), 0);
  (*server)->stop();
}

}  // namespace
}  // namespace conveyor::coordinator
