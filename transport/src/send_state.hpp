#pragma once
// The transport's side of one send (private to transport/).
#include <chrono>
#include <optional>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include "conveyor/transport/channel.hpp"

namespace conveyor::transport {

class channel_core;

class send_handle::state {
 public:
  /// AM header bytes (preamble [+ inline header]); UCX 1.13 reads them until the send completes.
  std::vector<std::byte> am_header;
  /// The encoded frame header, after `header_offset` bytes of room where start_send writes the
  /// preamble, so a header that fits in a UCX AM header is sent from here with no copy; kept alive
  /// for the same reason.
  std::vector<std::byte> separate_header;
  std::size_t header_offset = 0;
  std::vector<std::byte> separate_preamble;
  payload_view payload;
  std::weak_ptr<channel_core> channel;

  /// Called once per UCX request that belongs to this send; the send completes with the last one,
  /// failed if any failed.
  void expect(int requests);
  void complete_one(status s);
  /// Completes the send now, failed, whatever UCX still owes: for endpoints without UCX error
  /// handling, whose requests a force close leaves pending forever. Later completions are ignored.
  void fail_now(error why);
  bool done() const;
  /// When it completed; nullopt while it runs.
  std::optional<std::chrono::steady_clock::time_point> completed_at() const;
  /// Waits for completion; false on timeout.
  bool wait_until(deadline until);
  status result_status() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int outstanding_ = 0;
  bool done_ = false;
  std::chrono::steady_clock::time_point completed_at_;
  status status_;
};

}  // namespace conveyor::transport
