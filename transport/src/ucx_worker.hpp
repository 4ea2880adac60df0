#pragma once
// The UCX context + worker and the progress thread that drives them (private to transport/).
// Every ucp_* call and every "worker state" field below happens under `ucx_mu_`. The progress thread
// holds it while it runs; a caller thread may take it too (worker_lock) to send at once, or to
// progress the worker itself while it spins for a frame, instead of handing each small frame to the
// progress thread and back (two cross-thread hand-offs per direction: measured at ~20x
// ucx_perftest's latency over shared memory). The worker is created UCS_THREAD_MODE_SERIALIZED.
#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <string>
#include <vector>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "conveyor/transport/config.hpp"
#include "conveyor/transport/ucx_context.hpp"
#include "buffer_pool.hpp"
#include "wait_limit.hpp"
#include "wire.hpp"

namespace conveyor::transport {

class channel_core;

/// The worker's lock: a spinlock. Its holders keep it briefly (a send, a batch of progress passes,
/// one progress turn of the progress thread), and a small frame's path takes and releases it twice
/// a one-way: a std::mutex cost two locked instructions there, and its unlock, a locked exchange,
/// waited for the FIFO line ucp_am_send_nbx had just written to the peer. Here the release is a
/// plain store; a waiter spins, then yields (never sleeps: there is no futex to wake).
class worker_mutex {
 public:
  bool try_lock() {
    return held_.load(std::memory_order_relaxed) == 0 && held_.exchange(1, std::memory_order_acquire) == 0;
  }
  void lock() {
    for (unsigned spins = 0; !try_lock(); ++spins) {
      if (spins < 256) {
        __builtin_ia32_pause();
      } else {
        std::this_thread::yield();
      }
    }
  }
  void unlock() { held_.store(0, std::memory_order_release); }

 private:
  std::atomic<int> held_{0};
};

class ucx_worker {
 public:
  /// Starts the progress thread, which creates the UCX objects; fails if UCX refuses the config.
  static result<std::shared_ptr<ucx_worker>> start(const ucx_config& config);
  ~ucx_worker();

