#include "conveyor/http/metrics.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <sstream>

namespace conveyor::http {

namespace {

std::vector<double> latency_bounds() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 30.0, 60.0, 120.0};
}
std::vector<double> token_bounds() { return {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768}; }

/// Prometheus floats: integers without a fraction, others with enough digits to round-trip.
std::string num(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  char buf[40];
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    std::snprintf(buf, sizeof buf, "%.0f", v);
  } else {
    std::snprintf(buf, sizeof buf, "%.9g", v);
  }
  return buf;
}

std::string escape_label(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\' || c == '"') out.push_back('\\');
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out.push_back(c);
  }
  return out;
}

class page {
 public:
  void family(const std::string& name, const char* type, const char* help) {
    out_ << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
  }
  void sample(const std::string& name, double v, const std::string& labels = "") {
    out_ << name;
    if (!labels.empty()) out_ << '{' << labels << '}';
    out_ << ' ' << num(v) << '\n';
  }
  void hist(const std::string& name, const char* help, const histogram::snapshot& s) {
    family(name, "histogram", help);
    hist_samples(name, s, "");
  }
  /// One labelled series of a histogram family (the family line written before).
  void hist_samples(const std::string& name, const histogram::snapshot& s, const std::string& labels) {
    const std::string sep = labels.empty() ? "" : labels + ",";
    for (std::size_t i = 0; i < s.bounds.size(); ++i) {
      sample(name + "_bucket", static_cast<double>(s.cumulative[i]), sep + "le=\"" + num(s.bounds[i]) + "\"");
    }
    sample(name + "_bucket", static_cast<double>(s.cumulative.back()), sep + "le=\"+Inf\"");
    sample(name + "_sum", s.sum, labels);
    sample(name + "_count", static_cast<double>(s.count), labels);
  }
  std::string str() const { return out_.str(); }

 private:
  std::ostringstream out_;
};

/// The scheduler's policy counters: rejections, expiries, preemptions, the prefix cache, errors by
/// kind, microbatches.

/// A stage's labels: its index, and the host it runs on once its worker has reported (a cluster; the
/// in-process service has no hosts). The TP ranks of a stage share one clock: they step together.
std::string stage_labels(const service::stats_report& s, int stage) {
  std::string l = "stage=\"" + std::to_string(stage) + "\"";
  for (const auto& h : s.hops) {
    if (h.stage == stage && h.tp_rank == 0 && !h.host.empty()) return l + ",host=\"" + escape_label(h.host) + "\"";
  }
  return l;
}

void render_policy(page& p, const service::stats_report& s) {
  p.family("conveyor_requests_rejected_total", "counter",
           "Requests admission control turned away as overloaded (queue caps, job tickets); never started.");
  p.sample("conveyor_requests_rejected_total", static_cast<double>(s.requests_rejected));
  p.family("conveyor_requests_expired_total", "counter", "Requests cancelled at their deadline (also failed).");
  p.sample("conveyor_requests_expired_total", static_cast<double>(s.requests_expired));
  p.family("conveyor_preemptions_total", "counter",
           "Times a running sequence gave its KV blocks back under memory pressure (re-prefilled later).");
  p.sample("conveyor_preemptions_total", static_cast<double>(s.preemptions));
  p.family("conveyor_prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache (whole blocks).");
  p.sample("conveyor_prefix_cache_queries_total", static_cast<double>(s.prefix_cache_queried_tokens));
  p.family("conveyor_prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache: their prefill was skipped.");
  p.sample("conveyor_prefix_cache_hits_total", static_cast<double>(s.prefix_cache_hit_tokens));
  p.family("conveyor_kv_blocks_cached", "gauge", "KV-cache blocks naming a prompt prefix that later prompts can share.");
  p.sample("conveyor_kv_blocks_cached", s.kv_blocks_cached);
  p.family("conveyor_request_errors_total", "counter",
           "Errors the service answered requests with, by kind (invalid_argument, overloaded, deadline_exceeded, internal, ...).");
  for (const auto& [kind, n] : s.errors_by_kind) {
    p.sample("conveyor_request_errors_total", static_cast<double>(n), "kind=\"" + escape_label(kind) + "\"");
  }
  p.family("conveyor_microbatches", "gauge", "Microbatch slots the scheduler keeps in the pipeline (parallel.chunks).");
  p.sample("conveyor_microbatches", s.microbatches);
  p.family("conveyor_microbatches_in_flight", "gauge", "Microbatches with a step on the stages now.");
  p.sample("conveyor_microbatches_in_flight", s.microbatches_in_flight);
  p.family("conveyor_stage_steps_total", "counter", "Steps each pipeline stage ran.");
  for (std::size_t i = 0; i < s.stage_steps.size(); ++i) {
    p.sample("conveyor_stage_steps_total", static_cast<double>(s.stage_steps[i]), stage_labels(s, static_cast<int>(i)));
  }
}

