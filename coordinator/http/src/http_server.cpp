// The gateway's routes on cpp-httplib. Each generation request runs on the worker thread that received
// it (run_generation waits on the service's callbacks); streaming responses write SSE events from
// cpp-httplib's chunked content provider on that same thread.
#include "conveyor/http/http_server.hpp"

#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <future>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "api_error.hpp"
#include "conveyor/http/metrics.hpp"
#include "generation.hpp"
#include "openai_request.hpp"
#include "openai_response.hpp"

namespace conveyor::http {

namespace {

using json = nlohmann::json;

struct host_port {
  std::string host;
  int port = 0;
};

result<host_port> parse_listen(const std::string& a) {
  auto bad = [&] {
    return make_error(errc::invalid_argument, "HTTP listen address \"" + a +
                                                  "\" is not HOST:PORT (e.g. 127.0.0.1:8000, [::1]:8000; port 0 picks a free one)");
  };
  const auto colon = a.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == a.size()) return bad();
  host_port hp;
  hp.host = a.substr(0, colon);
  if (hp.host.front() == '[') {
    if (hp.host.back() != ']' || hp.host.size() < 3) return bad();
    hp.host = hp.host.substr(1, hp.host.size() - 2);
  } else if (hp.host.find(':') != std::string::npos) {
    return bad();  // an IPv6 literal needs brackets
  }
  const std::string port = a.substr(colon + 1);
  if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos) return bad();
  hp.port = std::stoi(port);
  if (hp.port > 65535) return bad();
  return hp;
}

/// Waits up to `timeout_s` for a service query's callback; nullopt when it does not come in time.
template <class T, class Call>
std::optional<T> ask(Call call, double timeout_s) {
  auto promise = std::make_shared<std::promise<T>>();
  auto future = promise->get_future();
  call([promise](T v) { promise->set_value(std::move(v)); });
  if (future.wait_for(std::chrono::duration<double>(timeout_s)) != std::future_status::ready) return std::nullopt;
  return future.get();
}

