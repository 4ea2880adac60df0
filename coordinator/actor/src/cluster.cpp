// Brings a cluster up: actor system, coordinator, worker processes; waits for the canary.
#include "conveyor/coordinator/cluster.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <cstdio>
#include <future>
#include <thread>

#include "caf/io/all.hpp"
#include "conveyor/coordinator/worker_launcher.hpp"
#include "conveyor/engine/model_config.hpp"
#include "conveyor/engine/tensor_parallel.hpp"
#include "conveyor/stage/protocol.hpp"
#include "coordinator_actor.hpp"

namespace conveyor::coordinator {

namespace {

std::string random_token() {
  unsigned char raw[16] = {};
  const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    [[maybe_unused]] auto n = ::read(fd, raw, sizeof raw);
    ::close(fd);
  }
  std::string out;
  char buf[3];
  for (unsigned char c : raw) {
    std::snprintf(buf, sizeof buf, "%02x", c);
    out += buf;
  }
  return out;
}

/// inference_service over the coordinator actor: every call becomes one message.
class cluster_service final : public service::inference_service {
 public:
  cluster_service(caf::actor coordinator, service::model_info info)
      : coordinator_(std::move(coordinator)), info_(std::move(info)) {}

  std::uint64_t submit(service::generate_request request, std::shared_ptr<service::token_sink> sink) override {
    auto call = std::make_shared<frontend_call>();
    call->what = frontend_call::kind::submit;
    call->ticket = next_ticket_++;
    call->request = std::move(request);
    call->sink = std::move(sink);
    const auto ticket = call->ticket;
    caf::anon_send(coordinator_, frontend_atom::value, std::move(call));
    return ticket;
  }
  void cancel(std::uint64_t id) override {
    auto call = std::make_shared<frontend_call>();
    call->what = frontend_call::kind::cancel;
    call->ticket = id;
    caf::anon_send(coordinator_, frontend_atom::value, std::move(call));
  }
  void health(std::function<void(service::health_report)> reply) override {
    auto call = std::make_shared<frontend_call>();
    call->what = frontend_call::kind::health;
    call->health_reply = std::move(reply);
    caf::anon_send(coordinator_, frontend_atom::value, std::move(call));
  }
  void stats(std::function<void(service::stats_report)> reply) override {
    auto call = std::make_shared<frontend_call>();
    call->what = frontend_call::kind::stats;
    call->stats_reply = std::move(reply);
    caf::anon_send(coordinator_, frontend_atom::value, std::move(call));
  }
  void flush() override {
    auto call = std::make_shared<frontend_call>();
    call->what = frontend_call::kind::flush;
    caf::anon_send(coordinator_, frontend_atom::value, std::move(call));
  }
  service::model_info info() const override { return info_; }

 private:
  caf::actor coordinator_;
  service::model_info info_;
  std::atomic<std::uint64_t> next_ticket_{1};
};

class cluster_impl final : public cluster {
 public:
  explicit cluster_impl(const cluster_options& o) : options_(o), launcher_(o.executable) {
    stage::register_protocol(cfg_);
    stage::tune_actor_system(cfg_);
    cfg_.load<caf::io::middleman>();
    sys_ = std::make_unique<caf::actor_system>(cfg_);
  }
  ~cluster_impl() override { shutdown(); }

  status boot(coordinator_setup setup, const service::model_info& info) {
    coordinator_ = spawn_coordinator(*sys_, setup);
    service_ = std::make_unique<cluster_service>(coordinator_, info);
    auto port = sys_->middleman().publish(coordinator_, options_.cluster_port, options_.cluster_host.c_str(), true);
    if (!port) {
      return make_error(errc::io, "cannot listen for workers on " + options_.cluster_host + ":" +
                                      std::to_string(options_.cluster_port) + ": " + sys_->render(port.error()));
    }
    for (std::size_t k = 0; k < setup.ranges.size(); ++k) {
      std::vector<std::string> env = {"CONVEYOR_CLUSTER_TOKEN=" + setup.options.token, "CONVEYOR_EXIT_WITH_PARENT=1"};
      if (options_.device == "cuda") {
        const auto& ids = options_.device_ids;
        std::string visible;
        for (int r = 0; r < options_.tp; ++r) {
          const int slot = static_cast<int>(k) * options_.tp + r;
          const int gpu = ids.empty() ? slot : ids[slot % ids.size()];
          visible += (r ? "," : "") + std::to_string(gpu);
        }
        env.push_back("CUDA_VISIBLE_DEVICES=" + visible);
      }
      auto pid = launcher_.launch({"--coordinator", options_.cluster_host + ":" + std::to_string(*port), "--stage",
                                   std::to_string(k), "--threads", std::to_string(options_.worker_threads)},
                                  env);
      if (!pid) return pid.err();
    }
    return wait_ready();
  }

