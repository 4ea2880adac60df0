#pragma once
// The state of one channel, shared by the caller-facing ucx_channel and the progress thread
// (private to transport/). Fields are grouped by which thread may touch them.
#include <ucp/api/ucp.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "conveyor/transport/channel.hpp"
#include "conveyor/transport/config.hpp"
#include "conveyor/transport/ucx_context.hpp"
#include "conveyor/transport/frame_codec.hpp"
#include "send_state.hpp"
#include "wait_limit.hpp"
#include "wire.hpp"

namespace conveyor::transport {

class ucx_worker;

class channel_core : public std::enable_shared_from_this<channel_core> {
 public:
  channel_core(ucx_worker* worker, const channel_options& options);
  std::uint64_t id() const { return options_.channel_id; }
  const channel_options& options() const { return options_; }

  // --- any thread ---
  /// Fails the channel with `why` and closes its endpoint, cancelling every pending operation.
  void abort(error why);
  /// Fails the channel (first reason wins) and wakes every waiter.
  void fail(error why);
  std::optional<error> failure() const;
  /// failure().has_value(), without the lock (checked on every send).
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  /// Waits for the peer's hello; the error says why the channel could not open.
  status wait_open(deadline until);
  result<frame> receive(deadline until);
  /// channel::receive_into: the frame's header is decoded here, on the caller's thread, into `f`'s
  /// own vectors, and `f`'s buffers are kept for the next small frame (next_).
  status receive_into(frame& f, wait_limit limit);
  /// Progresses the worker from this thread until `done()` holds or ucx_config::busy_poll (or
  /// `limit`) passes: a waiter that spins needs no wake-up from the progress thread.
  void spin(spin_until done, wait_limit& limit);
  /// The peer's payload limit from its hello (0 before the hello).
  std::uint64_t peer_max_payload() const;

  // --- under the worker's ucx_mu_ (progress thread, or a caller holding a worker_lock) ---
  status open(const worker_address& peer);
  void on_hello(const wire::preamble& p, std::span<const std::byte> hello_bytes);
  ucs_status_t on_frame(const wire::preamble& p, const void* header, std::size_t header_length, void* data,
                        std::size_t length, const ucp_am_recv_param_t* param);
  ucs_status_t on_separate_header(const wire::preamble& p, void* data, std::size_t length,
                                  const ucp_am_recv_param_t* param);
  void on_bye();
  void on_heartbeat(const wire::preamble& p) {
    if (from_current_peer(p)) heard_ = true;
  }
  /// Sends a heartbeat when the channel was idle, and fails it when the peer went silent.
  void tick(clock::time_point now);
  /// `s` is copied only if UCX keeps a request pending (a shared_ptr copy is two atomic operations,
  /// and a small frame's trip is short enough for a handful of them to show).
  void start_send(const std::shared_ptr<send_handle::state>& s);
  /// start_send for a frame that is whole in `s->inline_frame` (`size` bytes, the payload inline,
  /// ucx_channel::send_inline): the same preamble, sequence number and completion as start_send's
  /// inline case, without the branches of its other cases (a small frame's send is on a ping-pong's
  /// critical path up to the FIFO write).
  void start_inline_send(const std::shared_ptr<send_handle::state>& s, std::size_t size);
  /// Sends a bye (best effort) and closes the endpoint.
  void close();
  /// Starts rendezvous receives that waited for buffer space.
  void pump_deferred();

 private:
  struct partial_frame {
    wire::preamble pre{};
    std::vector<std::byte> header_bytes;
    bool header_ready = false;
    payload_buffer payload;
    bool payload_ready = false;
    std::optional<error> err;
  };
  /// A frame as it arrived: the receiver decodes it (receive_into), on its own thread and outside
  /// both locks.
  struct raw_frame {
    std::vector<std::byte> header_bytes;
    payload_buffer payload;
    std::optional<error> err;  // rejected on arrival (over a limit, malformed, a failed receive)
  };
  struct deferred_rndv {
    std::uint64_t seq;
    void* desc;
    std::size_t length;
  };
  struct recv_context {
    std::shared_ptr<channel_core> core;
    std::uint64_t seq;
    bool header;  // receiving a separate header, not a payload
  };

