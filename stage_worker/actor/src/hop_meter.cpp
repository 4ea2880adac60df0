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

void hop_meter::sent(transport::send_handle handle, std::size_t bytes) {
  ++frames_sent_;
  bytes_sent_ += static_cast<std::int64_t>(bytes);
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    pending_.push_back({std::move(handle), steady::now()});
    if (!thread_.joinable()) thread_ = std::thread([this] { watch(); });
  }
  cv_.notify_one();
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
  c.sends_in_flight = static_cast<int>(pending_.size());
  c.latency_counts = counts_;
  c.latency_sum_s = sum_s_;
  return c;
}

void hop_meter::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void hop_meter::record(double s) {
  const auto& b = hop_latency_bounds();
  const auto i = static_cast<std::size_t>(std::lower_bound(b.begin(), b.end(), s) - b.begin());
  std::lock_guard lock(mu_);
  ++counts_[i];
  sum_s_ += s;
}

// The transport offers done() and a wait() whose deadline closes the channel when it passes, so the
// watcher polls done() instead, sleeping a tenth of the time waited so far (10 µs .. 1 ms): a latency
// is over-measured by at most ~10% or one sleep. It watches the oldest send; one that completed
// before an older one is timed when that one completes (sends on a channel complete nearly in order).
void hop_meter::watch() {
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
    if (stopping_) return;
    pending p = pending_.front();
    lock.unlock();
    while (!p.handle.done()) {
      const auto waited = steady::now() - p.issued;
      const auto nap = std::clamp<steady::duration>(waited / 10, std::chrono::microseconds(10), std::chrono::milliseconds(1));
      std::this_thread::sleep_for(nap);
      std::lock_guard check(mu_);
      if (stopping_) return;
    }
    const double s = std::chrono::duration<double>(steady::now() - p.issued).count();
    // A failed send (the channel broke) is no latency; the stage reports the failure itself. wait()
    // on a completed send returns its status at once and never touches the channel.
    if (p.handle.wait(steady::now()).ok()) record(s);
    lock.lock();
    pending_.pop_front();
  }
}

}  // namespace conveyor::stage
