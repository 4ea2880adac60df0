#pragma once
// The transport's side of one send (private to transport/).
#include <atomic>
#include <cassert>
#include <chrono>
#include <optional>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include "compact_header.hpp"
#include "conveyor/transport/channel.hpp"
#include "wire.hpp"

namespace conveyor::transport {

class channel_core;
class ucx_worker;

class send_handle::state {
 public:
  /// AM header bytes (preamble [+ inline header]); UCX 1.13 reads them until the send completes.
  std::vector<std::byte> am_header;
  /// The encoded frame header, after `header_offset` bytes of room where start_send writes the
  /// preamble, so a header that fits in a UCX AM header is sent from here with no copy; kept alive
  /// for the same reason.
  std::vector<std::byte> separate_header;
  std::size_t header_offset = 0;
  /// The payload's bytes were appended to separate_header (wire::flag_payload_inline).
  bool payload_inline = false;
  /// Sent on the channel's bulk endpoint (no UCX error handling: close() fails it itself).
  bool on_bulk_ep = false;
  /// A small frame whole (preamble, header, payload: wire::flag_payload_inline), encoded and
  /// copied straight in (ucx_channel::send_inline) when inline_frame_size != 0; separate_header is
  /// then unused. A vector there cost a zero-filling resize, a copy from the encoder's buffer and
  /// a second resize for the payload per frame (~130 instructions, callgrind).
  static constexpr std::size_t inline_frame_capacity =
      sizeof(wire::preamble) + compact::max_bytes + wire::max_inline_payload;
  alignas(8) std::byte inline_frame[inline_frame_capacity];
  std::size_t inline_frame_size = 0;
  std::vector<std::byte> separate_preamble;
  payload_view payload;
  std::weak_ptr<channel_core> channel;

  /// What one UCX request of this send carries to its completion callback (a send has at most two:
  /// a separate header and the frame).
  struct request_slot {
    state* owner = nullptr;
    ucx_worker* worker = nullptr;
    std::shared_ptr<state> keep;  ///< set while UCX owns the request
    bool pending = false;         ///< UCX returned a request (counted in the worker's outstanding)
  };
  /// The next free slot (under the worker lock, before the request is posted).
  request_slot& request(ucx_worker* w) {
    assert(slots_used_ < 2);
    auto& r = slots_[slots_used_++];
    r.owner = this;
    r.worker = w;
    return r;
  }

  /// Makes a completed state that nobody else holds ready for another send (ucx_channel keeps one
  /// per channel: no allocation per small frame, and separate_header keeps its capacity).
  void reset_for_reuse() {
    assert(done() && slots_[0].keep == nullptr && slots_[1].keep == nullptr);
    am_header.clear();
    separate_header.clear();
    header_offset = 0;
    inline_frame_size = 0;
    payload_inline = false;
    on_bulk_ep = false;
    separate_preamble.clear();
    payload = {};
    // request() sets owner and worker; keep is empty (asserted above).
    slots_[0].pending = slots_[1].pending = false;
    slots_used_ = 0;
    outstanding_ = 0;
    if (!status_.ok()) status_ = ok_status();
    completed_at_ = {};
    done_.store(false, std::memory_order_relaxed);
  }

  /// Called once per UCX request that belongs to this send; the send completes with the last one,
  /// failed if any failed.
  /// Before the first request is posted (the state is not shared with a completer yet).
  void expect(int requests) { outstanding_ = requests; }
  void complete_one(status s);
  /// complete_one(ok) for a request UCX finished inside the posting call (the usual small frame):
  /// the send is still being started under the worker lock and no handle of it has been handed out,
  /// so nobody can wait on it yet, and the lock and wake-up complete_one takes for waiters are not
  /// needed. Completions that come later run under the worker lock too, after this one. No time
  /// stamp either (a clock read is 35-40 ns on the GPU host, a twentieth of a small frame's
  /// one-way): a send this completes is handed out as send_handle::completed(), which has no state.
  void complete_posted_inline() {
    if (--outstanding_ > 0) return;
    done_.store(true, std::memory_order_release);
  }
  /// Completes the send now, failed, whatever UCX still owes: for endpoints without UCX error
  /// handling, whose requests a force close leaves pending forever. Later completions are ignored.
  void fail_now(error why);
  bool done() const { return done_.load(std::memory_order_acquire); }
  /// Completed without an error (status_ is final once done).
  bool succeeded() const { return done() && status_.ok(); }
  /// When it completed; nullopt while it runs. (A send completed inside send() never reaches a
  /// handle: send_handle::completed() stands for it.)
  std::optional<std::chrono::steady_clock::time_point> completed_at() const;
  /// Waits for completion; false on timeout.
  bool wait_until(deadline until);
  status result_status() const;

 private:
  request_slot slots_[2];
  int slots_used_ = 0;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int outstanding_ = 0;
  /// Set (release) once, after status_ and completed_at_, which are not written again: readers
  /// that see it need no lock.
  std::atomic<bool> done_{false};
  std::chrono::steady_clock::time_point completed_at_;
  status status_;
};

}  // namespace conveyor::transport