  partial_frame& partial(const wire::preamble& p);
  void start_rndv(std::uint64_t seq, void* desc, std::size_t length);
  /// Fetches a rendezvous message's `length` bytes (UCX descriptor `desc`) into `into`: a separate
  /// header (`header`) or a payload of frame `seq`; on_recv_done finishes it.
  void recv_rndv(std::uint64_t seq, bool header, void* desc, void* into, std::size_t length);
  void reject(std::uint64_t seq, error why);
  void try_finish(std::uint64_t seq);
  /// Queues a complete frame for receive().
  /// `uncounted`: payload bytes not yet added to buffered_bytes_ (added under the same lock).
  void finish(std::uint64_t seq, std::vector<std::byte> header_bytes, payload_buffer payload,
              std::size_t uncounted = 0);
  /// A small in-order frame straight into next_, reusing its spare buffers; false (nothing done)
  /// when next_ is taken or the frame is not next.
  bool deliver_in_place(std::uint64_t seq, std::span<const std::byte> header, const void* payload, std::size_t size);
  /// A small frame's header and payload into reused buffers (the in-order slot's or an offered frame's).
  void copy_small_frame(std::span<const std::byte> header, const void* payload, std::size_t size,
                        std::vector<std::byte>& header_out, payload_buffer& payload_out);
  void deliver(std::uint64_t seq, raw_frame&& f);
  bool from_current_peer(const wire::preamble& p) const;
  /// The next frame (or the failure) can be delivered; one atomic load (spinning receivers poll it).
  bool frame_ready() const;
  /// Frame next_deliver_ is here (mu_ held).
  bool next_ready() const;
  /// Takes frame next_deliver_ into `f` (mu_ held, next_ready()): its buffers, or the error it was
  /// rejected with.
  std::optional<error> take_next(frame& f);
  /// After frame `seq` is in `f` (taken, or copied straight in): flow control, then the header
  /// decoded on the caller's thread (outside both locks), or the error it was rejected with.
  status finish_receive(frame& f, std::uint64_t seq, std::optional<error> rejected);
  void update_deliverable();
  void post_am(ucp_ep_h ep, unsigned id, const void* header, std::size_t header_length, const void* data, std::size_t length,
               const std::shared_ptr<send_handle::state>& s);
  /// A send whose frame is whole in `frame` (`size` bytes: room for the preamble, then the header
  /// and the payload): its preamble written in front, then one header-only message on ep_.
  void post_inline(const std::shared_ptr<send_handle::state>& s, std::byte* frame, std::size_t size);
  static void on_recv_done(void* request, ucs_status_t st, std::size_t length, void* user_data);
  static void on_send_done(void* request, ucs_status_t st, void* user_data);
  static void on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t st);

  ucx_worker* worker_;
  const channel_options options_;

  // under the worker's ucx_mu_
  ucp_ep_h ep_ = nullptr;
  /// Without UCX error handling, for large payloads, next to a PEER-mode ep_ (open() says why).
  ucp_ep_h bulk_ep_ = nullptr;
  bool closed_ = false;
  /// UCX watches the peer (UCP_ERR_HANDLING_MODE_PEER); false on transports that cannot, where the
  /// heartbeat timeout is the only failure detector.
  bool peer_mode_ = true;
  clock::time_point last_heard_{};
  clock::time_point last_sent_{};
  bool heard_ = false;  // something came from the peer since the last tick (which then reads the clock)
  bool sent_ = false;   // something went to the peer since the last tick
  std::uint64_t next_send_seq_ = 0;
  std::uint64_t peer_instance_ = 0;
  std::map<std::uint64_t, partial_frame> partial_;
  std::deque<deferred_rndv> deferred_;
  /// deferred_ is not empty; read without the worker lock, so receive() takes it only when needed.
  std::atomic<bool> has_deferred_{false};
  /// Sends UCX still owns, so a force close without UCX error handling can fail them itself.
  std::map<send_handle::state*, std::weak_ptr<send_handle::state>> in_flight_;

  // shared, under mu_
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
  std::uint64_t peer_max_payload_ = 0;
  std::optional<error> failure_;
  std::map<std::uint64_t, raw_frame> ready_;  // frames that came out of order
  /// Frame next_deliver_ when next_full_ (it came in order). Otherwise the buffers the last
  /// receive_into swapped out of the caller's frame, which the next small frame is copied into:
  /// no allocation and no pool lock per frame.
  raw_frame next_;
  bool next_full_ = false;
  std::uint64_t next_deliver_ = 0;
  std::uint64_t buffered_bytes_ = 0;  // payload bytes received or being received, not yet taken
  std::atomic<bool> deliverable_{false};
  /// A receiver's frame offered to the callback (receive_into), and whether a frame was copied
  /// into it (set by the callback, cleared by that receiver) with its number.
  frame* waiting_ = nullptr;
  std::atomic<bool> filled_{false};
  std::uint64_t filled_seq_ = 0;
  std::atomic<bool> failed_{false};               // mirrors failure_.has_value()
  std::atomic<std::uint64_t> peer_max_payload_atomic_{0};  // mirrors peer_max_payload_  // mirrors "ready_ holds next_deliver_, or failure_", set under mu_
};

}  // namespace conveyor::transport