  const worker_address& address() const { return address_; }
  std::uint64_t instance() const { return instance_; }
  std::size_t max_am_header() const { return max_am_header_; }
  /// Whether this UCX reads and writes CUDA device memory itself (ucp_context_query's memory
  /// types; Debian's UCX 1.13: host only).
  bool device_memory() const { return (memory_types_ & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0; }
  const ucx_config& config() const { return config_; }
  std::string describe() const { return describe_; }
  /// Receive buffers shared by this worker's channels.
  const std::shared_ptr<buffer_pool>& pool() const { return pool_; }
  /// Whether the configured transports let UCX detect a dead peer (UCX 1.13: tcp and verbs yes,
  /// shared memory no). Asking for PEER error handling over shared memory only makes UCX log an
  /// error and refuse the endpoint.
  bool peer_failure_detectable() const;

  /// Runs `fn` under the worker lock soon: on the progress thread, or on a caller that spins on the
  /// worker meanwhile. Safe from any thread.
  void post(std::function<void()> fn);
  /// Holds the worker for a caller thread (never the progress thread, never nested): the progress
  /// thread steps aside at its next loop turn, so the wait is at most one progress pass. While it is
  /// held the caller may use every member marked "under ucx_mu_".
  class worker_lock {
   public:
    explicit worker_lock(ucx_worker& w);
    ~worker_lock();
    worker_lock(const worker_lock&) = delete;
    worker_lock& operator=(const worker_lock&) = delete;

   private:
    ucx_worker& w_;
    bool announced_ = false;  // found the lock taken and told the holder (want_)
  };
  /// Marks a caller thread as spinning on the worker (a receive() in its busy-poll window): the
  /// progress thread stays asleep instead of progressing, so the two do not fight over the lock.
  /// A flag, not a count: setting it is a plain store (and only when the progress thread has
  /// cleared it, once per its look), where a count cost two locked read-modify-writes per received
  /// frame; spin_progress sets it again after every batch of passes, so a long spin keeps the
  /// progress thread asleep window after window.
  class spin_scope {
   public:
    explicit spin_scope(ucx_worker& w) { w.mark_spinning(); }
    // No wake-up call when it ends (a futex wake would cost every received frame a syscall): the
    // progress thread sleeps a window at a time and looks again (run()).
    spin_scope(const spin_scope&) = delete;
    spin_scope& operator=(const spin_scope&) = delete;
  };
  /// Progresses the worker from a caller thread that holds a spin_scope until `done()` (true), or
  /// for `budget` (false; never past `until`). Other callers (a sender) get the worker between two
  /// passes. The budget is counted from the first clock reading, after the first batch of passes:
  /// a frame that is already there, or comes within that batch, costs no clock read (35-40 ns on
  /// the GPU host, where a one-way small frame is ~1 us).
  /// A relative `limit` starts at that first clock reading.
  bool spin_progress(spin_until done, wait_limit& limit, std::chrono::microseconds budget);
  /// The progress thread must take over now, not after its step-aside window: a spinning caller
  /// gives up and is about to block, or a caller left UCX requests pending. Wakes it wherever it
  /// waits (epoll or the step-aside futex). Costs a syscall, so only on those slow paths.
  void take_over_now();
  /// Runs `fn` as post() does and waits for it. Never call under the worker lock.
  void run_sync(std::function<void()> fn);

  // --- under ucx_mu_ (the progress thread, or a caller holding a worker_lock) ---
  ucp_worker_h handle() const { return worker_; }
  /// UCX requests started and not yet completed; a caller that leaves some behind while the
  /// progress thread sleeps wakes it, so they are progressed.
  void request_started() { ++outstanding_; }
  void request_done() { --outstanding_; }
  /// Registers a channel; false if the id is taken.
  bool add_channel(std::shared_ptr<channel_core> core);
  void remove_channel(std::uint64_t id);
  /// Closes `ep` (flushing unless `force`) and keeps `keep_alive` until UCX is done with it.
  void close_ep(ucp_ep_h ep, bool force, std::shared_ptr<channel_core> keep_alive);

 private:
  explicit ucx_worker(const ucx_config& config);
  void run(std::promise<status>* started);
  status init_ucx();
  void shutdown_ucx();
  void drain_commands();
  void wake();
  /// Runs channel ticks when tick_interval_ has passed (under ucx_mu_).
  void maybe_tick();

  static ucs_status_t on_am(void* arg, const void* header, std::size_t header_length, void* data,
                            std::size_t length, const ucp_am_recv_param_t* param);
  ucs_status_t dispatch(unsigned id, const void* header, std::size_t header_length, void* data,
                        std::size_t length, const ucp_am_recv_param_t* param);

  ucx_config config_;
  std::shared_ptr<buffer_pool> pool_;
  std::uint64_t instance_ = 0;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  worker_address address_;
  std::size_t max_am_header_ = 0;
  std::uint64_t memory_types_ = 0;  // bit i: ucs_memory_type_t i
  std::string describe_;
  int command_fd_ = -1;  // eventfd: wakes the thread when a command is posted
  int epoll_fd_ = -1;

  std::mutex commands_mu_;
  std::deque<std::function<void()>> commands_;
  std::atomic<bool> has_commands_{false};
  std::deque<std::function<void()>> drained_;  // progress side of the swap (keeps its memory)
  std::atomic<bool> stop_{false};
  std::atomic<bool> sleeping_{false};  // the thread is (about to be) in epoll_wait: post() must wake it
  std::thread thread_;

  worker_mutex ucx_mu_;           // the worker and everything below
  std::atomic<int> want_{0};      // caller threads waiting for ucx_mu_ (a free lock is taken unannounced)
  /// spin_scope: a caller spins on the worker.
  void mark_spinning() {
    if (spin_seen_.load(std::memory_order_relaxed) == 0) spin_seen_.store(1, std::memory_order_relaxed);
  }
  // Whether a caller has spun since the progress thread last looked (it clears the flag, a spinner
  // sets it). On its own cache line: the progress thread must not share a line that a spinner
  // writes for every frame.
  alignas(64) std::atomic<int> spin_seen_{0};
  std::atomic<bool> spinner_quit_{false};  // take_over_now: take over at once
  alignas(64) int outstanding_ = 0;  // (a new line: the worker state after this is the lock holder's)
  std::chrono::milliseconds tick_interval_{100};
  std::chrono::steady_clock::time_point last_tick_{};
  unsigned caller_passes_ = 0;
  std::map<std::uint64_t, std::shared_ptr<channel_core>> channels_;
  /// Hellos that arrived before the local connect() registered their channel (bounded).
  std::map<std::uint64_t, std::pair<wire::preamble, std::vector<std::byte>>> early_hellos_;
  int closing_eps_ = 0;
  std::vector<std::pair<ucx_worker*, unsigned>*> handler_args_;

  friend class channel_core;
};

}  // namespace conveyor::transport
