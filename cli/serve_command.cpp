// conveyor serve: the coordinator, its stage-worker processes and the Cap'n Proto RPC frontend, from
// a deployment TOML file (--config) or defaults, with the most used keys as flags.
#include <csignal>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <pthread.h>

#include "command.hpp"
#include "conveyor/config/deployment_loader.hpp"
#include "conveyor/coordinator/cluster.hpp"
#include "conveyor/engine/model_config.hpp"
#include "conveyor/frontend/rpc_server.hpp"
#include "conveyor/http/http_server.hpp"
#include "flags.hpp"
#include "serving_options.hpp"

namespace conveyor::cli {

namespace {

int fail(const std::string& message) {
  std::fprintf(stderr, "conveyor serve: %s\n", message.c_str());
  return 1;
}

result<std::string> read_token_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return make_error(errc::not_found, "cluster.token_file: cannot read " + path);
  std::string token;
  std::getline(in, token);
  if (token.empty()) return make_error(errc::invalid_argument, "cluster.token_file: " + path + " is empty");
  return token;
}

/// The cluster's settings from the deployment. One worker process per stage on this host, its
/// tensor-parallel ranks as threads; a CUDA stage sees tp GPUs, round-robin over placement.device_ids.
result<coordinator::cluster_options> cluster_options_of(const config::deployment& d) {
  coordinator::cluster_options o;
  o.model_dir = d.model.dir;
  o.stages = d.parallel.stages;
  o.layers_per_stage = d.parallel.layers;
  o.chunks = d.parallel.chunks;
  o.cluster_host = d.cluster.listen.host;
  o.cluster_port = static_cast<std::uint16_t>(d.cluster.listen.port);
  o.token = d.cluster.token;
  if (!d.cluster.token_file.empty()) {
    CONVEYOR_TRY_ASSIGN(token, read_token_file(d.cluster.token_file));
    o.token = token;
  }
  o.ucx_tls = d.transport.ucx_tls;
  o.kv_block_size = d.serving.kv_block_size;
  o.kv_blocks = d.serving.kv_blocks > 0 ? d.serving.kv_blocks : 512;  // CPU: a fixed pool
  o.max_step_tokens = d.serving.max_batch_tokens;
  o.max_seqs_per_step = d.serving.max_batch_size;
  o.max_context = d.serving.max_context;
  o.heartbeat = std::chrono::milliseconds(static_cast<long>(d.cluster.heartbeat_interval_s * 1000));
  o.heartbeat_timeout = std::chrono::milliseconds(static_cast<long>(d.cluster.heartbeat_timeout_s * 1000));
  o.startup_timeout = std::chrono::seconds(static_cast<long>(d.serving.startup_timeout_s));
  o.device = std::string(config::to_string(d.model.device));
  o.dtype = std::string(config::to_string(d.model.dtype));
  o.device_ids = d.placement.device_ids;
  o.tp = d.parallel.tp;
  o.policy = serving_policy_of(d.serving);  // batching, admission control, deadlines (issue 6)
  return o;
}

}  // namespace

int serve_main(const args& argv) {
  auto f = flags::parse(argv, {"config", "model", "stages", "chunks", "tp", "listen", "http"});
  if (!f) return fail(f.err().message);
  auto dep = f->has("config") ? config::load_deployment(*f->get("config"))
                              : config::parse_deployment("", "<defaults>");
  if (!dep) return fail(dep.err().message);
  config::overrides ov;
  ov.model = f->get("model");
  ov.listen = f->get("listen");
  for (auto [name, slot] : {std::pair{"stages", &ov.stages}, {"chunks", &ov.chunks}, {"tp", &ov.tp}}) {
    if (!f->has(name)) continue;
    auto v = f->get_int(name, 1, 1, 1 << 16);
    if (!v) return fail(v.err().message);
    *slot = static_cast<int>(*v);
  }
  if (auto st = config::apply_overrides(*dep, ov); !st.ok()) return fail(st.err().message);
  if (dep->model.dir.empty()) return fail("no model: set model.dir in the config or pass --model DIR");
  auto model = engine::load_model_config(dep->model.dir);
  if (!model) return fail(model.err().message);
  if (auto st = config::validate_against_model(*dep, model->num_layers, model->num_heads, model->num_kv_heads,
                                               model->max_position_embeddings);
      !st.ok()) {
    return fail(st.err().message);
  }
  auto options = cluster_options_of(*dep);
  if (!options) return fail(options.err().message);

  // Block the stop signals before any thread starts, so sigwait below is the one place that sees
  // them (the worker launcher gives children a clean mask).
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  std::fprintf(stderr, "conveyor serve: starting %d stage workers for %s\n", options->stages, options->model_dir.c_str());
  auto cluster = coordinator::cluster::start(*options);
  if (!cluster) return fail(cluster.err().message);
  frontend::rpc_server_options ro;
  ro.listen = config::to_string(dep->frontend.rpc_listen);
  ro.server_name = "conveyor serve";
  auto server = frontend::start_rpc_server((*cluster)->service(), ro);
  if (!server) {
    (*cluster)->shutdown();
    return fail(server.err().message);
  }
  std::optional<http::http_gateway> gateway;  // frontend.http_listen or --http HOST:PORT
  if (f->has("http") || dep->frontend.http_listen) {
    http::http_server_options ho;
    ho.listen = f->has("http") ? *f->get("http") : config::to_string(*dep->frontend.http_listen);
    ho.request_timeout_s = dep->serving.response_timeout_s;
    std::string note;
    auto g = http::start_http_gateway((*cluster)->service(), options->model_dir, ho, note);
    if (!g) {
      (*server)->stop();
      (*cluster)->shutdown();
      return fail(g.err().message);
    }
    gateway = std::move(*g);
    std::printf("conveyor serve: HTTP on %s (%s)\n", gateway->server->address().c_str(), note.c_str());
  }
  // Scripts read this line (the port matters with --listen HOST:0).
  std::printf("conveyor serve: listening on %s (model %s, %d stages, %d chunks)\n", (*server)->address().c_str(),
              options->model_dir.c_str(), options->stages, options->chunks);
  std::fflush(stdout);
  int sig = 0;
  sigwait(&stop_signals, &sig);
  std::fprintf(stderr, "conveyor serve: %s, stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
  if (gateway) gateway->server->stop();  // first, like the RPC server: its requests hold sinks
  (*server)->stop();  // first: its calls hold sinks of the service
  (*cluster)->shutdown();
  return 0;
}

}  // namespace conveyor::cli
