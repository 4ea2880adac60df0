// Brings a cluster up: actor system, coordinator, worker processes; waits for the canary.
#include "conveyor/coordinator/cluster.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <cstdio>
#include <future>
#include <mutex>
#include <optional>
#include <thread>

#include "caf/io/all.hpp"
#include "conveyor/coordinator/worker_launcher.hpp"
#include "conveyor/engine/draft_proposer.hpp"
#include "conveyor/engine/model_config.hpp"
#include "conveyor/engine/ngram_proposer.hpp"
#include "conveyor/engine/tensor_parallel.hpp"
#include "conveyor/kernels/cpu_backend.hpp"
#ifdef CONVEYOR_HAVE_CUDA
#include "conveyor/kernels/cuda_backend.hpp"
#endif
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
    std::unique_lock lock(mu_);  // the coordinator may restart a stage as soon as it exists
    setup.restart_stage = [this](int stage) { return restart(stage); };
    setup.stage_process_ended = [this](int stage) { return process_ended(stage); };
    std::vector<worker_site> sites = options_.sites;
    if (sites.empty()) {
      sites = local_sites(setup.ranges.size());
    } else if (sites.size() != setup.ranges.size()) {
      return make_error(errc::invalid_argument, std::to_string(sites.size()) + " worker sites for " +
                                                    std::to_string(setup.ranges.size()) + " stages");
    }
    setup.gpu_sharers = gpu_sharers(sites);
    coordinator_ = spawn_coordinator(*sys_, setup);
    service_ = std::make_unique<cluster_service>(coordinator_, info);
    auto port = sys_->middleman().publish(coordinator_, options_.cluster_port, options_.cluster_host.c_str(), true);
    if (!port) {
      return make_error(errc::io, "cannot listen for workers on " + options_.cluster_host + ":" +
                                      std::to_string(options_.cluster_port) + ": " + sys_->render(port.error()));
    }
    launch_settings ls;
    ls.method = options_.launch;
    ls.executable = options_.launch != launch_method::local && !options_.remote_executable.empty()
                        ? options_.remote_executable
                        : options_.executable;
    ls.coordinator = options_.cluster_host + ":" + std::to_string(*port);
    // Workers on this host bind UCX where the coordinator listens (unless that is every interface).
    const auto& h = options_.cluster_host;
    if (h != "0.0.0.0" && h != "::" && h != "[::]" && !h.empty()) ls.default_address = h;
    ls.ssh_template = options_.ssh_template;
    ls.srun_command = options_.srun_command;
    ls.threads = options_.worker_threads;
    // A worker keeps trying to reach us for as long as we wait for it.
    ls.join_timeout_s = static_cast<double>(options_.startup_timeout.count());
    CONVEYOR_TRY_ASSIGN(procs, worker_processes(ls, sites, setup.options.token));
    for (const auto& p : procs) {
      auto pid = launcher_.launch(p);
      if (!pid) return make_error(pid.err().code, p.label + ": " + pid.err().message);
      current_pids_.push_back(*pid);
      progress(p.label + ": started (pid " + std::to_string(*pid) + " on this machine)");
    }
    sites_ = std::move(sites);
    processes_ = std::move(procs);
    lock.unlock();
    return wait_ready();
  }

  service::inference_service& service() override { return *service_; }
  std::vector<int> worker_pids() const override {
    std::lock_guard lock(mu_);
    return current_pids_;
  }

  void shutdown() override {
    if (down_) return;
    down_ = true;
    if (coordinator_) caf::anon_send(coordinator_, shutdown_atom::value, options_.token);
    std::lock_guard lock(mu_);
    launcher_.stop_all(std::chrono::seconds(5));
    coordinator_ = nullptr;
    service_.reset();
    sys_.reset();  // waits for the coordinator to quit
  }

 private:
  /// serve: every stage on this host; a CUDA stage sees tp GPUs, round-robin over device_ids.
  std::vector<worker_site> local_sites(std::size_t stages) const {
    std::vector<worker_site> sites(stages);
    for (std::size_t k = 0; k < stages; ++k) {
      sites[k].address.clear();  // unnamed: launch_settings::default_address binds them
      if (options_.device != "cuda") continue;
      const auto& ids = options_.device_ids;
      for (int r = 0; r < options_.tp; ++r) {
        const int slot = static_cast<int>(k) * options_.tp + r;
        const int gpu = ids.empty() ? slot : ids[slot % ids.size()];
        sites[k].visible_devices += (r ? "," : "") + std::to_string(gpu);
      }
    }
    return sites;
  }

  /// A new process for `stage` (called by the coordinator actor when its worker was lost).
  result<int> restart(int stage) {
    std::lock_guard lock(mu_);
    if (down_) return make_error(errc::internal, "the cluster is shutting down");
    std::size_t index = processes_.size();
    for (std::size_t i = 0; i < processes_.size(); ++i) {
      if (processes_[i].stages == std::vector<int>{stage}) index = i;
    }
    if (index == processes_.size()) {
      return make_error(errc::unsupported, "its process also runs other stages (launch.method = \"slurm\" starts "
                                           "every stage in one srun step); use \"local\" or \"ssh\" to restart one stage");
    }
    // What is left of the old one (it may only have stopped answering): its whole process group, so
    // an ssh command takes the remote worker with it. Not reaped until now, its pid cannot have been
    // reused. (The new worker's PR_SET_PDEATHSIG follows the thread that starts it, an actor-system
    // thread, which lives as long as this process.)
    ::kill(-current_pids_[index], SIGKILL);
    while (launcher_.poll_exit()) {
    }
    auto pid = launcher_.launch(processes_[index]);
    if (!pid) return pid.err();
    current_pids_[index] = *pid;
    progress(processes_[index].label + ": restarted (pid " + std::to_string(*pid) + " on this machine)");
    return static_cast<int>(*pid);
  }

  /// How the current process of `stage` ended, once it has.
  std::optional<std::string> process_ended(int stage) {
    std::lock_guard lock(mu_);
    for (std::size_t i = 0; i < processes_.size(); ++i) {
      const auto& st = processes_[i].stages;
      if (std::find(st.begin(), st.end(), stage) != st.end()) return launcher_.ended(current_pids_[i]);
    }
    return std::nullopt;
  }

  void progress(const std::string& line) const {
    if (options_.on_progress) options_.on_progress(line);
  }

  std::string stage_label(std::size_t k) const {
    const auto& s = sites_[k];
    return s.address.empty() ? "stage " + std::to_string(k)
                             : "host " + s.host_name + " (" + s.address + ") stage " + std::to_string(k);
  }

  std::optional<service::health_report> health_now() {
    auto p = std::make_shared<std::promise<service::health_report>>();
    auto f = p->get_future();
    service_->health([p](service::health_report h) { p->set_value(std::move(h)); });
    if (f.wait_for(std::chrono::seconds(5)) != std::future_status::ready) return std::nullopt;
    return f.get();
  }

  static std::string what_is_pending(const std::string& state, const std::string& detail) {
    if (state == "starting") return "never joined the coordinator (unreachable, or its launch command hangs)";
    return state + (detail.empty() ? "" : ": " + detail);
  }

  status wait_ready() {
    const auto until = std::chrono::steady_clock::now() + options_.startup_timeout;
    service::health_report last;
    std::vector<std::string> reported(sites_.size());
    while (std::chrono::steady_clock::now() < until) {
      if (options_.should_stop && options_.should_stop()) {
        return make_error(errc::internal, "start-up interrupted: stopping every worker started so far");
      }
      auto h = health_now();
      if (!h) continue;
      last = std::move(*h);
      if (last.ready) {
        progress("all " + std::to_string(sites_.size()) + " stages ready");
        return ok_status();
      }
      for (const auto& s : last.stages) {
        const std::string text = s.state + (s.detail.empty() ? "" : ": " + s.detail);
        if (s.stage >= 0 && static_cast<std::size_t>(s.stage) < reported.size() && reported[s.stage] != text) {
          reported[s.stage] = text;
          if (s.state != "starting") progress(stage_label(s.stage) + ": " + text);
        }
        if (s.state == "failed") {
          return make_error(errc::internal, stage_label(s.stage) + " failed during start-up: " + s.detail);
        }
      }
      // A process that ended while one of its stages had not joined means that stage never will.
      std::optional<worker_launcher::exit_report> ended;
      {
        std::lock_guard lock(mu_);
        ended = launcher_.poll_exit();
      }
      if (ended) {
        const auto& p = processes_[ended->index];
        if (auto now = health_now()) last = std::move(*now);
        for (int k : p.stages) {
          if (static_cast<std::size_t>(k) < last.stages.size() && last.stages[k].state == "starting") {
            return make_error(errc::internal, p.label + ": the worker's process " + ended->how +
                                                  " before it joined the coordinator (its messages are above)");
          }
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    std::string pending;
    for (const auto& s : last.stages) {
      if (s.state == "ready") continue;
      pending += "\n  " + stage_label(s.stage) + ": " + what_is_pending(s.state, s.detail);
    }
    return make_error(errc::internal, "the cluster did not come up within " + std::to_string(options_.startup_timeout.count()) +
                                          " s (serving.startup_timeout_s); not ready:" + pending);
  }

  cluster_options options_;
  worker_launcher launcher_;
  std::vector<worker_site> sites_;         ///< stage order
  std::vector<process_spec> processes_;    ///< launch order (worker_launcher's indices)
  std::vector<int> current_pids_;          ///< launch order: each process's current pid
  mutable std::mutex mu_;                  ///< the launcher and pids: the coordinator restarts stages
  caf::actor_system_config cfg_;
  std::unique_ptr<caf::actor_system> sys_;
  caf::actor coordinator_;
  std::unique_ptr<cluster_service> service_;
  std::atomic<bool> down_{false};
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
  // A KV cache sized from memory must hold one sequence of model_ctx: the workers' plans fail otherwise.
  setup.max_context = o.kv_blocks > 0 ? std::min(model_ctx, o.kv_blocks * o.kv_block_size) : model_ctx;
  if (o.kv_blocks < 0 || (o.kv_blocks == 0 && !(o.kv_memory_fraction > 0.0 && o.kv_memory_fraction <= 1.0))) {
    return make_error(errc::invalid_argument, "kv_blocks must be positive, or 0 with a kv_memory_fraction in (0, 1]");
  }
  setup.eos_ids = config.eos_token_ids;
  setup.canary_token = config.bos_token_id >= 0 && config.bos_token_id < config.vocab_size ? config.bos_token_id : 0;
  if (o.spec_k > 0 && o.draft_dir == "ngram") {
    // Prompt lookup: no draft model, nothing on a device.
    auto draft = std::make_shared<coordinator_setup::draft_model>();
    CONVEYOR_TRY_ASSIGN(p, engine::make_ngram_proposer({o.ngram_min, o.ngram_max}, o.ngram_corpus));
    if (auto st = p->check_vocabulary(config.vocab_size); !st) {
      return make_error(st.err().code, "model.ngram_corpus: " + st.err().message);
    }
    draft->proposer = std::move(p);
    setup.draft = std::move(draft);
  } else if (o.spec_k > 0) {
    auto draft = std::make_shared<coordinator_setup::draft_model>();
    // The draft runs in this process, on the device the stages use: a CUDA deployment drafts on
    // the first stage's GPU (the coordinator sees every GPU), a CPU one on this host's cores.
    if (o.device == "cuda") {
#ifdef CONVEYOR_HAVE_CUDA
      kernels::cuda_backend_options co;
      co.device = o.device_ids.empty() ? 0 : o.device_ids[0];
      co.compute_dtype = o.dtype == "f32" ? kernels::dtype::f32 : kernels::dtype::bf16;
      co.batch_invariant = o.batch_invariant;  // its first pass over a prompt rounds as the stages' does
      co.gemm_tuning_cache = kernels::default_gemm_tuning_cache();
      auto b = kernels::make_cuda_backend(co);
      if (!b) return make_error(b.err().code, "model.draft on cuda: " + b.err().message);
      draft->backend = std::move(b).value();
#else
      return make_error(errc::unsupported, "model.spec_k on cuda: this build of conveyor has no CUDA backend");
#endif
    } else {
      draft->backend = kernels::make_cpu_backend({o.worker_threads});
    }
    engine::executor_options eo;
    eo.kv_blocks = o.kv_blocks > 0 ? o.kv_blocks : 512;  // the draft's own pool; it drafts for no longer sequences
    eo.kv_block_size = o.kv_block_size;
    eo.max_step_tokens = o.max_step_tokens;
    eo.max_seqs = o.max_seqs_per_step;
    auto pipe = engine::local_pipeline::create(*draft->backend, o.draft_dir.empty() ? o.model_dir : o.draft_dir, 1,
                                               eo, o.draft_layers);
    if (!pipe) return make_error(pipe.err().code, "model.draft: " + pipe.err().message);
    if ((*pipe)->config().vocab_size != config.vocab_size) {
      return make_error(errc::invalid_argument, "model.draft has a vocabulary of " +
                                                    std::to_string((*pipe)->config().vocab_size) +
                                                    " tokens, the model " + std::to_string(config.vocab_size));
    }
    draft->proposer = std::make_unique<engine::draft_proposer>(std::move(pipe).value());
    setup.draft = std::move(draft);
  }
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
