// The progress thread: creates the UCX context and worker, runs posted commands, progresses UCX, and
// sleeps on the worker's event fd when idle (after a short spin, see ucx_config::busy_poll). Caller
// threads share the worker with it through ucx_mu_ (ucx_worker.hpp says why).
#include "ucx_worker.hpp"

#include <linux/futex.h>
#include <sys/epoll.h>
#include <sys/syscall.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <ctime>
#include <chrono>
#include <cstdio>
#include <thread>
#include <future>
#include <random>

#include "channel_core.hpp"

namespace conveyor::transport {
namespace {

std::string tls_for(const std::string& tls) {
  // "self" is added so that a worker can also reach itself (loopback tests, one-process pipelines).
  if (tls == "tcp") return "tcp,self";
  if (tls == "shm") return "posix,sysv,cma,self";
  return tls;
}

error ucs_error(const char* what, ucs_status_t st) {
  return make_error(errc::internal, std::string(what) + ": " + ucs_status_string(st));
}

}  // namespace

bool ucx_worker::peer_failure_detectable() const {
  if (config_.tls == "auto") return true;
  std::string t = tls_for(config_.tls);
  for (const char* net : {"tcp", "rc", "ud", "dc", "ib", "all"}) {
    if (t.find(net) != std::string::npos) return true;
  }
  return false;
}

ucx_worker::ucx_worker(const ucx_config& config)
    : config_(config), pool_(std::make_shared<buffer_pool>(config.max_pooled_bytes)) {
  // Keepalive runs inside ucp_worker_progress and heartbeats in tick(), so the worker must be
  // progressed and ticked at least this often, even when idle.
  auto ms = std::max<std::int64_t>(1, std::min<std::int64_t>(100, config.keepalive_interval.count() / 4));
  ms = std::min<std::int64_t>(ms, std::max<std::int64_t>(1, config.peer_timeout.count() / 8));
  tick_interval_ = std::chrono::milliseconds(ms);
  std::random_device rd;
  instance_ = (static_cast<std::uint64_t>(rd()) << 32) ^ rd() ^ static_cast<std::uint64_t>(::getpid());
}

result<std::shared_ptr<ucx_worker>> ucx_worker::start(const ucx_config& config) {
  for (char c : config.tls + config.net_devices) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == ',' || c == '_' || c == '^' || c == ':' || c == '-')) {
      return make_error(errc::invalid_argument, "ucx config: tls/net_devices may hold only names and commas, got '" +
                                                    config.tls + "' / '" + config.net_devices + "'");
    }
  }
  std::shared_ptr<ucx_worker> w(new ucx_worker(config));
  std::promise<status> started;
  auto fut = started.get_future();
  w->thread_ = std::thread([raw = w.get(), &started] { raw->run(&started); });
  status st = fut.get();
  if (!st.ok()) {
    w->thread_.join();
    return st.err();
  }
  return w;
}

ucx_worker::~ucx_worker() {
  if (thread_.joinable()) {
    stop_ = true;
    post([] {});
    thread_.join();
  }
}