  service::inference_service& service() override { return *service_; }
  std::vector<int> worker_pids() const override { return {launcher_.pids().begin(), launcher_.pids().end()}; }

  void shutdown() override {
    if (down_) return;
    down_ = true;
    if (coordinator_) caf::anon_send(coordinator_, shutdown_atom::value);
    launcher_.stop_all(std::chrono::seconds(5));
    coordinator_ = nullptr;
    service_.reset();
    sys_.reset();  // waits for the coordinator to quit
  }

 private:
  status wait_ready() {
    const auto until = std::chrono::steady_clock::now() + options_.startup_timeout;
    service::health_report last;
    while (std::chrono::steady_clock::now() < until) {
      auto p = std::make_shared<std::promise<service::health_report>>();
      auto f = p->get_future();
      service_->health([p](service::health_report h) { p->set_value(std::move(h)); });
      if (f.wait_for(std::chrono::seconds(5)) != std::future_status::ready) continue;
      last = f.get();
      if (last.ready) return ok_status();
      for (const auto& s : last.stages) {
        if (s.state == "failed") {
          return make_error(errc::internal, "stage " + std::to_string(s.stage) + " failed during start-up: " + s.detail);
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    std::string pending;
    for (const auto& s : last.stages) {
      if (s.state != "ready") pending += " stage " + std::to_string(s.stage) + " (" + s.state + (s.detail.empty() ? "" : ": " + s.detail) + ")";
    }
    return make_error(errc::internal, "the cluster did not come up within " +
                                          std::to_string(options_.startup_timeout.count()) + " s; not ready:" + pending);
  }

  cluster_options options_;
  worker_launcher launcher_;
  caf::actor_system_config cfg_;
  std::unique_ptr<caf::actor_system> sys_;
  caf::actor coordinator_;
  std::unique_ptr<cluster_service> service_;
  bool down_ = false;
};

}  // namespace

result<std::unique_ptr<cluster>> cluster::start(const cluster_options& o) {
  CONVEYOR_TRY_ASSIGN(config, engine::load_model_config(o.model_dir));
  auto ranges = o.layers_per_stage.empty() ? engine::split_even(config, o.stages)
                                           : engine::split_explicit(config, o.layers_per_stage);
  if (!ranges) return ranges.err();
  if (o.chunks < 1) return make_error(errc::invalid_argument, "chunks must be at least 1");
  if (auto layout = engine::make_tp_layout(config, 0, std::max(1, o.tp)); !layout) return layout.err();
  coordinator_setup setup;
  setup.options = o;
  if (setup.options.token.empty()) setup.options.token = random_token();
  setup.ranges = *ranges;
  setup.vocab_size = config.vocab_size;
  const int model_ctx = o.max_context > 0 ? o.max_context : config.max_position_embeddings;
  setup.max_context = std::min(model_ctx, o.kv_blocks * o.kv_block_size);
  setup.eos_ids = config.eos_token_ids;
  setup.canary_token = config.bos_token_id >= 0 && config.bos_token_id < config.vocab_size ? config.bos_token_id : 0;
  service::model_info info{o.model_dir, config.model_type, config.vocab_size, config.num_layers, config.hidden_size,
                           static_cast<int>(ranges->size()), std::max(1, o.tp), o.chunks, setup.max_context};
  // Resolve /proc/self/exe so `ps` shows the workers as conveyor, not as a link name.
  std::error_code ec;
  if (auto real = std::filesystem::read_symlink(setup.options.executable, ec); !ec) setup.options.executable = real.string();
  auto c = std::make_unique<cluster_impl>(setup.options);
  if (auto st = c->boot(setup, info); !st.ok()) {
    c->shutdown();
    return st.err();
  }
  return std::unique_ptr<cluster>(std::move(c));
}

}  // namespace conveyor::coordinator
