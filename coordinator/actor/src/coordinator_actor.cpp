// The coordinator: worker membership and wiring, readiness (canary), liveness, and the batch
// scheduler's steps. Its behaviours delegate to plain classes; it never blocks.
#include "coordinator_actor.hpp"

#include <cassert>
#include <climits>
#include <cstdio>

#include "conveyor/scheduler/batch_scheduler.hpp"
#include "conveyor/stage/hop_meter.hpp"
#include "conveyor/stage/plan_convert.hpp"
#include "conveyor/stage/protocol.hpp"
#include "conveyor/transport/frame_codec.hpp"

namespace conveyor::coordinator {

namespace {

using namespace conveyor::stage;  // protocol atoms
using bytes_msg = std::vector<char>;
constexpr std::uint64_t whole_stage = UINT64_MAX;
/// The scheduler's clock: expires deadlines, starts dynamic batches whose delay ran out (issue 6).
using policy_tick_atom = caf::atom_constant<caf::atom("ptick")>;
/// A recovery (its number) that has not finished within the start-up timeout has failed.
using recovery_deadline_atom = caf::atom_constant<caf::atom("recdead")>;
/// A neighbour reported a lost peer; if no stage is known dead by now, the cluster is down.
using suspect_atom = caf::atom_constant<caf::atom("suspect")>;

struct worker_slot {
  caf::actor handle;
  int pid = 0;
  std::string state = "starting";  // starting | loading | loaded | wired | ready | failed
  std::string detail;
  bytes_msg address;
  double busy_s = 0.0, idle_s = 0.0;
  std::uint64_t steps = 0;
  std::chrono::steady_clock::time_point last_pong;
  int restarts = 0;  ///< times this stage's worker was replaced
  int kv_blocks = 0;  ///< its KV pool, as loaded reported it
  stage::stage_metrics frames;  ///< its activation-frame counters, as of the last heartbeat
};

/// A stage being replaced: its new worker loads while the neighbours drop their channels to the
/// dead one; then the three are wired again and the scheduler re-prefills every running sequence.
struct recovery_state {
  bool active = false;
  int stage = -1;
  std::uint64_t number = 0;  ///< counts recoveries, so a stale deadline is recognised
  int resets_pending = 0;    ///< neighbours still dropping their channels
  int wired_pending = 0;     ///< workers still wiring (the new one and its neighbours)
  bool wiring = false;
  std::chrono::steady_clock::time_point died;
};

struct coordinator_state {
  coordinator_setup setup;
  std::vector<worker_slot> workers;
  std::unique_ptr<scheduler::batch_scheduler> sched;
  std::unordered_map<std::uint64_t, std::uint64_t> tickets;  // frontend ticket -> scheduler id
  bool ready = false;
  bool wiring = false;
  std::string failure;  // why the cluster is down (empty while healthy)
  std::uint64_t steps = 0;
  std::vector<std::uint64_t> step_of;  // the step each microbatch has in flight: older results are stale
  // Queued steps (serving.queued_steps on a one-stage cluster, see `queued`): the step
  // queued behind the one in flight, and whether stage 0 holds a step that still waits for its
  // chain or flush (the protocol's promise: every held step gets exactly one of them).
  bool queued = false;
  std::vector<std::uint64_t> ahead_step_of;
  std::vector<bool> owes_successor;
  recovery_state recovery;
  std::string suspect;  // a neighbour's report of a lost peer, until a dead stage explains it
  static inline const char* name = "coordinator";
};

using coord_actor = caf::stateful_actor<coordinator_state>;

/// Delivers the canary's outcome to the actor itself (the sink is called inside the actor).
class canary_sink final : public service::token_sink {
 public:
  explicit canary_sink(coord_actor* self) : self_(self) {}
  void on_tokens(std::span<const std::int32_t>) override {}
  void on_done(result<service::generate_summary> s) override {
    auto& st = self_->state;
    if (s.ok()) {
      st.ready = true;
      for (auto& w : st.workers) w.state = "ready";
      std::fprintf(stderr, "conveyor: canary passed all %zu stages; ready\n", st.workers.size());
    } else {
      st.failure = "the canary failed: " + s.err().message;
    }
  }

