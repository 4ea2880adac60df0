// The stage-worker actor. It only relays: loading, wiring and the steps themselves run on plain
// threads (stage_runtime), which report back with messages, so no CAF thread ever blocks.
#include "conveyor/stage/worker_main.hpp"

#include <unistd.h>

#include <cstdio>
#include <thread>

#include "caf/io/all.hpp"
#include "conveyor/kernels/cpu_backend.hpp"
#ifdef CONVEYOR_HAVE_CUDA
#include "conveyor/kernels/cuda_backend.hpp"
#endif
#include "conveyor/stage/protocol.hpp"
#include "conveyor/stage/stage_runtime.hpp"
#include "conveyor/transport/cpu_collective.hpp"
#include "conveyor/transport/nccl_collective.hpp"

namespace conveyor::stage {

namespace {

using bytes_msg = std::vector<char>;

std::vector<std::byte> to_bytes(const bytes_msg& v) {
  std::vector<std::byte> out(v.size());
  std::memcpy(out.data(), v.data(), v.size());
  return out;
}
bytes_msg to_msg(const std::vector<std::byte>& v) {
  bytes_msg out(v.size());
  std::memcpy(out.data(), v.data(), v.size());
  return out;
}

using loaded_internal = caf::atom_constant<caf::atom("iloaded")>;

/// The backends of the stage's tensor-parallel ranks, as the assignment asks. A CUDA worker sees
/// only its own GPUs (CUDA_VISIBLE_DEVICES, set by whoever started it): rank r uses device r.
result<std::vector<std::unique_ptr<kernels::backend>>> make_backends(const stage_assignment& a, int threads) {
  std::vector<std::unique_ptr<kernels::backend>> out;
  for (int r = 0; r < a.tp; ++r) {
    if (a.device == "cpu") {
      out.push_back(kernels::make_cpu_backend({threads}));
    } else if (a.device == "cuda") {
#ifdef CONVEYOR_HAVE_CUDA
      kernels::cuda_backend_options o;
      o.device = r;
      o.compute_dtype = a.dtype == "f32" ? kernels::dtype::f32 : kernels::dtype::bf16;
      o.batch_invariant = a.batch_invariant;
      o.gemm_tuning_cache = kernels::default_gemm_tuning_cache();  // same choices, same tokens after a restart
      CONVEYOR_TRY_ASSIGN(b, kernels::make_cuda_backend(o));
      out.push_back(std::move(b));
#else
      return make_error(errc::unsupported, "this worker was built without the CUDA backend");
#endif
    } else {
      return make_error(errc::invalid_argument, "unknown device \"" + a.device + "\"");
    }
  }
  return out;
}

/// The collectives joining the ranks: the CPU group for CPU ranks, NCCL on each GPU's stream.
engine::tp_group_factory group_factory(const std::string& device, std::vector<kernels::backend*> backends) {
  if (device == "cuda") {
    return [backends](int size) -> result<std::vector<std::unique_ptr<kernels::collective>>> {
      std::vector<int> devices;
      std::vector<void*> streams;
      for (int r = 0; r < size; ++r) {
        devices.push_back(r);
#ifdef CONVEYOR_HAVE_CUDA
        streams.push_back(kernels::cuda_stream_of(*backends[r]));
#else
        streams.push_back(nullptr);
#endif
      }
      return transport::make_nccl_group(devices, streams);
    };
  }
  return [](int size) -> result<std::vector<std::unique_ptr<kernels::collective>>> {
    return transport::cpu_group(size).all_ranks();
  };
}

struct worker_state {
  worker_options options;
  caf::actor coordinator;
  std::vector<std::unique_ptr<kernels::backend>> backends;  // one per tensor-parallel rank
  std::shared_ptr<stage_runtime> runtime;
  std::string load_error;
  std::vector<std::thread> helpers;  // loading and wiring threads, joined at exit
  std::shared_ptr<int> exit_code;    // what run_worker returns
  static inline const char* name = "stage_worker";
};

void shutdown(caf::stateful_actor<worker_state>* self) {
  if (self->state.runtime) self->state.runtime->stop();
  for (auto& t : self->state.helpers) {
    if (t.joinable()) t.join();
  }
  self->quit();
}

caf::behavior worker_actor(caf::stateful_actor<worker_state>* self, worker_options options, caf::actor coordinator,
                           std::shared_ptr<int> exit_code) {
  self->state.options = options;
  self->state.coordinator = coordinator;
  self->state.exit_code = exit_code;
  self->monitor(coordinator);
  self->set_down_handler([=](caf::down_msg&) {
    std::fprintf(stderr, "conveyor worker %d: the coordinator went away; stopping\n", self->state.options.stage);
    shutdown(self);
  });
  self->request(coordinator, std::chrono::seconds(30), join_atom::value, options.token, protocol_version,
                static_cast<std::int32_t>(options.stage), static_cast<std::int32_t>(options.rank),
                static_cast<std::int32_t>(::getpid()), caf::actor_cast<caf::actor>(self))
      .then(
          [=](assign_atom, stage_assignment a) {
            stage_runtime_options o;
            o.model_dir = a.model_dir;
            o.stage = a.stage;
            o.num_stages = a.num_stages;
            o.range = engine::stage_range{a.first_layer, a.last_layer, a.stage == 0, a.stage + 1 == a.num_stages};
            o.executor.kv_blocks = a.kv_blocks;
            o.kv_plan.kv_fraction = a.kv_fraction;
            o.kv_plan.min_blocks = std::max(1, a.kv_min_blocks);
            o.executor.kv_block_size = a.kv_block_size;
            o.executor.max_step_tokens = a.max_step_tokens;
            o.executor.max_seqs = a.max_seqs;
            o.warm_up.decode_batches.assign(a.warm_up_batches.begin(), a.warm_up_batches.end());
            auto quant = engine::parse_weight_quant(a.quant);
            if (!quant) {
              self->send(coordinator, failed_atom::value, a.stage, static_cast<std::int32_t>(options.rank),
                         "stage assignment: " + quant.err().message);
              return;
            }
            o.executor.quant.kind = *quant;
            o.executor.quant.lm_head = a.quant_lm_head;
            o.ucx.tls = a.ucx_tls;
            o.ucx.net_devices = options.net_devices;
            // A coordinator on loopback means a one-host cluster: UCX's tcp listeners stay on lo too, not on
            // every interface (tests/security found them on eth0).
            const auto& host = options.coordinator_host;
            if (host.rfind("127.", 0) == 0 || host == "localhost" || host == "::1") o.ucx.net_devices = "lo";
            o.step_delay = std::chrono::microseconds(a.step_delay_us);
            o.max_frame_bytes = static_cast<std::uint64_t>(a.max_frame_bytes);
            self->send(coordinator, progress_atom::value, a.stage, static_cast<std::int32_t>(options.rank),
                       "loading layers " + std::to_string(a.first_layer) + ".." + std::to_string(a.last_layer));
            auto made = make_backends(a, options.threads);
            if (!made) {
              self->send(coordinator, failed_atom::value, a.stage, static_cast<std::int32_t>(options.rank),
                         made.err().message);
              return;
            }
            self->state.backends = std::move(made).value();
            std::vector<kernels::backend*> backends;
            for (auto& b : self->state.backends) backends.push_back(b.get());
            auto make_group = group_factory(a.device, backends);
            caf::actor me = caf::actor_cast<caf::actor>(self);
            auto* st = &self->state;
            st->helpers.emplace_back([=] {
              auto rt = stage_runtime::create(backends, o, make_group);
              if (!rt) {
                st->load_error = rt.err().message;
              } else {
                st->runtime = std::shared_ptr<stage_runtime>(std::move(rt).value());
              }
              caf::anon_send(me, loaded_internal::value);
            });
          },
          [=](caf::error& err) {
            std::fprintf(stderr, "conveyor worker %d: join refused: %s\n", options.stage,
                         self->system().render(err).c_str());
            *self->state.exit_code = 1;  // a refused worker did not do its job: whoever started it must see that
            shutdown(self);
          });
  return {
      [=](loaded_internal) {
        auto& st = self->state;
        const auto stage = static_cast<std::int32_t>(st.options.stage);
        const auto rank = static_cast<std::int32_t>(st.options.rank);
        if (!st.runtime) {
          self->send(st.coordinator, failed_atom::value, stage, rank, st.load_error);
          return;
        }
        self->send(st.coordinator, loaded_atom::value, stage, rank, to_msg(st.runtime->address()),
                   static_cast<std::int64_t>(st.runtime->weight_bytes()), static_cast<std::int32_t>(st.runtime->kv_blocks()),
                   st.runtime->load_note());
      },
      [=](wire_atom, bytes_msg upstream, bytes_msg downstream) {
        auto& st = self->state;
        auto rt = st.runtime;
        caf::actor coord = st.coordinator;
        const auto stage = static_cast<std::int32_t>(st.options.stage);
        const auto rank = static_cast<std::int32_t>(st.options.rank);
        caf::actor me = caf::actor_cast<caf::actor>(self);
        st.helpers.emplace_back([=] {
          std::optional<transport::worker_address> up, down;
          if (!upstream.empty()) up = to_bytes(upstream);
          if (!downstream.empty()) down = to_bytes(downstream);
          // Sent as this worker (not anonymously), so the coordinator can tell them from a stranger's.
          auto on_tokens = [coord, me](std::uint64_t mb, std::uint64_t step, std::vector<std::int32_t> tokens) {
            caf::send_as(me, coord, done_atom::value, mb, step, std::move(tokens));
          };
          auto on_failure = [coord, me, stage](std::uint64_t mb, std::uint64_t step, std::string why) {
            caf::send_as(me, coord, step_fail_atom::value, stage, mb, step, std::move(why));
          };
          auto st2 = rt->wire(up, down, on_tokens, on_failure);
          caf::send_as(me, coord, wired_atom::value, stage, rank, st2.ok() ? std::string() : st2.err().message);
        });
      },
      [=](reset_atom, std::uint64_t number, bool drop_upstream, bool drop_downstream) {
        auto& st = self->state;
        auto rt = st.runtime;
        caf::actor coord = st.coordinator;
        caf::actor me = caf::actor_cast<caf::actor>(self);
        const auto stage = static_cast<std::int32_t>(st.options.stage);
        st.helpers.emplace_back([=] {
          if (rt) rt->detach(drop_upstream, drop_downstream);
          caf::send_as(me, coord, reset_done_atom::value, stage, number);
        });
      },
      [=](step_atom, std::uint64_t /*microbatch*/, const bytes_msg& header) {
        if (self->state.runtime) self->state.runtime->submit(to_bytes(header));
      },
      [=](qstep_atom, std::uint64_t microbatch, std::int32_t mode, const bytes_msg& header) {
        auto& st = self->state;
        if (!st.runtime) return;
        if (mode < static_cast<std::int32_t>(qstep_mode::hold) || mode > static_cast<std::int32_t>(qstep_mode::flush)) {
          // Only a coordinator of another build sends this: say so instead of guessing.
          caf::send_as(caf::actor_cast<caf::actor>(self), st.coordinator, step_fail_atom::value,
                       static_cast<std::int32_t>(st.options.stage), microbatch, UINT64_MAX,
                       "stage " + std::to_string(st.options.stage) + ": unknown queued-step mode " + std::to_string(mode));
          return;
        }
        st.runtime->submit(to_bytes(header), static_cast<stage_runtime::step_mode>(mode));
      },
      [=](ping_atom) -> caf::result<pong_atom, double, double, std::uint64_t> {
        if (!self->state.runtime) return {pong_atom::value, 0.0, 0.0, std::uint64_t{0}};
        const auto t = self->state.runtime->timings();
        return {pong_atom::value, t.busy_s, t.idle_s, t.steps};
      },
      [=](metrics_atom) -> caf::result<metrics_atom, stage_metrics> {
        stage_metrics m;
        char host[256] = {};
        if (::gethostname(host, sizeof host - 1) == 0) m.host = host;
        m.tp_rank = static_cast<std::int32_t>(self->state.options.rank);
        if (self->state.runtime) {
          const auto h = self->state.runtime->hop_metrics();
          m.frames_sent = h.frames_sent;
          m.bytes_sent = h.bytes_sent;
          m.frames_received = h.frames_received;
          m.bytes_received = h.bytes_received;
          m.sends_in_flight = h.sends_in_flight;
          m.latency_counts = h.latency_counts;
          m.latency_sum_s = h.latency_sum_s;
        }
        return {metrics_atom::value, std::move(m)};
      },
      [=](stop_atom) { shutdown(self); },
  };
}

}  // namespace

int run_worker(const worker_options& options) {
  caf::actor_system_config cfg;
  register_protocol(cfg);
  tune_actor_system(cfg);
  cfg.load<caf::io::middleman>();
  caf::actor_system sys{cfg};
  // The coordinator publishes before it starts us, but allow for a slow start or a slow network.
  caf::expected<caf::actor> coordinator = caf::sec::cannot_connect_to_node;
  const auto give_up = std::chrono::steady_clock::now() + options.join_timeout;
  do {
    coordinator = sys.middleman().remote_actor(options.coordinator_host, options.coordinator_port);
    if (coordinator) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  } while (std::chrono::steady_clock::now() < give_up);
  if (!coordinator) {
    std::fprintf(stderr, "conveyor worker %d: cannot reach the coordinator at %s:%u: %s\n", options.stage,
                 options.coordinator_host.c_str(), options.coordinator_port, sys.render(coordinator.error()).c_str());
    return 1;
  }
  auto exit_code = std::make_shared<int>(0);
  sys.spawn(worker_actor, options, *coordinator, exit_code);
  sys.await_all_actors_done();
  return *exit_code;
}

}  // namespace conveyor::stage
