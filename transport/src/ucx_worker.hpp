#pragma once
// The UCX context + worker and the progress thread that owns them (private to transport/).
// Every ucp_* call runs on that thread: other threads post closures to it.
#include <ucp/api/ucp.h>

#include <atomic>
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
#include "wire.hpp"

namespace conveyor::transport {

class channel_core;

class ucx_worker {
 public:
  /// Starts the progress thread, which creates the UCX objects; fails if UCX refuses the config.
  static result<std::shared_ptr<ucx_worker>> start(const ucx_config& config);
  ~ucx_worker();

  const worker_address& address() const { return address_; }
  std::uint64_t instance() const { return instance_; }
  std::size_t max_am_header() const { return max_am_header_; }
  const ucx_config& config() const { return config_; }
  std::string describe() const { return describe_; }
  /// Receive buffers shared by this worker's channels.
  const std::shared_ptr<buffer_pool>& pool() const { return pool_; }
  /// Whether the configured transports let UCX detect a dead peer (UCX 1.13: tcp and verbs yes,
  /// shared memory no). Asking for PEER error handling over shared memory only makes UCX log an
  /// error and refuse the endpoint.
  bool peer_failure_detectable() const;

  /// Runs `fn` on the progress thread, soon. Safe from any thread.
  void post(std::function<void()> fn);
  /// Runs `fn` on the progress thread and waits for it. Never call from the progress thread.
  void run_sync(std::function<void()> fn);

  // --- progress thread only ---
  ucp_worker_h handle() const { return worker_; }
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
  std::string describe_;
  int command_fd_ = -1;  // eventfd: wakes the thread when a command is posted
  int epoll_fd_ = -1;

  std::mutex commands_mu_;
  std::deque<std::function<void()>> commands_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> sleeping_{false};  // the thread is (about to be) in epoll_wait: post() must wake it
  std::thread thread_;

  // progress thread only
  std::map<std::uint64_t, std::shared_ptr<channel_core>> channels_;
  /// Hellos that arrived before the local connect() registered their channel (bounded).
  std::map<std::uint64_t, std::pair<wire::preamble, std::vector<std::byte>>> early_hellos_;
  int closing_eps_ = 0;
  std::vector<std::pair<ucx_worker*, unsigned>*> handler_args_;

  friend class channel_core;
};

}  // namespace conveyor::transport