 private:
  coord_actor* self_;
};

/// Forgets a request's frontend ticket when it ends (sinks are called inside the actor).
class ticket_sink final : public service::token_sink {
 public:
  ticket_sink(coord_actor* self, std::uint64_t ticket, std::shared_ptr<service::token_sink> inner)
      : self_(self), ticket_(ticket), inner_(std::move(inner)) {}
  void on_tokens(std::span<const std::int32_t> t) override { inner_->on_tokens(t); }
  void on_done(result<service::generate_summary> s) override {
    self_->state.tickets.erase(ticket_);
    inner_->on_done(std::move(s));
  }

 private:
  coord_actor* self_;
  std::uint64_t ticket_;
  std::shared_ptr<service::token_sink> inner_;
};

void fail_cluster(coord_actor* self, const std::string& why) {
  auto& st = self->state;
  if (st.failure.empty()) {
    st.failure = why;
    std::fprintf(stderr, "conveyor: %s\n", why.c_str());
  }
  st.ready = false;
  if (st.sched) st.sched->fail_all(make_error(errc::internal, why));
}

/// The plan as stage 0's message bytes, numbered st.steps++; an encoding error fails the step.
std::optional<bytes_msg> encode_step(coord_actor* self, int m, const engine::step_plan& plan) {
  auto& st = self->state;
  auto bytes = transport::encode_header(stage::to_frame_header(plan, static_cast<std::uint64_t>(m), st.steps++));
  if (!bytes) {
    st.sched->fail_step(m, bytes.err());
    return std::nullopt;
  }
  bytes_msg msg(bytes->size());
  std::memcpy(msg.data(), bytes->data(), bytes->size());
  return msg;
}

void send_qstep(coord_actor* self, int m, qstep_mode mode, bytes_msg msg) {
  self->send(self->state.workers[0].handle, qstep_atom::value, static_cast<std::uint64_t>(m),
             static_cast<std::int32_t>(mode), std::move(msg));
}

/// Queued steps: stage 0 holds microbatch m's newest step; queue the next one behind it where the
/// scheduler can plan it now, else let the stage end the held one.
void follow_held(coord_actor* self, int m) {
  auto& st = self->state;
  if (!st.owes_successor[m] || st.sched->ahead(m)) return;
  if (st.sched->in_flight(m)) {
    if (auto ahead = st.sched->next_step_ahead(m)) {
      const std::uint64_t number = st.steps;
      if (auto msg = encode_step(self, m, *ahead)) {
        st.ahead_step_of[m] = number;
        send_qstep(self, m, qstep_mode::chain, std::move(*msg));
        return;
      }
    }
  }
  st.owes_successor[m] = false;
  send_qstep(self, m, qstep_mode::flush, {});
}

void pump(coord_actor* self) {
  auto& st = self->state;
  if (!st.failure.empty() || st.recovery.active || st.workers.empty() || !st.workers[0].handle) return;
  for (int m = 0; m < st.sched->chunks(); ++m) {
    if (auto plan = st.sched->next_step(m)) {
      const std::uint64_t number = st.steps;
      auto msg = encode_step(self, m, *plan);
      if (!msg) continue;
      st.step_of[m] = number;
      if (st.queued) {
        st.owes_successor[m] = true;
        send_qstep(self, m, qstep_mode::hold, std::move(*msg));
      } else {
        self->send(st.workers[0].handle, step_atom::value, static_cast<std::uint64_t>(m), std::move(*msg));
      }
    }
    if (st.queued) follow_held(self, m);
  }
}

/// The workers sized their KV pools from their memory: the scheduler hands out the least of them,
/// and a replacement worker gets that many (a fixed size from now on).
void size_kv_cache(coord_actor* self) {
  auto& st = self->state;
  int blocks = INT_MAX;
  for (const auto& w : st.workers) blocks = std::min(blocks, w.kv_blocks);
  const bool sized = st.sched->set_kv_blocks(blocks);
  assert(sized && "nothing is scheduled before the stages are loaded");
  (void)sized;
  st.setup.options.kv_blocks = blocks;
}

void start_wiring(coord_actor* self) {
  auto& st = self->state;
  st.wiring = true;
  const std::size_t n = st.workers.size();
  for (std::size_t k = 0; k < n; ++k) {
    bytes_msg up = k > 0 ? st.workers[k - 1].address : bytes_msg{};
    bytes_msg down = k + 1 < n ? st.workers[k + 1].address : bytes_msg{};
    self->send(st.workers[k].handle, wire_atom::value, std::move(up), std::move(down));
  }
}

void start_canary(coord_actor* self) {
  service::generate_request r;
  r.prompt = {self->state.setup.canary_token};
  r.max_new_tokens = 1;
  r.ignore_eos = true;
  auto id = self->state.sched->add(std::move(r), std::make_shared<canary_sink>(self));
  if (!id) fail_cluster(self, "cannot schedule the canary: " + id.err().message);
  self->state.sched->flush();  // a static batch must not wait for company for the canary
  pump(self);
}

service::health_report health_of(const coordinator_state& st) {
  service::health_report h;
  h.ready = st.ready;
  for (std::size_t k = 0; k < st.workers.size(); ++k) {
    const auto& w = st.workers[k];
    h.stages.push_back({static_cast<int>(k), 0, w.state, w.detail});
  }
  return h;
}

/// Every worker's activation-frame counters, labelled with its stage and host: the placement's host
/// name where `conveyor launch` placed it, else the hostname the worker reported.
void add_frame_hops(const coordinator_state& st, service::stats_report& r) {
  const auto& sites = st.setup.options.sites;
  for (std::size_t k = 0; k < st.workers.size(); ++k) {
    const auto& f = st.workers[k].frames;
    if (f.latency_counts.empty()) continue;  // not reported yet (first heartbeat, or still loading)
    service::frame_hop_report h;
    h.stage = static_cast<int>(k);
    h.tp_rank = f.tp_rank;
    h.host = k < sites.size() ? sites[k].host_name : f.host;
    h.frames_sent = f.frames_sent;
    h.bytes_sent = f.bytes_sent;
    h.frames_received = f.frames_received;
    h.bytes_received = f.bytes_received;
    h.sends_in_flight = f.sends_in_flight;
    h.send_latency_bounds = stage::hop_latency_bounds();
    h.send_latency_counts = f.latency_counts;
    h.send_latency_sum_s = f.latency_sum_s;
    r.hops.push_back(std::move(h));
  }
}

service::stats_report stats_of(const coordinator_state& st) {
  service::stats_report r;
  const auto c = st.sched->counters();
  r.requests_running = c.running;
  r.requests_waiting = c.waiting;
  r.requests_finished = c.finished + c.cancelled;
  r.requests_failed = c.failed;
  r.tokens_generated = c.tokens_generated;
  r.kv_blocks_total = st.sched->blocks().num_blocks();
  r.kv_blocks_free = c.kv_blocks_free;
  st.sched->report(r);  // and the policy counters: rejected, expired, preemptions, prefix cache
  for (const auto& w : st.workers) {
    r.stage_busy_s.push_back(w.busy_s);
    r.stage_idle_s.push_back(w.idle_s);
    r.stage_steps.push_back(static_cast<std::int64_t>(w.steps));
  }
  add_frame_hops(st, r);
  return r;
}

void handle_frontend(coord_actor* self, const frontend_call_ptr& call) {
  auto& st = self->state;
  switch (call->what) {
    case frontend_call::kind::submit: {
      // While a stage is being replaced, requests queue (they run once it is back); /ready says no.
      if (!st.failure.empty() || (!st.ready && !st.recovery.active)) {
        call->sink->on_done(make_error(errc::internal, st.failure.empty()
                                                           ? std::string("the cluster is not ready yet")
                                                           : "the cluster is down: " + st.failure));
        return;
      }
      auto id = st.sched->add(std::move(call->request), std::make_shared<ticket_sink>(self, call->ticket, call->sink));
      if (!id) {
        call->sink->on_done(id.err());
        return;
      }
      st.tickets[call->ticket] = *id;
      pump(self);
      return;
    }
    case frontend_call::kind::cancel:
      if (auto it = st.tickets.find(call->ticket); it != st.tickets.end()) {
        st.sched->cancel(it->second);  // its ticket_sink forgets the ticket
        pump(self);
      }
      return;
    case frontend_call::kind::health:
      call->health_reply(health_of(st));
      return;
    case frontend_call::kind::stats:
      call->stats_reply(stats_of(st));
      return;
    case frontend_call::kind::flush:  // arrivals ended: static and dynamic batches start short
      st.sched->flush();
      pump(self);
      return;
  }
}

/// The slot of `stage` if the message may speak for it: the stage exists, has joined, and (for
/// messages its worker actor sends itself) comes from that worker. Anything else is a stranger on
/// the cluster port or a bug, and is dropped instead of trusted (the token guards only join).
worker_slot* slot_for(coord_actor* self, std::int32_t stage, bool check_sender) {
  auto& workers = self->state.workers;
  if (stage < 0 || stage >= static_cast<int>(workers.size()) || !workers[stage].handle) return nullptr;
  if (check_sender && self->current_sender() != caf::actor_cast<caf::strong_actor_ptr>(workers[stage].handle)) {
    return nullptr;
  }
  return &workers[stage];
}

/// Wires the new worker and its neighbours once it has loaded and they have dropped their old channels.
void try_rewire(coord_actor* self) {
  auto& st = self->state;
  auto& r = st.recovery;
  if (!r.active || r.wiring || r.resets_pending > 0) return;
  const std::size_t k = static_cast<std::size_t>(r.stage);
  auto& w = st.workers[k];
  if (!w.handle || w.state != "loaded") return;
  r.wiring = true;
  r.wired_pending = 1;
  const bool has_up = k > 0, has_down = k + 1 < st.workers.size();
  self->send(w.handle, wire_atom::value, has_up ? st.workers[k - 1].address : bytes_msg{},
             has_down ? st.workers[k + 1].address : bytes_msg{});
  // The neighbours keep their other channel (an empty address means "keep").
  if (has_up) {
    self->send(st.workers[k - 1].handle, wire_atom::value, bytes_msg{}, w.address);
    ++r.wired_pending;
  }
  if (has_down) {
    self->send(st.workers[k + 1].handle, wire_atom::value, w.address, bytes_msg{});
    ++r.wired_pending;
  }
}

void finish_recovery(coord_actor* self) {
  auto& st = self->state;
  auto& r = st.recovery;
  r.active = false;
  r.wiring = false;
  for (auto& w : st.workers) w.state = "ready";
  auto& w = st.workers[static_cast<std::size_t>(r.stage)];
  w.detail = "restarted " + std::to_string(w.restarts) + (w.restarts == 1 ? " time" : " times");
  st.ready = true;
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - r.died).count();
  std::fprintf(stderr, "conveyor: stage %d is back (pid %d) %.2f s after it was lost; re-prefilling the running requests\n",
               r.stage, w.pid, took);
  pump(self);
}

/// Stage k's worker is gone (its process exited, or it stopped answering). With recovery on, a new
/// worker replaces it and the running requests carry on; else (or when it keeps dying) the cluster
/// is down and every request fails at once with an error that names the stage.
void stage_lost(coord_actor* self, std::size_t k, const std::string& why) {
  auto& st = self->state;
  if (!st.failure.empty()) return;
  const auto& o = st.setup.options;
  auto& w = st.workers[k];
  w.state = "failed";
  w.detail = why;
  if (w.handle) {
    self->demonitor(w.handle);
    self->send(w.handle, stop_atom::value);  // one that only stopped answering may still hear it
  }
  w.handle = nullptr;
  w.address.clear();
  const std::string what = "stage " + std::to_string(k) + " " + why;
  if (!st.ready && !st.recovery.active) {
    fail_cluster(self, what);  // during start-up: cluster::start reports it
    return;
  }
  if (!o.recover_stages || !st.setup.restart_stage) {
    fail_cluster(self, what + " (stage recovery is off: cluster.recover_stages = false)");
    return;
  }
  auto& r = st.recovery;
  if (r.active && r.stage != static_cast<int>(k)) {
    fail_cluster(self, what + " while stage " + std::to_string(r.stage) + " was being replaced");
    return;
  }
  if (w.restarts >= o.max_stage_restarts) {
    fail_cluster(self, what + "; giving up on it after " + std::to_string(w.restarts) +
                           " restarts (cluster.max_stage_restarts = " + std::to_string(o.max_stage_restarts) + ")");
    return;
  }
  ++w.restarts;
  if (!r.active) r.died = std::chrono::steady_clock::now();
  r.active = true;
  r.stage = static_cast<int>(k);
  ++r.number;
  r.wiring = false;
  r.wired_pending = 0;
  r.resets_pending = 0;
  st.ready = false;
  st.suspect.clear();
  w.state = "restarting";
  w.detail = why + "; restart " + std::to_string(w.restarts) + " of at most " + std::to_string(o.max_stage_restarts);
  std::fprintf(stderr, "conveyor: %s; restarting it (%d of at most %d)\n", what.c_str(), w.restarts, o.max_stage_restarts);
  // Every running sequence re-prefills its history: simplest and always consistent, since the new
  // stage has no KV at all and the others' blocks may be half-written by steps that never finished.
  st.sched->reprefill_all();
  std::fill(st.step_of.begin(), st.step_of.end(), UINT64_MAX);
  std::fill(st.owes_successor.begin(), st.owes_successor.end(), false);  // the new stage holds nothing
  // The neighbours drop their channels to the dead worker before anyone connects to the new one
  // (a hello that reached the old channel would be lost).
  for (std::size_t n : {k - 1, k + 1}) {
    if (n >= st.workers.size() || !st.workers[n].handle) continue;  // k - 1 wraps for k = 0
    self->send(st.workers[n].handle, reset_atom::value, r.number, n == k + 1, n + 1 == k);
    ++r.resets_pending;
  }
  auto pid = st.setup.restart_stage(static_cast<int>(k));
  if (!pid) {
    fail_cluster(self, what + "; cannot restart it: " + pid.err().message);
    return;
  }
  w.pid = *pid;
  self->delayed_send(self, o.startup_timeout, recovery_deadline_atom::value, r.number);
}

void heartbeat(coord_actor* self) {
  auto& st = self->state;
  const auto now = std::chrono::steady_clock::now();
  // A replacement that has not joined yet has no actor to monitor: watch its process instead.
  if (st.recovery.active && st.setup.stage_process_ended) {
    const auto k = static_cast<std::size_t>(st.recovery.stage);
    auto& w = st.workers[k];
    if (!w.handle) {
      if (auto how = st.setup.stage_process_ended(st.recovery.stage)) {
        stage_lost(self, k, "replacement (pid " + std::to_string(w.pid) + ") " + *how + " before it joined the coordinator");
      }
    }
  }
  for (std::size_t k = 0; k < st.workers.size(); ++k) {
    auto& w = st.workers[k];
    if (!w.handle || w.state == "failed") continue;
    if (now - w.last_pong > st.setup.options.heartbeat_timeout) {
      stage_lost(self, k, "(pid " + std::to_string(w.pid) + ") stopped answering for " +
                              std::to_string(st.setup.options.heartbeat_timeout.count()) + " ms");
      continue;
    }
    caf::actor asked = w.handle;
    self->request(w.handle, st.setup.options.heartbeat_timeout, ping_atom::value)
        .then([=](pong_atom, double busy, double idle, std::uint64_t steps) {
          auto& slot = self->state.workers[k];
          if (slot.handle != asked) return;  // the answer of a worker since replaced
          slot.busy_s = busy;
          slot.idle_s = idle;
          slot.steps = steps;
          slot.last_pong = std::chrono::steady_clock::now();
        }, [](caf::error&) { /* the timeout check above decides */ });
    // Frame counters ride the same beat: /metrics and `client stats` are at most one period old.
    self->request(w.handle, st.setup.options.heartbeat_timeout, metrics_atom::value)
        .then([=](metrics_atom, stage::stage_metrics m) { self->state.workers[k].frames = std::move(m); },
              [](caf::error&) {});
  }
  self->delayed_send(self, st.setup.options.heartbeat, tick_atom::value);
}

caf::behavior coordinator_impl(coord_actor* self, coordinator_setup setup) {
  auto& st = self->state;
  st.setup = std::move(setup);
  const auto& o = st.setup.options;
  st.workers.resize(st.setup.ranges.size());
  st.step_of.assign(static_cast<std::size_t>(o.chunks), UINT64_MAX);
  scheduler::scheduler_options so;
  so.chunks = o.chunks;
  so.max_seqs_per_step = o.max_seqs_per_step;
  so.max_step_tokens = o.max_step_tokens;
  so.kv_blocks = o.kv_blocks;
  so.kv_block_size = o.kv_block_size;
  so.max_context = st.setup.max_context;
  so.vocab_size = st.setup.vocab_size;
  so.eos_ids = st.setup.eos_ids;
  so.policy = o.policy;
  if (st.setup.draft) {
    so.draft = st.setup.draft->proposer.get();
    so.spec_k = o.spec_k;
  }
  st.sched = std::make_unique<scheduler::batch_scheduler>(so);
  // Queued steps need a stage that draws and embeds (one stage, of any tensor-parallel ranks:
  // tp_stage::begin), one microbatch (the stage holds one step at a time) and no draft (drafts need
  // the tokens).
  st.queued = o.policy.queued_steps && st.setup.ranges.size() == 1 && o.chunks == 1 && so.draft == nullptr;
  st.ahead_step_of.assign(static_cast<std::size_t>(o.chunks), UINT64_MAX);
  st.owes_successor.assign(static_cast<std::size_t>(o.chunks), false);
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& s = self->state;
    for (std::size_t k = 0; k < s.workers.size(); ++k) {
      if (s.workers[k].handle && s.workers[k].handle.address() == dm.source) {
        stage_lost(self, k, "worker (pid " + std::to_string(s.workers[k].pid) + ") exited: " +
                                self->system().render(dm.reason));
      }
    }
  });
  self->delayed_send(self, o.heartbeat, tick_atom::value);
  self->delayed_send(self, st.sched->tick_period(), policy_tick_atom::value);
  return {
      [=](join_atom, const std::string& token, std::int32_t version, std::int32_t stage, std::int32_t rank,
          std::int32_t pid, caf::actor worker) -> caf::result<assign_atom, stage_assignment> {
        auto& s = self->state;
        if (token != s.setup.options.token) return caf::make_error(caf::sec::request_receiver_down, "bad cluster token");
        if (version != protocol_version) return caf::make_error(caf::sec::unexpected_message, "protocol version mismatch");
        if (stage < 0 || stage >= static_cast<int>(s.workers.size()) || rank != 0 || s.workers[stage].handle) {
          return caf::make_error(caf::sec::unexpected_message, "no such stage slot or already taken");
        }
        auto& w = s.workers[stage];
        w.handle = worker;
        w.pid = pid;
        w.state = "loading";
        w.last_pong = std::chrono::steady_clock::now();
        self->monitor(worker);
        const auto& r = s.setup.ranges[stage];
        stage_assignment a;
        a.model_dir = s.setup.options.model_dir;
        a.stage = stage;
        a.num_stages = static_cast<std::int32_t>(s.workers.size());
        a.first_layer = r.first_layer;
        a.last_layer = r.last_layer;
        a.kv_blocks = s.setup.options.kv_blocks;
        const auto& share = s.setup.gpu_sharers;
        a.kv_fraction = s.setup.options.kv_memory_fraction /
                        std::max(1, static_cast<std::size_t>(stage) < share.size() ? share[stage] : 1);
        a.kv_block_size = s.setup.options.kv_block_size;
        a.kv_min_blocks = (s.setup.max_context + a.kv_block_size - 1) / std::max(1, a.kv_block_size);
        a.max_step_tokens = s.setup.options.max_step_tokens;
        a.max_seqs = s.setup.options.max_seqs_per_step;
        a.ucx_tls = s.setup.options.ucx_tls;
        a.step_delay_us = s.setup.options.step_delay_us;
        a.device = s.setup.options.device;
        a.dtype = s.setup.options.dtype;
        a.tp = s.setup.options.tp;
        a.max_frame_bytes = static_cast<std::int64_t>(s.setup.options.max_frame_bytes);
        a.quant = s.setup.options.quant;
        a.quant_lm_head = s.setup.options.quant_lm_head;
        a.batch_invariant = s.setup.options.batch_invariant;
        a.warm_up_batches.assign(s.setup.options.warm_up_batches.begin(), s.setup.options.warm_up_batches.end());
        return {assign_atom::value, a};
      },
      [=](progress_atom, std::int32_t stage, std::int32_t, const std::string& text) {
        if (auto* w = slot_for(self, stage, true)) w->detail = text;
      },
      [=](loaded_atom, std::int32_t stage, std::int32_t, bytes_msg address, std::int64_t weight_bytes,
          std::int32_t kv_blocks, const std::string& note) {
        auto& s = self->state;
        auto* slot = slot_for(self, stage, true);
        if (slot == nullptr) return;
        auto& w = *slot;
        w.state = "loaded";
        w.address = std::move(address);
        w.kv_blocks = kv_blocks;
        w.detail = std::to_string(weight_bytes) + " weight bytes, " + std::to_string(kv_blocks) + " KV blocks" +
                   (note.empty() ? "" : "; " + note);
        if (s.recovery.active) {
          if (s.recovery.stage == stage) try_rewire(self);
          return;
        }
        if (std::all_of(s.workers.begin(), s.workers.end(), [](const worker_slot& x) { return x.state == "loaded"; })) {
          if (s.setup.options.kv_blocks == 0) size_kv_cache(self);
          start_wiring(self);
        }
      },
      [=](failed_atom, std::int32_t stage, std::int32_t, const std::string& why) {
        auto* slot = slot_for(self, stage, true);
        if (slot == nullptr) return;
        auto& w = *slot;
        w.state = "failed";
        w.detail = why;
        fail_cluster(self, "stage " + std::to_string(stage) + " failed to load: " + why);
      },
      [=](wired_atom, std::int32_t stage, std::int32_t, const std::string& error) {
        auto& s = self->state;
        auto* slot = slot_for(self, stage, true);  // sent as the worker from its wiring thread
        if (slot == nullptr) return;
        auto& w = *slot;
        if (!error.empty()) {
          w.state = "failed";
          w.detail = error;
          fail_cluster(self, "stage " + std::to_string(stage) + " could not wire to its neighbours: " + error);
          return;
        }
        if (s.recovery.active) {
          if (s.recovery.wiring && --s.recovery.wired_pending == 0) finish_recovery(self);
          return;
        }
        w.state = "wired";
        if (std::all_of(s.workers.begin(), s.workers.end(), [](const worker_slot& x) { return x.state == "wired"; })) {
          start_canary(self);
        }
      },
      [=](done_atom, std::uint64_t microbatch, std::uint64_t step, const std::vector<std::int32_t>& tokens) {
        auto& s = self->state;
        // Only the last stage samples tokens.
        if (slot_for(self, static_cast<std::int32_t>(s.workers.size()) - 1, true) == nullptr) return;
        if (!s.failure.empty() || microbatch >= static_cast<std::uint64_t>(s.sched->chunks())) return;
        // A step planned before a stage was replaced is stale: its sequences re-prefill instead.
        if (!s.sched->in_flight(static_cast<int>(microbatch)) || s.step_of[microbatch] != step) return;
        const bool ahead = s.sched->ahead(static_cast<int>(microbatch));
        s.sched->complete(static_cast<int>(microbatch), tokens);
        if (ahead) s.step_of[microbatch] = s.ahead_step_of[microbatch];  // the queued step is in flight now
        pump(self);
      },
      [=](step_fail_atom, std::int32_t stage, std::uint64_t microbatch, std::uint64_t step, const std::string& why) {
        auto& s = self->state;
        if (slot_for(self, stage, true) == nullptr || !s.failure.empty()) return;
        if (microbatch == whole_stage || microbatch >= static_cast<std::uint64_t>(s.sched->chunks())) {
          // A neighbour lost its peer: the dead stage's own loss (down message or heartbeat) decides.
          if (s.recovery.active) return;
          if (!s.setup.options.recover_stages) {
            fail_cluster(self, why + " (stage recovery is off: cluster.recover_stages = false)");
            return;
          }
          if (s.suspect.empty()) {
            s.suspect = why;
            self->delayed_send(self, s.setup.options.heartbeat_timeout + s.setup.options.heartbeat, suspect_atom::value);
          }
          return;
        }
        if (s.sched->in_flight(static_cast<int>(microbatch)) && s.step_of[microbatch] == step) {
          s.sched->fail_step(static_cast<int>(microbatch), make_error(errc::internal, why));  // and its queued step
          if (s.queued && s.owes_successor[microbatch]) {
            s.owes_successor[microbatch] = false;
            send_qstep(self, static_cast<int>(microbatch), qstep_mode::flush, {});  // drop what the stage holds
          }
        }
        pump(self);
      },
      [=](reset_done_atom, std::int32_t stage, std::uint64_t number) {
        auto& r = self->state.recovery;
        if (slot_for(self, stage, true) == nullptr || !r.active || number != r.number || r.resets_pending == 0) return;
        --r.resets_pending;
        try_rewire(self);
      },
      [=](recovery_deadline_atom, std::uint64_t number) {
        auto& s = self->state;
        if (self->current_sender() != self->ctrl() || !s.recovery.active || s.recovery.number != number) return;
        fail_cluster(self, "stage " + std::to_string(s.recovery.stage) + " did not come back within " +
                               std::to_string(s.setup.options.startup_timeout.count()) +
                               " s of its restart (serving.startup_timeout_s)");
      },
      [=](suspect_atom) {
        auto& s = self->state;
        if (self->current_sender() != self->ctrl() || s.suspect.empty() || s.recovery.active) return;
        fail_cluster(self, s.suspect);  // no stage was found dead: the report stands on its own
      },
      [=](frontend_atom, const frontend_call_ptr& call) { handle_frontend(self, call); },
      // Timers are our own messages; anyone else's copy is dropped.
      [=](tick_atom) {
        if (self->current_sender() == self->ctrl()) heartbeat(self);
      },
      [=](policy_tick_atom) {
        if (self->current_sender() != self->ctrl()) return;
        pump(self);  // next_step ticks the scheduler's clock
        self->delayed_send(self, self->state.sched->tick_period(), policy_tick_atom::value);
      },
      [=](shutdown_atom, const std::string& token) {
        auto& s = self->state;
        // The cluster port is reachable by other processes: only the owner of the token stops us.
        if (token != s.setup.options.token) return;
        s.failure = s.failure.empty() ? "the server is shutting down" : s.failure;
        s.sched->fail_all(make_error(errc::internal, "the server is shutting down"));
        for (auto& w : s.workers) {
          if (w.handle) self->send(w.handle, stop_atom::value);
        }
        self->quit();
      },
  };
}

}  // namespace

caf::actor spawn_coordinator(caf::actor_system& sys, coordinator_setup setup) {
  return sys.spawn(coordinator_impl, std::move(setup));
}

}  // namespace conveyor::coordinator