/// Activation frames per pipeline hop, from every stage worker: what stage k sent to k + 1 (with the
/// send latency) and what k + 1 received from k. Labels: the reporting stage, its TP rank and host,
/// and the stage at the other end of the hop.
void render_hops(page& p, const service::stats_report& s) {
  const int n = static_cast<int>(s.stage_busy_s.size());  // stages; a worker not heard from yet has no hop entry
  auto labels = [](const service::frame_hop_report& h, int peer) {
    return "stage=\"" + std::to_string(h.stage) + "\",tp_rank=\"" + std::to_string(h.tp_rank) + "\",host=\"" +
           escape_label(h.host) + "\",peer_stage=\"" + std::to_string(peer) + "\"";
  };
  auto each_sender = [&](const std::function<void(const service::frame_hop_report&, const std::string&)>& fn) {
    for (const auto& h : s.hops) {
      if (h.stage + 1 < n) fn(h, labels(h, h.stage + 1));
    }
  };
  auto each_receiver = [&](const std::function<void(const service::frame_hop_report&, const std::string&)>& fn) {
    for (const auto& h : s.hops) {
      if (h.stage > 0) fn(h, labels(h, h.stage - 1));
    }
  };
  p.family("conveyor_activation_frames_sent_total", "counter", "Activation frames a stage sent to the next stage.");
  each_sender([&](const auto& h, const auto& l) { p.sample("conveyor_activation_frames_sent_total", static_cast<double>(h.frames_sent), l); });
  p.family("conveyor_activation_bytes_sent_total", "counter", "Activation payload bytes a stage sent to the next stage.");
  each_sender([&](const auto& h, const auto& l) { p.sample("conveyor_activation_bytes_sent_total", static_cast<double>(h.bytes_sent), l); });
  p.family("conveyor_activation_frames_received_total", "counter", "Activation frames a stage received from the previous stage.");
  each_receiver([&](const auto& h, const auto& l) {
    p.sample("conveyor_activation_frames_received_total", static_cast<double>(h.frames_received), l);
  });
  p.family("conveyor_activation_bytes_received_total", "counter", "Activation payload bytes a stage received from the previous stage.");
  each_receiver([&](const auto& h, const auto& l) {
    p.sample("conveyor_activation_bytes_received_total", static_cast<double>(h.bytes_received), l);
  });
  p.family("conveyor_activation_sends_in_flight", "gauge",
           "Activation frames handed to the transport and not yet completed (microbatches on the wire).");
  each_sender([&](const auto& h, const auto& l) { p.sample("conveyor_activation_sends_in_flight", h.sends_in_flight, l); });
  p.family("conveyor_activation_frame_send_seconds", "histogram",
           "From handing an activation frame to the transport until it completed the send (for frames over UCX's "
           "rendezvous threshold: until the next stage pulled the bytes).");
  each_sender([&](const auto& h, const auto& l) {
    histogram::snapshot snap;
    snap.bounds = h.send_latency_bounds;
    std::uint64_t run = 0;
    for (auto c : h.send_latency_counts) snap.cumulative.push_back(run += c);
    if (snap.cumulative.size() != snap.bounds.size() + 1) return;  // a malformed report: leave it out
    snap.sum = h.send_latency_sum_s;
    snap.count = run;
    p.hist_samples("conveyor_activation_frame_send_seconds", snap, l);
  });
}

}  // namespace

