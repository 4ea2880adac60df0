#include "conveyor/stage/hop_meter.hpp"

#include <algorithm>

namespace conveyor::stage {

namespace {
using steady = std::chrono::steady_clock;
}  // namespace

const std::vector<double>& hop_latency_bounds() {
  static const std::vector<double> bounds{1e-5,   2.5e-5, 5e-5,  1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3,
                                          5e-3,   1e-2,   2.5e-2, 5e-2, 0.1,    0.25, 0.5,  1.0};
  return bounds;
}

hop_meter::hop_meter() : counts_(hop_latency_bounds().size() + 1, 0) {}

hop_meter::~hop_meter() { stop(); }

void hop_meter::sent(transport::send_handle handle, std::size_t bytes, steady::time_point issued) {
  ++frames_sent_;
  bytes_sent_ += static_cast<std::int64_t>(bytes);
  // A send that completed inside send() (a small frame UCX finished in the call) carries no stamp:
  // its completion was before now, within the send call, so now is its completion to well under the
  // smallest bucket (10 us).
  const bool completed_in_call = handle.done() && !handle.completed_at();
  const auto now = completed_in_call ? steady::now() : steady::time_point{};
  std::lock_guard lock(mu_);
  if (stopping_) return;
  if (completed_in_call) {
    if (handle.wait(now).ok()) record(std::chrono::duration<double>(now - issued).count());
  } else {
    pending_.push_back({std::move(handle), issued});
  }
  collect();
}

void hop_meter::record(double s) const {
  const auto& b = hop_latency_bounds();
  ++counts_[static_cast<std::size_t>(std::lower_bound(b.begin(), b.end(), s) - b.begin())];
  sum_s_ += s;
}

void hop_meter::received(std::size_t bytes) {
  ++frames_received_;
  bytes_received_ += static_cast<std::int64_t>(bytes);
}

hop_counters hop_meter::read() const {
  hop_counters c;
  c.frames_sent = frames_sent_.load();
  c.bytes_sent = bytes_sent_.load();
  c.frames_received = frames_received_.load();
  c.bytes_received = bytes_received_.load();
  std::lock_guard lock(mu_);
  collect();
  c.sends_in_flight = static_cast<int>(pending_.size());
  c.latency_counts = counts_;
  c.latency_sum_s = sum_s_;
  return c;
}

void hop_meter::stop() {
  std::lock_guard lock(mu_);
  stopping_ = true;
  pending_.clear();
}

// The transport stamps a send's completion when it completes it, so a latency is exact however late
// it is collected, and sends are timed in whatever order they complete.
void hop_meter::collect() const {
  for (auto it = pending_.begin(); it != pending_.end();) {
    const auto completed = it->handle.completed_at();
    if (!completed) {
      ++it;
      continue;
    }
    // A failed send (the channel broke) is no latency; the stage reports the failure itself. wait()
    // on a completed send returns its status at once and never touches the channel.
    if (it->handle.wait(steady::now()).ok()) record(std::chrono::duration<double>(*completed - it->issued).count());
    it = pending_.erase(it);
  }
}

}  // namespace conveyor::stage