status ucx_worker::init_ucx() {
  ucp_config_t* cfg = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &cfg);
  if (st != UCS_OK) return ucs_error("ucp_config_read", st);
  // ucp_config_read has already taken UCX_TLS etc. from the environment; the config overrides them.
  std::string interval = std::to_string(config_.keepalive_interval.count()) + "ms";
  struct setting {
    const char* name;
    std::string value;
  };
  std::vector<setting> settings = {{"KEEPALIVE_INTERVAL", interval}};
  if (config_.tls != "auto") settings.push_back({"TLS", tls_for(config_.tls)});
  if (config_.net_devices != "all") settings.push_back({"NET_DEVICES", config_.net_devices});
  for (const auto& s : settings) {
    st = ucp_config_modify(cfg, s.name, s.value.c_str());
    if (st != UCS_OK) {
      ucp_config_release(cfg);
      return make_error(errc::invalid_argument,
                        "ucx config: UCX rejected " + std::string(s.name) + "=" + s.value + ": " + ucs_status_string(st));
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  st = ucp_init(&params, cfg, &context_);
  ucp_config_release(cfg);
  if (st != UCS_OK) {
    return make_error(errc::invalid_argument, "ucx: cannot initialise with tls '" + config_.tls +
                                                  "': " + ucs_status_string(st));
  }
  ucp_context_attr_t ca{};
  ca.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  st = ucp_context_query(context_, &ca);
  if (st != UCS_OK) return ucs_error("ucp_context_query", st);
  memory_types_ = ca.memory_types;
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  // One thread at a time (ucx_mu_), but not always the same one: callers send and progress too.
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  st = ucp_worker_create(context_, &wp, &worker_);
  if (st != UCS_OK) return ucs_error("ucp_worker_create", st);

  ucp_worker_attr_t attr{};
  attr.field_mask = UCP_WORKER_ATTR_FIELD_ADDRESS | UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER;
  st = ucp_worker_query(worker_, &attr);
  if (st != UCS_OK) return ucs_error("ucp_worker_query", st);
  auto* bytes = reinterpret_cast<const std::byte*>(attr.address);
  address_.assign(bytes, bytes + attr.address_length);
  ucp_worker_release_address(worker_, attr.address);
  max_am_header_ = attr.max_am_header;

  for (unsigned id : {wire::am_hello, wire::am_frame, wire::am_header, wire::am_bye, wire::am_heartbeat}) {
    ucp_am_handler_param_t hp{};
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                    UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    hp.id = id;
    hp.flags = UCP_AM_FLAG_WHOLE_MSG;
    hp.cb = &ucx_worker::on_am;
    // UCX passes no AM id to the callback, so each handler's arg carries (worker, id).
    hp.arg = new std::pair<ucx_worker*, unsigned>(this, id);  // freed in shutdown_ucx
    st = ucp_worker_set_am_recv_handler(worker_, &hp);
    if (st != UCS_OK) return ucs_error("ucp_worker_set_am_recv_handler", st);
    handler_args_.push_back(static_cast<std::pair<ucx_worker*, unsigned>*>(hp.arg));
  }

  int efd = -1;
  st = ucp_worker_get_efd(worker_, &efd);
  if (st != UCS_OK) return ucs_error("ucp_worker_get_efd", st);
  command_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (command_fd_ < 0 || epoll_fd_ < 0) return make_error(errc::io, "ucx worker: cannot create eventfd/epoll");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = efd;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, efd, &ev);
  ev.data.fd = command_fd_;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, command_fd_, &ev);

  char* buf = nullptr;
  std::size_t len = 0;
  if (FILE* f = ::open_memstream(&buf, &len)) {
    ucp_context_print_info(context_, f);
    std::fclose(f);
    describe_.assign(buf, len);
    std::free(buf);
  }
  return ok_status();
}

void ucx_worker::shutdown_ucx() {
  std::vector<std::shared_ptr<channel_core>> open;
  for (auto& [id, core] : channels_) open.push_back(core);
  for (auto& core : open) core->close();  // close() unregisters, so not while iterating the map
  // Give flush-mode closes a moment to finish; a dead peer cannot hold shutdown longer than that.
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (closing_eps_ > 0 && std::chrono::steady_clock::now() < until) ucp_worker_progress(worker_);
  channels_.clear();
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  if (context_ != nullptr) ucp_cleanup(context_);
  for (auto* a : handler_args_) delete a;
  if (command_fd_ >= 0) ::close(command_fd_);
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
}

void ucx_worker::wake() {
  std::uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(command_fd_, &one, sizeof one);
}

void ucx_worker::post(std::function<void()> fn) {
  {
    std::lock_guard lock(commands_mu_);
    commands_.push_back(std::move(fn));
    has_commands_.store(true, std::memory_order_release);
  }
  // While the thread spins it sees the queue anyway; the eventfd write (a syscall) only when it sleeps.
  if (sleeping_.load()) wake();
}

