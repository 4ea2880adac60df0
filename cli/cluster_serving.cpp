#include "cluster_serving.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <fstream>

#include "conveyor/frontend/rpc_server.hpp"
#include "conveyor/http/http_server.hpp"
#include "progress_bar.hpp"
#include "serving_options.hpp"

namespace conveyor::cli {

namespace {

result<std::string> read_token_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return make_error(errc::not_found, "cluster.token_file: cannot read " + path);
  std::string token;
  std::getline(in, token);
  if (token.empty()) return make_error(errc::invalid_argument, "cluster.token_file: " + path + " is empty");
  return token;
}

/// SIGINT/SIGTERM, caught from the start so that a stop during a long start-up aborts it instead of
/// waiting for it. A handler, not sigwait: libraries (OpenBLAS) start threads before main() that
/// would not have the signals blocked, and the default action would kill us with workers running.
/// One instance at a time (the handler's state is static).
class stop_signal {
 public:
  stop_signal() {
    if (::pipe2(pipe_, O_CLOEXEC) != 0) pipe_[0] = pipe_[1] = -1;
    write_end_ = pipe_[1];
    received_ = 0;
    struct sigaction sa {};
    sa.sa_handler = &stop_signal::on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    ::sigaction(SIGINT, &sa, &old_int_);
    ::sigaction(SIGTERM, &sa, &old_term_);
  }
  ~stop_signal() {
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
    write_end_ = -1;
    for (int fd : pipe_) {
      if (fd >= 0) ::close(fd);
    }
  }
  stop_signal(const stop_signal&) = delete;
  stop_signal& operator=(const stop_signal&) = delete;

  bool stopped() const { return received_ != 0; }
  /// Blocks until SIGINT or SIGTERM; returns which.
  int wait() {
    while (received_ == 0) {
      char c;
      if (::read(pipe_[0], &c, 1) < 0 && errno != EINTR) break;
    }
    return received_;
  }

 private:
  static void on_signal(int sig) {
    received_ = sig;
    const char c = 1;
    if (write_end_ >= 0) {
      const ssize_t n = ::write(write_end_, &c, 1);  // async-signal-safe; a full pipe is fine
      (void)n;
    }
  }
  static inline volatile std::sig_atomic_t received_ = 0;
  static inline volatile int write_end_ = -1;
  int pipe_[2] = {-1, -1};
  struct sigaction old_int_ {}, old_term_ {};
};

}  // namespace

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
  // kv_blocks 0: a GPU stage sizes its pool from serving.kv_memory_fraction of its free memory; a
  // CPU stage keeps a fixed pool of 512 (a fraction of the host's free RAM would be gigabytes).
  o.kv_blocks = d.serving.kv_blocks > 0 ? d.serving.kv_blocks : d.model.device == config::device_kind::cuda ? 0 : 512;
  o.kv_memory_fraction = d.serving.kv_memory_fraction;
  o.max_step_tokens = d.serving.max_batch_tokens;
  o.max_seqs_per_step = d.serving.max_batch_size;
  o.max_context = d.serving.max_context;
  o.warm_up_batches = config::warm_up_batches(d);
  o.heartbeat = std::chrono::milliseconds(static_cast<long>(d.cluster.heartbeat_interval_s * 1000));
  o.heartbeat_timeout = std::chrono::milliseconds(static_cast<long>(d.cluster.heartbeat_timeout_s * 1000));
  o.recover_stages = d.cluster.recover_stages;
  o.max_stage_restarts = d.cluster.max_stage_restarts;
  o.max_frame_bytes = static_cast<std::uint64_t>(d.transport.max_frame_bytes);
  o.startup_timeout = std::chrono::seconds(static_cast<long>(d.serving.startup_timeout_s));
  o.device = std::string(config::to_string(d.model.device));
  o.dtype = std::string(config::to_string(d.model.dtype));
  o.quant = std::string(config::to_string(d.model.quantization));
  o.quant_lm_head = d.model.quantize_lm_head;
  o.device_ids = d.placement.device_ids;
  o.tp = d.parallel.tp;
  o.policy = serving_policy_of(d.serving);  // batching, admission control, deadlines (issue 6)
  o.draft_dir = d.model.draft;
  o.draft_layers = d.model.draft_layers;
  o.spec_k = d.model.spec_k;
  o.batch_invariant = config::batch_invariant(d.model);
  o.ngram_min = d.model.ngram_min;
  o.ngram_max = d.model.ngram_max;
  o.ngram_corpus = d.model.ngram_corpus;
  return o;
}

int serve_cluster(const std::string& command, const config::deployment& d, const coordinator::cluster_options& o,
                  const std::optional<std::string>& http) {
  auto fail = [&](const std::string& message) {
    std::fprintf(stderr, "%s: %s\n", command.c_str(), message.c_str());
    return 1;
  };
  stop_signal stop;
  coordinator::cluster_options options = o;
  options.should_stop = [&stop] { return stop.stopped(); };
  // Start-up (workers loading their layers, wiring, the canary): a bar on a terminal, else a line
  // per step of each stage.
  if (!options.on_progress) options.on_progress = startup_progress_printer(command, options.stages);
  std::fprintf(stderr, "%s: starting %d stage workers for %s\n", command.c_str(), options.stages,
               options.model_dir.c_str());
  auto cluster = coordinator::cluster::start(options);
  if (!cluster) return fail(cluster.err().message);
  frontend::rpc_server_options ro;
  ro.listen = config::to_string(d.frontend.rpc_listen);
  ro.server_name = command;
  auto server = frontend::start_rpc_server((*cluster)->service(), ro);
  if (!server) {
    (*cluster)->shutdown();
    return fail(server.err().message);
  }
  std::optional<http::http_gateway> gateway;  // frontend.http_listen or --http HOST:PORT
  if (http || d.frontend.http_listen) {
    http::http_server_options ho;
    ho.listen = http ? *http : config::to_string(*d.frontend.http_listen);
    ho.request_timeout_s = d.serving.response_timeout_s;
    std::string note;
    auto g = http::start_http_gateway((*cluster)->service(), options.model_dir, ho, note);
    if (!g) {
      (*server)->stop();
      (*cluster)->shutdown();
      return fail(g.err().message);
    }
    gateway = std::move(*g);
    std::printf("%s: HTTP on %s (%s)\n", command.c_str(), gateway->server->address().c_str(), note.c_str());
  }
  // Scripts read this line (the port matters with --listen HOST:0).
  std::printf("%s: listening on %s (model %s, %d stages, %d chunks)\n", command.c_str(), (*server)->address().c_str(),
              options.model_dir.c_str(), options.stages, options.chunks);
  std::fflush(stdout);
  const int sig = stop.wait();
  std::fprintf(stderr, "%s: %s, stopping\n", command.c_str(), sig == SIGINT ? "SIGINT" : "SIGTERM");
  if (gateway) gateway->server->stop();  // first, like the RPC server: its requests hold sinks
  (*server)->stop();  // first: its calls hold sinks of the service
  (*cluster)->shutdown();
  return 0;
}

}  // namespace conveyor::cli
