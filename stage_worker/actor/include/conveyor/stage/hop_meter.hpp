#pragma once
// Counts the activation frames a stage sends to the next stage and receives from the previous one,
// and times each send from the moment it is handed to the transport until the transport completes it
// (for frames above UCX's rendezvous threshold: until the next stage has pulled the bytes). Plain
// C++ (no CAF): the stage runtime feeds it, the worker actor reports it to the coordinator.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <vector>

#include "conveyor/transport/channel.hpp"

namespace conveyor::stage {

/// Upper bounds (seconds) of the send-latency histogram buckets; +Inf is implied after the last.
const std::vector<double>& hop_latency_bounds();

/// A snapshot of the counters (since the meter was made).
struct hop_counters {
  std::int64_t frames_sent = 0, bytes_sent = 0;
  std::int64_t frames_received = 0, bytes_received = 0;
  int sends_in_flight = 0;                    ///< handed to the transport, not completed yet
  std::vector<std::uint64_t> latency_counts;  ///< per bucket of hop_latency_bounds(), +Inf last
  double latency_sum_s = 0.0;
};

class hop_meter {
 public:
  hop_meter();
  ~hop_meter();
  hop_meter(const hop_meter&) = delete;
  hop_meter& operator=(const hop_meter&) = delete;

  /// A frame of `bytes` was handed to the transport at `issued` (taken before the send call: a small
  /// frame can complete inside it) and became `handle`.
  void sent(transport::send_handle handle, std::size_t bytes, std::chrono::steady_clock::time_point issued);
  /// A frame of `bytes` payload came from the previous stage.
  void received(std::size_t bytes);
  hop_counters read() const;
  /// Stops timing (sends still pending are left uncounted). Idempotent; the destructor calls it.
  void stop();

 private:
  /// Times every pending send the transport has completed (from the completion time it recorded)
  /// and forgets it. Called with mu_ held, on each send and each read: no thread of its own.
  void collect() const;
  /// One hop latency into the histogram (under mu_).
  void record(double seconds) const;

  struct pending {
    transport::send_handle handle;
    std::chrono::steady_clock::time_point issued;
  };
  mutable std::mutex mu_;
  // Sends not yet seen completed, and the histogram of those that were: a read collects, so these
  // change under a const read (under mu_).
  mutable std::deque<pending> pending_;
  mutable std::vector<std::uint64_t> counts_;
  mutable double sum_s_ = 0.0;
  bool stopping_ = false;  // under mu_
  std::atomic<std::int64_t> frames_sent_{0}, bytes_sent_{0}, frames_received_{0}, bytes_received_{0};
};

}  // namespace conveyor::stage
