#pragma once
// What the gateway measures itself (latency histograms, request and token counters) and how it and
// the service's stats_report are written in the Prometheus text format (version 0.0.4). Plain C++:
// unit-tested without a server.
#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "conveyor/service/inference_service.hpp"

namespace conveyor::http {

/// A Prometheus histogram with fixed upper bounds (seconds). Thread-safe.
class histogram {
 public:
  explicit histogram(std::vector<double> bounds);
  void observe(double v);
  struct snapshot {
    std::vector<double> bounds;
    std::vector<std::uint64_t> cumulative;  ///< per bound, then +Inf last
    double sum = 0.0;
    std::uint64_t count = 0;
  };
  snapshot read() const;

 private:
  mutable std::mutex mu_;
  std::vector<double> bounds_;
  std::vector<std::uint64_t> counts_;  // per bucket (not cumulative), +Inf last
  double sum_ = 0.0;
  std::uint64_t count_ = 0;
};

/// Everything the gateway counts. One instance per server; every member is thread-safe.
class gateway_metrics {
 public:
  gateway_metrics();
  histogram time_to_first_token;  ///< submission to the first generated token
  histogram inter_token_latency;  ///< between consecutive generated tokens of a request
  histogram e2e_latency;          ///< submission to the last token (successful requests)
  histogram queue_time;           ///< submission to the first scheduled step (the service's queue_s)
  histogram prompt_tokens;        ///< prompt length per request (tokens)
  histogram generation_tokens;    ///< completion length per request (tokens)

  /// One finished HTTP request: its route ("/v1/completions") and status code.
  void count_response(const std::string& route, int status);
  /// One generation's end: "stop" | "length" | "cancelled", or the error kind ("deadline", ...).
  void count_finish(const std::string& reason);
  void add_tokens(std::int64_t prompt, std::int64_t generated);
  void set_active(int delta);

  /// The whole page: gateway metrics, plus the service's when `stats` is set (else
  /// conveyor_service_stats_up 0), plus model info.
  std::string render(const std::optional<service::stats_report>& stats, const service::model_info& info) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, std::uint64_t> responses_;
  std::map<std::string, std::uint64_t> finishes_;
  std::int64_t prompt_total_ = 0, generated_total_ = 0;
  std::int64_t active_ = 0;
};

}  // namespace conveyor::http
