#include "generation.hpp"

#include <condition_variable>
#include <mutex>
#include <optional>

#include "conveyor/tokenizer/stream_decoder.hpp"

namespace conveyor::http {

namespace {

using clock = std::chrono::steady_clock;

double seconds(clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

/// The sink the service calls from its threads; the HTTP thread waits on it.
class token_queue final : public service::token_sink {
 public:
  void on_tokens(std::span<const std::int32_t> tokens) override {
    {
      std::lock_guard lock(mu_);
      tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
      arrivals_.push_back({clock::now(), tokens.size()});
    }
    cv_.notify_all();
  }
  void on_done(result<service::generate_summary> summary) override {
    {
      std::lock_guard lock(mu_);
      done_.emplace(std::move(summary));
    }
    cv_.notify_all();
  }

  struct batch {
    std::vector<std::int32_t> tokens;
    std::vector<std::pair<clock::time_point, std::size_t>> arrivals;  ///< when each callback's tokens came
    std::optional<result<service::generate_summary>> done;
  };
  /// Waits until something arrived or `until`; true when the request ended in an error before any
  /// token (nothing is consumed).
  bool failed_first(clock::time_point until) {
    std::unique_lock lock(mu_);
    cv_.wait_until(lock, until, [&] { return !tokens_.empty() || done_.has_value(); });
    return tokens_.empty() && done_.has_value() && !done_->ok();
  }
  /// Waits until something arrived or `until`; returns (and clears) what arrived.
  batch take(clock::time_point until) {
    std::unique_lock lock(mu_);
    cv_.wait_until(lock, until, [&] { return !tokens_.empty() || done_.has_value(); });
    batch b;
    b.tokens.swap(tokens_);
    b.arrivals.swap(arrivals_);
    if (done_ && b.tokens.empty()) b.done = std::move(done_);  // tokens first, then the end
    if (b.done) done_.reset();
    return b;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::int32_t> tokens_;
  std::vector<std::pair<clock::time_point, std::size_t>> arrivals_;
  std::optional<result<service::generate_summary>> done_;
};

namespace {

/// The same finish reasons as the gateway's own rejections and deadline, so a dashboard sees one
/// count whichever side decided.
void count_service_failure(gateway_metrics& metrics, const error& e) {
  metrics.count_finish(e.code == errc::overloaded          ? "rejected_overloaded"
                       : e.code == errc::deadline_exceeded ? "deadline"
                       : e.code == errc::invalid_argument  ? "rejected_invalid"
                                                           : "error");
}

}  // namespace

std::string stop_text::push(const std::string& text, bool& hit) {
  hit = false;
  if (stops_.empty()) return text;
  pending_ += text;
  std::size_t first = std::string::npos;
  for (const auto& s : stops_) first = std::min(first, pending_.find(s));
  if (first != std::string::npos) {
    hit = true;
    std::string out = pending_.substr(0, first);
    pending_.clear();
    return out;
  }
  // Hold back the longest tail that could still grow into a stop string.
  std::size_t hold = 0;
  for (const auto& s : stops_) {
    for (std::size_t k = std::min(s.size() - 1, pending_.size()); k > hold; --k) {
      if (pending_.compare(pending_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
    }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string stop_text::flush() {
  std::string out;
  out.swap(pending_);
  return out;
}

started_generation start_generation(service::inference_service& service, const completion_request& request) {
  started_generation g;
  g.start = clock::now();
  g.sink = std::make_shared<token_queue>();
  g.id = service.submit(request.generate, g.sink);
  return g;
}

std::optional<generation_outcome> failure_before_output(started_generation& g, gateway_metrics& metrics,
                                                        clock::duration hold) {
  if (!g.sink->failed_first(clock::now() + hold)) return std::nullopt;
  auto b = g.sink->take(clock::now());
  generation_outcome out;
  count_service_failure(metrics, b.done->err());
  out.error = from_service_error(b.done->err());
  return out;
}

generation_outcome run_generation(service::inference_service& service, const tokenizer::tokenizer* tok,
                                  const completion_request& request, gateway_metrics& metrics,
                                  const generation_limits& limits, const generation_callbacks& cb) {
  return run_generation(service, start_generation(service, request), tok, request, metrics, limits, cb);
}

generation_outcome run_generation(service::inference_service& service, started_generation g,
                                  const tokenizer::tokenizer* tok, const completion_request& request,
                                  gateway_metrics& metrics, const generation_limits& limits,
                                  const generation_callbacks& cb) {
  generation_outcome out;
  out.prompt_tokens = static_cast<int>(request.generate.prompt.size());
  const auto start = g.start;
  double timeout = limits.timeout_s;
  if (request.timeout_s > 0 && (timeout <= 0 || request.timeout_s < timeout)) timeout = request.timeout_s;
  const auto deadline = timeout > 0 ? start + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(timeout))
                                    : clock::time_point::max();
  const auto& sink = g.sink;
  const std::uint64_t id = g.id;
  std::optional<tokenizer::stream_decoder> decoder;
  if (tok != nullptr) decoder.emplace(*tok, tokenizer::decode_options{request.skip_special_tokens});
  stop_text stops(request.stop_strings);
  std::optional<clock::time_point> last_token;
  auto last_activity = start;
  auto emit = [&](const std::string& text, std::span<const std::int32_t> ids) {
    out.text += text;
    if (cb.on_delta && !cb.on_delta(text, ids)) {
      out.client_gone = true;
      return false;
    }
    return true;
  };
  auto fail = [&](api_error e, const std::string& kind) {
    service.cancel(id);
    metrics.count_finish(kind);
    out.ok = false;
    out.error = std::move(e);
    return out;
  };
  for (;;) {
    const auto now = clock::now();
    if (limits.stopping != nullptr && limits.stopping->load()) {
      return fail({503, "server_error", "the server is shutting down", "", "shutting_down"}, "shutdown");
    }
    if (now >= deadline) {
      return fail({504, "server_error",
                   "the request did not finish within its " + std::to_string(timeout) + " s deadline (" +
                       std::to_string(out.ids.size()) + " tokens generated)",
                   "", "timeout"},
                  "deadline");
    }
    // Short waits so shutdown and the deadline are noticed promptly even when no token comes.
    auto b = sink->take(std::min(deadline, now + std::chrono::milliseconds(100)));
    if (!b.tokens.empty()) {
      last_activity = clock::now();
      for (const auto& [when, n] : b.arrivals) {
        if (!last_token) {
          metrics.time_to_first_token.observe(seconds(when - start));
        } else {
          // Tokens that arrive together share the gap since the previous arrival.
          const double gap = seconds(when - *last_token) / static_cast<double>(n);
          for (std::size_t k = 0; k < n; ++k) metrics.inter_token_latency.observe(gap);
        }
        last_token = when;
      }
      out.ids.insert(out.ids.end(), b.tokens.begin(), b.tokens.end());
      std::string text = decoder ? decoder->push(b.tokens) : std::string();
      bool hit = false;
      text = stops.push(text, hit);
      if (!emit(text, b.tokens)) return fail({499, "client_closed", "the client went away", "", ""}, "client_gone");
      if (hit) {
        service.cancel(id);  // the stop string ended it; the service's "cancelled" is ours
        out.finish_reason = "stop";
        break;
      }
      continue;
    }
    if (b.done) {
      if (!b.done->ok()) {
        count_service_failure(metrics, b.done->err());
        out.error = from_service_error(b.done->err());
        return out;
      }
      const auto& s = b.done->value();
      metrics.queue_time.observe(s.queue_s);
      bool hit = false;
      std::string rest = decoder ? decoder->finish() : std::string();
      rest = stops.push(rest, hit);
      if (!hit) rest += stops.flush();
      out.finish_reason = hit || s.finish_reason == "stop" ? "stop" : "length";
      if (!rest.empty() && !emit(rest, {})) return fail({499, "client_closed", "the client went away", "", ""}, "client_gone");
      break;
    }
    if (cb.keep_alive && clock::now() - last_activity > std::chrono::seconds(2)) {
      // Nothing for a while (a long queue or prefill): make sure someone still listens.
      last_activity = clock::now();
      if (!cb.keep_alive()) return fail({499, "client_closed", "the client went away", "", ""}, "client_gone");
    }
  }
  metrics.e2e_latency.observe(seconds(clock::now() - start));
  metrics.prompt_tokens.observe(out.prompt_tokens);
  metrics.generation_tokens.observe(static_cast<double>(out.ids.size()));
  metrics.add_tokens(out.prompt_tokens, static_cast<std::int64_t>(out.ids.size()));
  metrics.count_finish(out.finish_reason);
  out.ok = true;
  return out;
}

}  // namespace conveyor::http