histogram::histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void histogram::observe(double v) {
  const auto i = static_cast<std::size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  std::lock_guard lock(mu_);
  ++counts_[i];
  sum_ += v;
  ++count_;
}

histogram::snapshot histogram::read() const {
  std::lock_guard lock(mu_);
  snapshot s;
  s.bounds = bounds_;
  std::uint64_t run = 0;
  for (auto c : counts_) {
    run += c;
    s.cumulative.push_back(run);
  }
  s.sum = sum_;
  s.count = count_;
  return s;
}

gateway_metrics::gateway_metrics()
    : time_to_first_token(latency_bounds()),
      inter_token_latency(latency_bounds()),
      e2e_latency(latency_bounds()),
      queue_time(latency_bounds()),
      prompt_tokens(token_bounds()),
      generation_tokens(token_bounds()) {}

void gateway_metrics::count_response(const std::string& route, int status) {
  std::lock_guard lock(mu_);
  ++responses_[{route, status}];
}

void gateway_metrics::count_finish(const std::string& reason) {
  std::lock_guard lock(mu_);
  ++finishes_[reason];
}

void gateway_metrics::add_tokens(std::int64_t prompt, std::int64_t generated) {
  std::lock_guard lock(mu_);
  prompt_total_ += prompt;
  generated_total_ += generated;
}

void gateway_metrics::set_active(int delta) {
  std::lock_guard lock(mu_);
  active_ += delta;
}

