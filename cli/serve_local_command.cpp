// conveyor serve-local: the RPC frontend over the in-process engine (no cluster, no actors) until
// SIGINT or SIGTERM. For users with one machine, and for tests that need a server to talk to.
#include <csignal>
#include <cstdio>

#include <pthread.h>

#include "command.hpp"
#include "conveyor/config/deployment_loader.hpp"
#include "conveyor/frontend/rpc_server.hpp"
#include "conveyor/http/http_server.hpp"
#include "conveyor/service/local_inference_service.hpp"
#include "flags.hpp"
#include "serving_options.hpp"

namespace conveyor::cli {

namespace {

int fail(const error& e) {
  std::fprintf(stderr, "conveyor serve-local: %s\n", e.message.c_str());
  return 1;
}

}  // namespace

int serve_local_main(const args& argv) {
  auto f = flags::parse(argv, {"model", "listen", "stages", "threads", "kv-blocks", "kv-block-size", "max-seqs",
                               "max-step-tokens", "max-context", "max-message-mb", "http", "config"});
  if (!f) return fail(f.err());
  auto model = f->get("model");
  if (!model) return fail(make_error(errc::invalid_argument, "--model DIR is required"));
  auto stages = f->get_int("stages", 1, 1, 1 << 16);
  auto threads = f->get_int("threads", 0, 0, 4096);
  auto kv_blocks = f->get_int("kv-blocks", 512, 1, 1 << 24);
  auto kv_block_size = f->get_int("kv-block-size", 16, 1, 1 << 16);
  auto max_seqs = f->get_int("max-seqs", 64, 1, 1 << 16);
  auto max_step_tokens = f->get_int("max-step-tokens", 512, 1, 1 << 24);
  auto max_context = f->get_int("max-context", 0, 0, 1 << 30);
  auto max_message_mb = f->get_int("max-message-mb", 64, 1, 4096);
  for (const auto* r : {&stages, &threads, &kv_blocks, &kv_block_size, &max_seqs, &max_step_tokens, &max_context,
                        &max_message_mb}) {
    if (!*r) return fail(r->err());
  }
  // Block the stop signals before any thread starts, so every thread inherits the mask and sigwait
  // below is the one place that receives them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  service::local_service_options so;
  so.stages = static_cast<int>(*stages);
  so.threads = static_cast<int>(*threads);
  so.kv_blocks = static_cast<int>(*kv_blocks);
  so.kv_block_size = static_cast<int>(*kv_block_size);
  so.max_seqs_per_step = static_cast<int>(*max_seqs);
  so.max_step_tokens = static_cast<int>(*max_step_tokens);
  so.max_context = static_cast<int>(*max_context);
  if (auto file = f->get("config")) {  // [serving]'s policy: batching, queue caps, job tickets, timeout
    auto dep = config::load_deployment(*file);
    if (!dep) return fail(dep.err());
    so.policy = serving_policy_of(dep->serving);
  }
  auto service = service::make_local_inference_service(*model, so);
  if (!service) return fail(service.err());
  frontend::rpc_server_options ro;
  ro.listen = f->get("listen").value_or("127.0.0.1:7600");
  ro.max_message_bytes = static_cast<std::size_t>(*max_message_mb) << 20;
  ro.server_name = "conveyor serve-local";
  auto server = frontend::start_rpc_server(**service, ro);
  if (!server) return fail(server.err());
  // Scripts read this line (the port matters with --listen HOST:0).
  std::printf("conveyor serve-local: listening on %s (model %s, stages %d)\n", (*server)->address().c_str(),
              model->c_str(), so.stages);
  std::optional<http::http_gateway> gateway;  // --http HOST:PORT: the OpenAI-compatible gateway
  if (auto listen = f->get("http")) {
    std::string note;
    auto g = http::start_http_gateway(**service, *model, {.listen = *listen}, note);
    if (!g) return fail(g.err());
    gateway = std::move(*g);
    std::printf("conveyor serve-local: HTTP on %s (%s)\n", gateway->server->address().c_str(), note.c_str());
  }
  std::fflush(stdout);
  int sig = 0;
  sigwait(&stop_signals, &sig);
  std::fprintf(stderr, "conveyor serve-local: %s, stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
  if (gateway) gateway->server->stop();  // first, like the RPC server: its requests hold sinks
  (*server)->stop();  // first: its calls hold sinks of the service
  server->reset();
  service->reset();
  return 0;
}

}  // namespace conveyor::cli
