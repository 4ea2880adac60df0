#pragma once
// A channel carries frames (header + tensor payload) between two processes, in order, with many in
// flight. The interface has no UCX in it, so an in-process channel can stand in where one is needed.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "conveyor/base/result.hpp"
#include "conveyor/transport/frame.hpp"

namespace conveyor::transport {

using clock = std::chrono::steady_clock;
using deadline = clock::time_point;

/// A deadline `d` from now.
inline deadline after(clock::duration d) { return clock::now() + d; }

/// Bytes to send; not owned. The memory must stay valid and unchanged until the send completes.
struct payload_view {
  const void* data = nullptr;
  std::size_t size = 0;
  /// `cuda` payloads go straight from device memory where UCX reports CUDA memory
  /// (ucx_context::device_memory); elsewhere (Debian's UCX) they are refused with errc::unsupported
  /// and callers stage device activations through reused pinned host buffers (transport::staging_pool).
  memory_type memory = memory_type::host;
};

class buffer_pool;  // private: src/buffer_pool.hpp

/// A payload received into memory the frame owns (64-byte aligned). Channels take it from a pool
/// and it goes back there when the frame is dropped.
class payload_buffer {
 public:
  payload_buffer() = default;
  explicit payload_buffer(std::size_t size) : payload_buffer(nullptr, size) {}
  /// From `pool` (nullptr: plain allocation).
  payload_buffer(std::shared_ptr<buffer_pool> pool, std::size_t size);
  std::byte* data() { return data_.get(); }
  const std::byte* data() const { return data_.get(); }
  std::size_t size() const { return size_; }
  std::span<const std::byte> bytes() const { return {data_.get(), size_}; }
  /// Bytes the buffer can hold (its size class; 0 when empty).
  std::size_t capacity() const { return data_ ? data_.get_deleter().capacity : 0; }
  /// Makes this buffer `size` bytes long, keeping its memory (contents unspecified); false, and
  /// unchanged, unless it is already allocated in the size class `size` asks for.
  bool reuse_for(std::size_t size);

 private:
  struct free_deleter {
    std::shared_ptr<buffer_pool> pool;
    std::size_t capacity;  // no initializer: GCC rejects defaulted construction of a nested class before its parent is complete
    void operator()(std::byte* p) const;
  };
  std::unique_ptr<std::byte[], free_deleter> data_;
  std::size_t size_ = 0;
};

/// One received frame.
struct frame {
  frame_header header;
  std::vector<std::byte> header_bytes;  ///< the encoded header as received, to forward unchanged
  payload_buffer payload;
};

/// Completion of one send. Shared with the transport, so dropping it does not cancel the send.
class send_handle {
 public:
  /// The transport's side of a send; implementations complete it from whichever thread progresses
  /// their transport (a progress thread, or the waiter itself).
  class state;
  send_handle() = default;
  explicit send_handle(std::shared_ptr<state> s) : state_(std::move(s)) {}
  /// A send that completed, successfully, inside send() (UCX took a small frame in the call): done,
  /// wait() is OK at once, completed_at() nullopt; no state shared with the transport.
  static send_handle completed() {
    send_handle h;
    h.completed_ = true;
    return h;
  }
  /// Waits until the send completes or `until` passes. On a timeout the channel is failed (a peer
  /// that takes no data within a deadline is treated as dead), and wait returns only once the
  /// transport no longer touches the payload: after wait returns, the caller may free it.
  status wait(deadline until);
  /// True when the send has completed (successfully or not).
  bool done() const;
  /// When the send completed (successfully or not), taken by the thread that completed it; nullopt
  /// while it runs, for an empty handle, and for a send that completed inside send() (done() is
  /// then true as send() returns, so the caller's own clock after the call is as exact, and a small
  /// frame does not pay a clock read nobody may ask for).
  std::optional<std::chrono::steady_clock::time_point> completed_at() const;

 private:
  std::shared_ptr<state> state_;
  bool completed_ = false;
};

/// A bidirectional, ordered frame channel to one peer.
class channel {
 public:
  virtual ~channel() = default;
  /// Starts sending a frame. Errors here (bad header, payload/shape mismatch, over the size limit,
  /// a failed channel) mean nothing was sent.
  virtual result<send_handle> send(const frame_header& header, payload_view payload) = 0;
  /// Starts sending a frame whose header is already encoded (e.g. forwarded unchanged from a
  /// received frame). Checked only for size limits: the receiver validates it.
  virtual result<send_handle> send_encoded(std::span<const std::byte> header_bytes, payload_view payload) = 0;
  /// The next frame in send order, or an error: this frame was malformed or over a limit (the channel
  /// stays usable), the deadline passed (no frame yet; the channel stays usable), or the channel
  /// failed (peer died or closed; every later call fails too).
  virtual result<frame> receive(deadline until) = 0;
  /// receive() into `f`, whose buffers (header vectors, header_bytes, payload) the channel may keep
  /// and reuse: a caller that receives frame after frame into the same object then costs no
  /// allocation per small frame. `f`'s previous contents are gone either way (so a send of
  /// `f.payload` or `f.header_bytes` must have completed first); on an error `f` is unspecified (but
  /// valid). Same errors as receive().
  virtual status receive_into(frame& f, deadline until) {
    auto r = receive(until);
    if (!r.ok()) return r.err();
    f = std::move(*r);
    return ok_status();
  }
  /// receive_into() within `timeout`, counted from the moment the wait first needs the clock: a
  /// frame that is already there, or arrives within the first spin, then costs no clock read (a
  /// read is 35-40 ns on the GPU host, a small frame's one-way ~1 us). A frame loop that waits
  /// "up to N seconds for the next frame" uses this.
  virtual status receive_into(frame& f, clock::duration timeout) { return receive_into(f, after(timeout)); }
  /// OK while the channel works; the error that broke it otherwise.
  virtual status health() const = 0;
};

}  // namespace conveyor::transport