ucx_worker::worker_lock::worker_lock(ucx_worker& w) : w_(w) {
  assert(std::this_thread::get_id() != w_.thread_.get_id() && "worker_lock on the progress thread deadlocks");
  // A free lock is just taken. A held one is announced first, so its holder lets go soon: a
  // spinning receiver between two passes, the progress thread at its next turn.
  if (w_.ucx_mu_.try_lock()) return;
  announced_ = true;
  w_.want_.fetch_add(1, std::memory_order_acq_rel);
  w_.ucx_mu_.lock();
}

ucx_worker::worker_lock::~worker_lock() {
  // Requests this caller left pending (a rendezvous send, a large receive) need progress after it
  // goes: asleep, the progress thread would wake only on the next network event, and stepped aside
  // for spinners only after a window with none (a caller that spins on receives keeps it aside).
  const bool pending = w_.outstanding_ > 0;
  w_.ucx_mu_.unlock();
  if (announced_) w_.want_.fetch_sub(1, std::memory_order_acq_rel);
  if (pending) w_.take_over_now();
}

void ucx_worker::take_over_now() {
  spinner_quit_.store(true, std::memory_order_release);
  if (sleeping_.load()) {
    wake();  // asleep in epoll: the command fd
  } else {
    ::syscall(SYS_futex, reinterpret_cast<int*>(&spin_seen_), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
  }
}

void ucx_worker::maybe_tick() {
  auto now = std::chrono::steady_clock::now();
  if (now - last_tick_ < tick_interval_) return;
  last_tick_ = now;
  std::vector<std::shared_ptr<channel_core>> open;
  for (auto& [id, core] : channels_) open.push_back(core);
  for (auto& core : open) core->tick(now);  // tick may close (and unregister) a channel
}

bool ucx_worker::spin_progress(spin_until done, wait_limit& limit,
                               std::chrono::microseconds budget) {
  bool counting = false;
  clock::time_point until;
  for (;;) {
    {
      // Up to 64 passes under one lock (a lock and unlock per pass was a good part of a pass, and a
      // pass is how late a spinner sees its frame), but none more once another caller waits for
      // the lock (a sender on another thread): it gets the worker between two passes.
      if (!ucx_mu_.try_lock()) {
        // Held: announced as worker_lock does, since the progress thread lets go between its turns
        // only for an announced caller (or a spinner it has seen). Taken unannounced, a receive
        // waited for ever behind a progress thread turning on ucp_worker_arm's UCS_ERR_BUSY after
        // a shared-memory peer died (session 10: hung 18 minutes under CPU load).
        want_.fetch_add(1, std::memory_order_acq_rel);
        ucx_mu_.lock();
        want_.fetch_sub(1, std::memory_order_acq_rel);
      }
      std::lock_guard lock(ucx_mu_, std::adopt_lock);
      for (int k = 0; k < 64; ++k) {
        // Callers that spin back to back keep the progress thread aside; heartbeats must not stop
        // then. Looked at every 64th pass only: reading the clock costs as much as a pass.
        if ((++caller_passes_ & 63) == 0) maybe_tick();
        // Posted commands (a connect, a close) must not wait for a spinning caller to stop: while
        // callers spin back to back the progress thread stays aside, so they run them.
        drain_commands();
        ucp_worker_progress(worker_);
        if (outstanding_ > 0 && sleeping_.load(std::memory_order_relaxed)) wake();
        if (done()) return true;
        if (want_.load(std::memory_order_relaxed) != 0) break;
      }
    }
    // Let the waiting caller in before taking the lock again (std::mutex is not fair).
    while (want_.load(std::memory_order_relaxed) != 0) {
      if (done()) return true;
      __builtin_ia32_pause();
    }
    mark_spinning();  // the progress thread may have cleared it since: it must stay aside a window more
    const auto now = clock::now();
    if (!counting) {
      until = std::min(limit.resolve(now), now + budget);
      counting = true;
    }
    if (now >= until) return false;
  }
}

void ucx_worker::run_sync(std::function<void()> fn) {
  assert(std::this_thread::get_id() != thread_.get_id() && "run_sync from the progress thread deadlocks");
  std::promise<void> done;
  auto fut = done.get_future();
  post([&] {
    fn();
    done.set_value();
  });
  fut.wait();
}

void ucx_worker::drain_commands() {
  // Checked without the mutex: the spinning loop calls this every turn, and mostly there is nothing.
  if (!has_commands_.load(std::memory_order_acquire)) return;
  {
    std::lock_guard lock(commands_mu_);
    drained_.swap(commands_);
    has_commands_.store(false, std::memory_order_relaxed);
  }
  for (auto& fn : drained_) fn();
  drained_.clear();
}

void ucx_worker::run(std::promise<status>* started) {
  status st = init_ucx();
  if (!st.ok()) {
    shutdown_ucx();
    started->set_value(st);
    return;
  }
  started->set_value(ok_status());
  using std::chrono::steady_clock;
  const int sleep_ms = static_cast<int>(tick_interval_.count());
  // How long the thread steps aside for spinning callers before it looks again: bounded by the
  // spin itself, and small enough that a receiver that stopped spinning is served soon.
  const long spinner_wait_ns = std::clamp<long>(static_cast<long>(config_.busy_poll.count()) * 1000, 20'000, 200'000);
  auto last_active = steady_clock::now();
  std::unique_lock lock(ucx_mu_, std::defer_lock);
  while (!stop_.load(std::memory_order_relaxed)) {
    // take_over_now: whoever spun before, the worker is ours now (a caller still spinning sets the
    // flag again within a batch of passes).
    if (spinner_quit_.exchange(false, std::memory_order_acq_rel)) spin_seen_.store(0, std::memory_order_relaxed);
    if (spin_seen_.load(std::memory_order_relaxed) != 0) {
      // Callers spin on the worker and progress it meanwhile (a receive, frame after frame): step
      // aside, asleep, for a whole window, and take over only once a window has passed with no
      // spinner, or when one gives up (take_over_now wakes us). The thread touches neither the
      // worker nor any line a spinner writes per frame while it sleeps: waiting on the spinner
      // count itself returned at once whenever it changed (every half microsecond in a ping-pong),
      // and the loop that followed took the worker lock and progressed UCX in the gaps, pulling the
      // worker's lines to this core and back for every frame.
      if (lock.owns_lock()) lock.unlock();
      spin_seen_.store(0, std::memory_order_relaxed);
      timespec ts{0, spinner_wait_ns};
      ::syscall(SYS_futex, reinterpret_cast<int*>(&spin_seen_), FUTEX_WAIT_PRIVATE, 0, &ts, nullptr, 0);
      last_active = steady_clock::now();
      continue;
    }
    if (want_.load(std::memory_order_acquire) > 0) {
      // A caller wants the lock for a send: it holds it for one call, so just let it in.
      if (lock.owns_lock()) lock.unlock();
      std::this_thread::yield();
      last_active = steady_clock::now();
      continue;
    }
    if (!lock.owns_lock()) lock.lock();
    drain_commands();
    maybe_tick();
    // Bounded: a long stream of data keeps progress returning non-zero, and ticks (heartbeats, the
    // dead-peer check) and stepping aside for callers must still happen in between.
    unsigned n = 0;
    while (n < 64 && ucp_worker_progress(worker_) != 0) ++n;
    auto now = steady_clock::now();
    if (n != 0) {
      last_active = now;
      continue;
    }
    if (now - last_active < (outstanding_ > 0 ? std::max(config_.busy_poll, config_.transfer_poll) : config_.busy_poll)) {
      continue;
    }
    if (ucp_worker_arm(worker_) == UCS_ERR_BUSY) continue;
    sleeping_.store(true);  // before the queue check: a post() after it sees the flag and wakes us
    {
      std::lock_guard commands_lock(commands_mu_);
      if (!commands_.empty()) {
        sleeping_.store(false);
        continue;
      }
    }
    // Callers may use the worker while this thread sleeps. Whatever they consume after the arm,
    // the event fd stays readable until the next arm, so no wake-up is lost; requests they leave
    // pending wake this thread through command_fd_ (worker_lock).
    lock.unlock();
    epoll_event events[2];
    int k = ::epoll_wait(epoll_fd_, events, 2, sleep_ms);
    sleeping_.store(false);
    for (int i = 0; i < k; ++i) {
      if (events[i].data.fd == command_fd_) {
        std::uint64_t v;
        [[maybe_unused]] auto r = ::read(command_fd_, &v, sizeof v);
      }
    }
    last_active = steady_clock::now();
  }
  if (!lock.owns_lock()) lock.lock();
  drain_commands();
  shutdown_ucx();
}

bool ucx_worker::add_channel(std::shared_ptr<channel_core> core) {
  auto id = core->id();
  if (!channels_.emplace(id, core).second) return false;
  if (auto it = early_hellos_.find(id); it != early_hellos_.end()) {
    auto [pre, bytes] = std::move(it->second);
    early_hellos_.erase(it);
    core->on_hello(pre, bytes);
  }
  return true;
}

void ucx_worker::remove_channel(std::uint64_t id) { channels_.erase(id); }

void ucx_worker::close_ep(ucp_ep_h ep, bool force, std::shared_ptr<channel_core> keep_alive) {
  struct closing {
    ucx_worker* w;
    std::shared_ptr<channel_core> core;
  };
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  rp.cb.send = [](void* request, ucs_status_t, void* user_data) {
    auto* c = static_cast<closing*>(user_data);
    --c->w->closing_eps_;
    c->w->request_done();
    delete c;
    ucp_request_free(request);
  };
  auto* c = new closing{this, std::move(keep_alive)};
  rp.user_data = c;
  if (force) {
    rp.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
    rp.flags = UCP_EP_CLOSE_FLAG_FORCE;
  }
  ucs_status_ptr_t req = ucp_ep_close_nbx(ep, &rp);
  if (req == nullptr || UCS_PTR_IS_ERR(req)) {
    delete c;
    return;
  }
  ++closing_eps_;
  request_started();
}

ucs_status_t ucx_worker::on_am(void* arg, const void* header, std::size_t header_length, void* data,
                               std::size_t length, const ucp_am_recv_param_t* param) {
  auto* a = static_cast<std::pair<ucx_worker*, unsigned>*>(arg);
  return a->first->dispatch(a->second, header, header_length, data, length, param);
}

ucs_status_t ucx_worker::dispatch(unsigned id, const void* header, std::size_t header_length, void* data,
                                  std::size_t length, const ucp_am_recv_param_t* param) {
  auto pre = wire::read_preamble(header, header_length);
  // A message without our preamble is not from a Conveyor peer; the only safe answer is to drop it
  // (and fail a rendezvous sender, which then learns why).
  if (!pre) return (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) ? UCS_ERR_INVALID_PARAM : UCS_OK;
  auto inline_bytes = std::span<const std::byte>(static_cast<const std::byte*>(header) + sizeof(wire::preamble),
                                                 header_length - sizeof(wire::preamble));
  auto it = channels_.find(pre->channel_id);
  if (id == wire::am_hello) {
    if (it == channels_.end()) {
      if (early_hellos_.size() < 1024) {
        early_hellos_[pre->channel_id] = {*pre, std::vector<std::byte>(inline_bytes.begin(), inline_bytes.end())};
      }
      return UCS_OK;
    }
    it->second->on_hello(*pre, inline_bytes);
    return UCS_OK;
  }
  if (it == channels_.end()) {
    return (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) ? UCS_ERR_NOT_CONNECTED : UCS_OK;
  }
  switch (id) {
    case wire::am_frame: return it->second->on_frame(*pre, header, header_length, data, length, param);
    case wire::am_header: return it->second->on_separate_header(*pre, data, length, param);
    case wire::am_bye: it->second->on_bye(); return UCS_OK;
    case wire::am_heartbeat: it->second->on_heartbeat(*pre); return UCS_OK;
    default: return UCS_OK;
  }
}

}  // namespace conveyor::transport
