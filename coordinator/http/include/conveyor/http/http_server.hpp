#pragma once
// The OpenAI-compatible HTTP gateway: /v1/completions, /v1/chat/completions (JSON or Server-Sent
// Events), /v1/models, /health, /ready and /metrics (Prometheus text), over an inference_service.
// cpp-httplib serves it on its own thread pool; nothing of it appears in this header.
#include <cstddef>
#include <memory>
#include <string>

#include "conveyor/base/result.hpp"
#include "conveyor/service/inference_service.hpp"
#include "conveyor/tokenizer/tokenizer.hpp"

namespace conveyor::http {

struct http_server_options {
  /// HOST:PORT to listen on; exactly this address is bound ("[::1]:8000" for IPv6). Port 0 picks a free
  /// port: see http_server::port().
  std::string listen = "127.0.0.1:0";
  /// The model id clients name in requests and /v1/models lists; empty = the model directory's name.
  std::string model_name;
  /// Generation requests in progress at once; beyond it a request gets 429 with Retry-After.
  int max_active_requests = 256;
  /// Seconds a request may take before it is cancelled and answered with 504; 0 = no limit.
  /// A request's own "timeout" field (seconds) may shorten it.
  double request_timeout_s = 0.0;
  /// Worker threads; each request in progress (streaming or not) holds one while it runs.
  int threads = 64;
  /// Largest request body accepted (413 beyond).
  std::size_t max_body_bytes = 8u << 20;
  /// How long /metrics and /ready wait for the service's answer before giving up on it.
  double service_query_timeout_s = 2.0;
};

/// A running gateway. Destroying it stops it (as stop() does).
class http_server {
 public:
  virtual ~http_server() = default;
  /// The port actually bound (useful with port 0).
  virtual int port() const = 0;
  /// The bound address as HOST:PORT.
  virtual std::string address() const = 0;
  /// Stops accepting, cancels the requests in progress in the service, joins the threads. Idempotent.
  virtual void stop() = 0;
};

/// Binds `options.listen` and starts serving; returns once the socket listens, or an error naming the
/// address. `tok` may be null: then prompts must be token ids and responses carry ids only (chat needs
/// a tokenizer). `service` and `tok` must outlive the server.
result<std::unique_ptr<http_server>> start_http_server(service::inference_service& service,
                                                       const tokenizer::tokenizer* tok,
                                                       const http_server_options& options);

/// A gateway with the tokenizer of the served model's directory (what `conveyor serve` and `serve-local`
/// start). The server is declared last so it stops before the tokenizer it uses goes away.
struct http_gateway {
  std::unique_ptr<tokenizer::tokenizer> tokenizer;  ///< null when the directory has none we can read
  std::unique_ptr<http_server> server;
};

/// Loads the tokenizer of `model_dir` (none: prompts as ids only; `note` says why) and starts the
/// server. A tokenizer file that exists but is malformed is an error: better to refuse than to
/// serve wrong tokens.
result<http_gateway> start_http_gateway(service::inference_service& service, const std::string& model_dir,
                                        const http_server_options& options, std::string& note);

}  // namespace conveyor::http