std::string route_label(const std::string& path) {
  for (const char* r : {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/ready", "/metrics"}) {
    if (path == r) return r;
  }
  return "other";
}

class gateway final : public http_server {
 public:
  gateway(service::inference_service& service, const tokenizer::tokenizer* tok, http_server_options options)
      : service_(service), tok_(tok), options_(std::move(options)) {
    const auto info = service_.info();
    if (options_.model_name.empty()) {
      options_.model_name = std::filesystem::path(info.model_dir).filename().string();
      if (options_.model_name.empty()) options_.model_name = std::filesystem::path(info.model_dir).parent_path().filename().string();
    }
    context_.tok = tok_;
    context_.model_name = options_.model_name;
    context_.vocab_size = info.vocab_size;
    context_.max_context = info.max_context;
    routes();
  }

  ~gateway() override { stop(); }

  status start() {
    CONVEYOR_TRY_ASSIGN(hp, parse_listen(options_.listen));
    host_ = hp.host;
    const int port = hp.port == 0 ? svr_.bind_to_any_port(hp.host) : (svr_.bind_to_port(hp.host, hp.port) ? hp.port : -1);
    if (port <= 0) {
      return make_error(errc::io, "cannot listen for HTTP on " + options_.listen +
                                      " (address in use, or not an address of this host)");
    }
    port_ = port;
    thread_ = std::thread([this] { svr_.listen_after_bind(); });
    // cpp-httplib's stop() does nothing until the listen loop has marked itself running, so a
    // stop() that comes earlier would leave the thread listening forever: wait for it here.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!svr_.is_running() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return ok_status();
  }

  int port() const override { return port_; }
  std::string address() const override {
    return (host_.find(':') != std::string::npos ? "[" + host_ + "]" : host_) + ":" + std::to_string(port_);
  }

  void stop() override {
    if (stopped_.exchange(true)) return;
    stopping_ = true;  // requests in progress notice within 100 ms, cancel and end
    svr_.stop();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void reply_error(httplib::Response& res, const api_error& e) {
    res.status = e.status;
    if (e.status == 429 || e.status == 503) res.set_header("Retry-After", "1");
    res.set_content(error_body(e), "application/json");
  }

  void routes() {
    // Only SO_REUSEADDR: cpp-httplib's default also sets SO_REUSEPORT, which would let a second server
    // share the port silently instead of failing to bind.
    svr_.set_socket_options([](socket_t sock) {
      int yes = 1;
      setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    });
    const int threads = std::max(2, options_.threads);
    svr_.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<std::size_t>(threads)); };
    svr_.set_payload_max_length(options_.max_body_bytes);
    svr_.set_keep_alive_timeout(2);
    svr_.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
      metrics_.count_response(route_label(req.path), res.status);
    });
    svr_.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;  // our handlers wrote their own error body
      api_error e{res.status, "invalid_request_error", "", "", ""};
      if (res.status == 404) {
        e.message = "no route " + req.method + " " + req.path;
        e.code = "not_found";
      } else if (res.status == 413) {
        e.message = "the request body is too large";
      } else {
        e.message = "HTTP status " + std::to_string(res.status);
      }
      res.set_content(error_body(e), "application/json");
    });
    svr_.Get("/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"status":"ok"})", "application/json");
    });
    svr_.Get("/ready", [this](const httplib::Request&, httplib::Response& res) { ready(res); });
    svr_.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) { models(res); });
    svr_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      auto stats = ask<service::stats_report>([this](auto cb) { service_.stats(std::move(cb)); },
                                              options_.service_query_timeout_s);
      res.set_content(metrics_.render(stats, service_.info()), "text/plain; version=0.0.4; charset=utf-8");
    });
    svr_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) { generate(req, res, false); });
    svr_.Post("/v1/chat/completions",
              [this](const httplib::Request& req, httplib::Response& res) { generate(req, res, true); });
  }

  void ready(httplib::Response& res) {
    auto h = ask<service::health_report>([this](auto cb) { service_.health(std::move(cb)); },
                                         options_.service_query_timeout_s);
    json stages = json::array();
    if (h) {
      for (const auto& s : h->stages) {
        stages.push_back({{"stage", s.stage}, {"tp_rank", s.tp_rank}, {"state", s.state}, {"detail", s.detail}});
      }
    }
    const bool ok = h && h->ready;
    res.status = ok ? 200 : 503;
    json body{{"ready", ok}, {"stages", stages}};
    if (!h) body["detail"] = "the service did not answer the health query in time";
    res.set_content(body.dump(), "application/json");
  }

  void models(httplib::Response& res) {
    const auto info = service_.info();
    json model{{"id", options_.model_name},
               {"object", "model"},
               {"created", 0},
               {"owned_by", "conveyor"},
               {"max_model_len", info.max_context},
               {"model_type", info.model_type},
               {"stages", info.stages},
               {"tokenizer", tok_ ? json(std::string(tok_->kind())) : json()}};
    res.set_content(json{{"object", "list"}, {"data", json::array({model})}}.dump(), "application/json");
  }

  /// Counts a generation request in progress for its whole life (which, when streaming, outlasts the
  /// handler), so the 429 cap holds.
  struct active_slot {
    gateway* g;
    explicit active_slot(gateway* owner) : g(owner) { g->metrics_.set_active(+1); }
    ~active_slot() {
      g->active_.fetch_sub(1);
      g->metrics_.set_active(-1);
    }
  };

  /// A streaming request started before its status line; cancelled if the response never runs
  /// (the client left before the headers went out), so the service does not generate for nobody.
  struct started_stream {
    service::inference_service& service;
    started_generation g;
    bool ran = false;
    started_stream(service::inference_service& s, started_generation started) : service(s), g(std::move(started)) {}
    ~started_stream() {
      if (!ran) service.cancel(g.id);
    }
  };

  void generate(const httplib::Request& req, httplib::Response& res, bool chat) {
    auto parsed = parse_completion_request(req.body, chat, context_);
    if (auto* e = std::get_if<api_error>(&parsed)) {
      metrics_.count_finish("rejected_invalid");
      return reply_error(res, *e);
    }
    if (active_.fetch_add(1) >= options_.max_active_requests) {
      active_.fetch_sub(1);
      metrics_.count_finish("rejected_overloaded");
      return reply_error(res, {429, "rate_limit_error",
                               "the server is serving " + std::to_string(options_.max_active_requests) +
                                   " requests, its limit; retry shortly",
                               "", "overloaded"});
    }
    auto slot = std::make_shared<active_slot>(this);
    auto request = std::make_shared<completion_request>(std::move(std::get<completion_request>(parsed)));
    const auto header = make_header(chat, options_.model_name);
    generation_limits limits{options_.request_timeout_s, &stopping_};
    if (!request->stream) {
      auto out = run_generation(service_, tok_, *request, metrics_, limits, {});
      if (!out.ok) return reply_error(res, out.error);
      res.set_content(completion_body(header, out.text, out.ids, out.finish_reason,
                                      {out.prompt_tokens, static_cast<int>(out.ids.size())}),
                      "application/json");
      return;
    }
    // The status line waits (up to the keep-alive interval) for the request's first output, so a
    // request the server rejects at once (overloaded, expired in the queue) gets its 503/504 like a
    // non-streaming one, not 200 and an error event. A later failure still travels as an event.
    auto started = std::make_shared<started_stream>(service_, start_generation(service_, *request));
    if (auto failed = failure_before_output(started->g, metrics_, std::chrono::seconds(2))) {
      started->ran = true;  // it ended in the service already
      return reply_error(res, failed->error);
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream", [this, request, header, limits, slot, started](std::size_t, httplib::DataSink& sink) {
          auto event = [&sink](const std::string& data) {
            const std::string e = "data: " + data + "\n\n";
            return sink.write(e.data(), e.size());
          };
          bool first = true;
          generation_callbacks cb;
          cb.on_delta = [&](const std::string& text, std::span<const std::int32_t> ids) {
            if (first && header.chat && !event(chunk_body(header, "", {}, nullptr, true))) return false;
            first = false;
            if (text.empty() && ids.empty()) return true;
            return event(chunk_body(header, text, ids, nullptr, false));
          };
          cb.keep_alive = [&sink] {
            static const std::string ping = ": keep-alive\n\n";  // an SSE comment: clients ignore it
            return sink.write(ping.data(), ping.size());
          };
          started->ran = true;
          auto out = run_generation(service_, std::move(started->g), tok_, *request, metrics_, limits, cb);
          if (out.client_gone) return false;
          if (out.ok) {
            if (first && header.chat) event(chunk_body(header, "", {}, nullptr, true));
            event(chunk_body(header, "", {}, out.finish_reason.c_str(), false));
            if (request->include_usage) {
              event(usage_chunk_body(header, {out.prompt_tokens, static_cast<int>(out.ids.size())}));
            }
          } else {
            // The status line has gone out; the error travels as an event, as OpenAI's API does.
            event(error_body(out.error));
          }
          event("[DONE]");
          sink.done();
          return true;
        });
  }

  service::inference_service& service_;
  const tokenizer::tokenizer* tok_;
  http_server_options options_;
  request_context context_;
  gateway_metrics metrics_;
  httplib::Server svr_;
  std::string host_;
  int port_ = 0;
  std::atomic<int> active_{0};
  std::atomic<bool> stopping_{false};
  std::atomic<bool> stopped_{false};
  std::thread thread_;
};

}  // namespace

result<std::unique_ptr<http_server>> start_http_server(service::inference_service& service,
                                                       const tokenizer::tokenizer* tok,
                                                       const http_server_options& options) {
  auto g = std::make_unique<gateway>(service, tok, options);
  CONVEYOR_TRY(g->start());
  return std::unique_ptr<http_server>(std::move(g));
}

result<http_gateway> start_http_gateway(service::inference_service& service, const std::string& model_dir,
                                        const http_server_options& options, std::string& note) {
  http_gateway g;
  auto tok = tokenizer::load_tokenizer(model_dir);
  if (tok) {
    g.tokenizer = std::move(*tok);
    note = "tokenizer " + std::string(g.tokenizer->kind()) + ", " + std::to_string(g.tokenizer->vocab_size()) + " ids";
  } else if (tok.err().code == errc::not_found || tok.err().code == errc::unsupported) {
    note = "no tokenizer (" + tok.err().message + "): prompts must be token ids";
  } else {
    return tok.err();
  }
  CONVEYOR_TRY_ASSIGN(server, start_http_server(service, g.tokenizer.get(), options));
  g.server = std::move(server);
  return g;
}

}  // namespace conveyor::http
