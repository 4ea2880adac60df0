#pragma once
// Runs one request through the service on the calling (HTTP worker) thread: submits it, waits for
// its tokens (the service calls back on its own threads into a token_queue), turns them into text,
// applies stop strings, enforces the deadline, and feeds the gateway's latency histograms.
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "api_error.hpp"
#include "conveyor/http/metrics.hpp"
#include "conveyor/service/inference_service.hpp"
#include "conveyor/tokenizer/tokenizer.hpp"
#include "openai_request.hpp"

namespace conveyor::http {

struct generation_outcome {
  bool ok = false;
  api_error error;            ///< when !ok
  bool client_gone = false;   ///< on_delta or keep_alive said the client left
  std::string finish_reason;  ///< "stop" | "length"
  std::string text;           ///< the whole completion's text (empty without a tokenizer)
  std::vector<std::int32_t> ids;
  int prompt_tokens = 0;
};

struct generation_callbacks {
  /// New text and the ids that made it; false = the client is gone (stops the request).
  std::function<bool(const std::string& text, std::span<const std::int32_t> ids)> on_delta;
  /// Called when no token came for a while; false = the client is gone.
  std::function<bool()> keep_alive;
};

struct generation_limits {
  double timeout_s = 0.0;                    ///< server-wide; the request's own may be shorter
  const std::atomic<bool>* stopping = nullptr;  ///< set when the server shuts down
};

class token_queue;

/// A request handed to the service, whose output has not been read yet.
struct started_generation {
  std::uint64_t id = 0;
  std::shared_ptr<token_queue> sink;
  std::chrono::steady_clock::time_point start;  ///< the deadline counts from here
};

started_generation start_generation(service::inference_service& service, const completion_request& request);

/// Waits up to `hold` for the request's first output. When the request ended in an error before any
/// token (rejected as overloaded, expired in the queue, invalid for the model), returns that outcome,
/// counted in the metrics: a streaming response can then still answer with a status code instead of
/// 200 and an error event. Otherwise nothing is consumed and run_generation goes on from here.
std::optional<generation_outcome> failure_before_output(started_generation& g, gateway_metrics& metrics,
                                                        std::chrono::steady_clock::duration hold);

generation_outcome run_generation(service::inference_service& service, const tokenizer::tokenizer* tok,
                                  const completion_request& request, gateway_metrics& metrics,
                                  const generation_limits& limits, const generation_callbacks& callbacks);
/// The same, for a request already started.
generation_outcome run_generation(service::inference_service& service, started_generation g,
                                  const tokenizer::tokenizer* tok, const completion_request& request,
                                  gateway_metrics& metrics, const generation_limits& limits,
                                  const generation_callbacks& callbacks);

/// Holds back text that may be the start of a stop string; finds the first stop string.
class stop_text {
 public:
  explicit stop_text(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  /// Adds text; returns what is safe to emit. When a stop string completes, `hit` is set and the
  /// returned text ends right before it.
  std::string push(const std::string& text, bool& hit);
  /// The held-back rest, at the end of the completion.
  std::string flush();

 private:
  std::vector<std::string> stops_;
  std::string pending_;
};

}  // namespace conveyor::http