std::string gateway_metrics::render(const std::optional<service::stats_report>& stats,
                                    const service::model_info& info) const {
  page p;
  {
    std::lock_guard lock(mu_);
    p.family("conveyor_http_requests_total", "counter", "HTTP requests answered, by route and status code.");
    for (const auto& [key, n] : responses_) {
      p.sample("conveyor_http_requests_total", static_cast<double>(n),
               "route=\"" + escape_label(key.first) + "\",code=\"" + std::to_string(key.second) + "\"");
    }
    p.family("conveyor_request_finish_total", "counter",
             "Generation requests ended, by finish reason (stop, length, cancelled) or error kind.");
    for (const auto& [reason, n] : finishes_) {
      p.sample("conveyor_request_finish_total", static_cast<double>(n), "reason=\"" + escape_label(reason) + "\"");
    }
    p.family("conveyor_http_active_requests", "gauge", "Generation requests the gateway is serving now.");
    p.sample("conveyor_http_active_requests", static_cast<double>(active_));
    p.family("conveyor_prompt_tokens_total", "counter", "Prompt tokens of requests served through the gateway.");
    p.sample("conveyor_prompt_tokens_total", static_cast<double>(prompt_total_));
    p.family("conveyor_generation_tokens_total", "counter", "Tokens generated for requests served through the gateway.");
    p.sample("conveyor_generation_tokens_total", static_cast<double>(generated_total_));
  }
  p.hist("conveyor_time_to_first_token_seconds", "Submission to the first generated token.", time_to_first_token.read());
  p.hist("conveyor_inter_token_latency_seconds", "Time between consecutive generated tokens of a request.",
         inter_token_latency.read());
  p.hist("conveyor_e2e_request_latency_seconds", "Submission to the last token of a successful request.",
         e2e_latency.read());
  p.hist("conveyor_request_queue_time_seconds", "Submission to the first scheduled step.", queue_time.read());
  p.hist("conveyor_request_prompt_tokens", "Prompt length per request.", prompt_tokens.read());
  p.hist("conveyor_request_generation_tokens", "Generated tokens per request.", generation_tokens.read());

  p.family("conveyor_model_info", "gauge", "The served model (value 1; the facts are labels).");
  p.sample("conveyor_model_info", 1,
           "model_type=\"" + escape_label(info.model_type) + "\",layers=\"" + std::to_string(info.num_layers) +
               "\",stages=\"" + std::to_string(info.stages) + "\",tp=\"" + std::to_string(info.tp) + "\",chunks=\"" +
               std::to_string(info.chunks) + "\"");
  p.family("conveyor_service_stats_up", "gauge", "1 when the service answered the stats query in time.");
  p.sample("conveyor_service_stats_up", stats ? 1 : 0);
  if (!stats) return p.str();
  const auto& s = *stats;
  p.family("conveyor_requests_running", "gauge", "Requests in a running batch.");
  p.sample("conveyor_requests_running", static_cast<double>(s.requests_running));
  p.family("conveyor_requests_waiting", "gauge", "Requests waiting to be scheduled.");
  p.sample("conveyor_requests_waiting", static_cast<double>(s.requests_waiting));
  p.family("conveyor_requests_finished_total", "counter", "Requests the service finished (any finish reason).");
  p.sample("conveyor_requests_finished_total", static_cast<double>(s.requests_finished));
  p.family("conveyor_requests_failed_total", "counter", "Requests the service failed.");
  p.sample("conveyor_requests_failed_total", static_cast<double>(s.requests_failed));
  p.family("conveyor_tokens_generated_total", "counter", "Tokens the service generated (all frontends).");
  p.sample("conveyor_tokens_generated_total", static_cast<double>(s.tokens_generated));
  p.family("conveyor_kv_blocks_total", "gauge", "KV-cache blocks per stage.");
  p.sample("conveyor_kv_blocks_total", s.kv_blocks_total);
  p.family("conveyor_kv_blocks_free", "gauge", "KV-cache blocks free.");
  p.sample("conveyor_kv_blocks_free", s.kv_blocks_free);
  p.family("conveyor_kv_cache_usage_ratio", "gauge", "Share of KV-cache blocks in use (0..1).");
  p.sample("conveyor_kv_cache_usage_ratio",
           s.kv_blocks_total > 0 ? 1.0 - static_cast<double>(s.kv_blocks_free) / s.kv_blocks_total : 0.0);
  p.family("conveyor_spec_draft_tokens_total", "counter", "Speculative decoding: draft tokens the model verified.");
  p.sample("conveyor_spec_draft_tokens_total", static_cast<double>(s.spec_draft_tokens));
  p.family("conveyor_spec_accepted_tokens_total", "counter", "Speculative decoding: draft tokens kept.");
  p.sample("conveyor_spec_accepted_tokens_total", static_cast<double>(s.spec_accepted_tokens));
  p.family("conveyor_spec_acceptance_ratio", "gauge", "Speculative decoding: kept / verified draft tokens (0..1).");
  p.sample("conveyor_spec_acceptance_ratio",
           s.spec_draft_tokens > 0 ? static_cast<double>(s.spec_accepted_tokens) / s.spec_draft_tokens : 0.0);
  p.family("conveyor_spec_tokens_per_step", "gauge",
           "Speculative decoding: tokens a sequence gains per step that carried drafts (plain decoding: 1).");
  p.sample("conveyor_spec_tokens_per_step",
           s.spec_steps > 0 ? static_cast<double>(s.spec_emitted_tokens) / s.spec_steps : 0.0);
  p.family("conveyor_steps_queued_ahead_total", "counter",
           "Steps planned before the tokens of the step in flight came back and chained on the stage "
           "(serving.queued_steps).");
  p.sample("conveyor_steps_queued_ahead_total", static_cast<double>(s.steps_queued_ahead));
  p.family("conveyor_stage_busy_seconds_total", "counter", "Time each pipeline stage spent computing.");
  for (std::size_t i = 0; i < s.stage_busy_s.size(); ++i) {
    p.sample("conveyor_stage_busy_seconds_total", s.stage_busy_s[i], stage_labels(s, static_cast<int>(i)));
  }
  p.family("conveyor_stage_idle_seconds_total", "counter", "Time each pipeline stage waited for work (the bubble).");
  for (std::size_t i = 0; i < s.stage_idle_s.size(); ++i) {
    p.sample("conveyor_stage_idle_seconds_total", s.stage_idle_s[i], stage_labels(s, static_cast<int>(i)));
  }
  render_policy(p, s);
  render_hops(p, s);
  return p.str();
}

}  // namespace conveyor::http
