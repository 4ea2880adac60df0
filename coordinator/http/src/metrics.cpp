#include "conveyor/http/metrics.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
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
    for (std::size_t i = 0; i < s.bounds.size(); ++i) {
      sample(name + "_bucket", static_cast<double>(s.cumulative[i]), "le=\"" + num(s.bounds[i]) + "\"");
    }
    sample(name + "_bucket", static_cast<double>(s.cumulative.back()), "le=\"+Inf\"");
    sample(name + "_sum", s.sum);
    sample(name + "_count", static_cast<double>(s.count));
  }
  std::string str() const { return out_.str(); }

 private:
  std::ostringstream out_;
};

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
  p.family("conveyor_stage_busy_seconds_total", "counter", "Time each pipeline stage spent computing.");
  for (std::size_t i = 0; i < s.stage_busy_s.size(); ++i) {
    p.sample("conveyor_stage_busy_seconds_total", s.stage_busy_s[i], "stage=\"" + std::to_string(i) + "\"");
  }
  p.family("conveyor_stage_idle_seconds_total", "counter", "Time each pipeline stage waited for work (the bubble).");
  for (std::size_t i = 0; i < s.stage_idle_s.size(); ++i) {
    p.sample("conveyor_stage_idle_seconds_total", s.stage_idle_s[i], "stage=\"" + std::to_string(i) + "\"");
  }
  return p.str();
}

}  // namespace conveyor::http
