#pragma once
// One UCX context and worker, driven by its own progress thread, and the channels made from it.
// main() builds one per process and passes it down (no singletons).
#include <cstddef>
#include <memory>
#include <vector>

#include "conveyor/base/result.hpp"
#include "conveyor/transport/channel.hpp"
#include "conveyor/transport/config.hpp"

namespace conveyor::transport {

/// A worker address: opaque bytes that the control plane carries to peers.
using worker_address = std::vector<std::byte>;

class ucx_worker;  // private: src/ucx_worker.hpp

/// Owns the UCX context, the worker and its progress thread. UCX calls are serialised by one lock:
/// the progress thread keeps the worker going (sends in flight, heartbeats, frames nobody waits for),
/// and a caller that is about to wait anyway (channel::receive, send_handle::wait) progresses it
/// itself for ucx_config::busy_poll first, so a small frame crosses no thread on either side.
/// channel::send posts its frame from the calling thread (non-blocking; the lock is held for one
/// call). Actor threads never wait on a channel (DESIGN.md), so they never spin here either.
class ucx_context {
 public:
  /// Reads the UCX configuration, applies `config` over it, and starts the progress thread.
  static result<std::unique_ptr<ucx_context>> create(const ucx_config& config);
  ~ucx_context();
  ucx_context(const ucx_context&) = delete;
  ucx_context& operator=(const ucx_context&) = delete;

  /// This worker's address, for peers' connect().
  const worker_address& address() const;
  /// Opens a channel to the worker at `peer`. Both ends call connect() with each other's address
  /// and the same `options.channel_id`; it returns once the peer's hello arrived and its schema
  /// version matched, or fails at `options.connect_timeout`.
  result<std::unique_ptr<channel>> connect(const worker_address& peer, const channel_options& options);
  /// The UCX transports the worker actually uses, for logs and benchmarks (e.g. "tcp", "posix").
  std::string describe() const;
  /// Whether this UCX reports CUDA memory among its memory types: then a payload_view marked
  /// memory_type::cuda is sent straight from device memory; otherwise such a send is refused and
  /// callers stage through pinned host buffers (staging_pool). Debian's UCX 1.13: false.
  bool device_memory() const;

 private:
  explicit ucx_context(std::shared_ptr<ucx_worker> worker);
  std::shared_ptr<ucx_worker> worker_;
};

}  // namespace conveyor::transport
