#include <cstdlib>

#include "buffer_pool.hpp"
#include "send_state.hpp"
#include "channel_core.hpp"

namespace conveyor::transport {

void payload_buffer::free_deleter::operator()(std::byte* p) const {
  if (pool) {
    pool->give(p, capacity);
  } else {
    std::free(p);
  }
}

payload_buffer::payload_buffer(std::shared_ptr<buffer_pool> pool, std::size_t size) : size_(size) {
  if (size == 0) return;
  // 64-byte alignment: whole cache lines for the kernels, and room for AVX-512 loads.
  std::size_t capacity = buffer_pool::capacity_for(size);
  std::byte* p = pool ? pool->take(capacity) : static_cast<std::byte*>(std::aligned_alloc(64, capacity));
  data_ = std::unique_ptr<std::byte[], free_deleter>(p, free_deleter{std::move(pool), capacity});
}

bool payload_buffer::reuse_for(std::size_t size) {
  if (!data_ || size == 0 || buffer_pool::capacity_for(size) != capacity()) return false;
  size_ = size;
  return true;
}

void send_handle::state::complete_one(status s) {
  {
    std::lock_guard lock(mu_);
    if (done_.load(std::memory_order_relaxed)) return;
    if (!s.ok() && status_.ok()) status_ = std::move(s);
    if (--outstanding_ > 0) return;
    completed_at_ = std::chrono::steady_clock::now();
    done_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
}

void send_handle::state::fail_now(error why) {
  {
    std::lock_guard lock(mu_);
    if (done_.load(std::memory_order_relaxed)) return;
    status_ = std::move(why);
    completed_at_ = std::chrono::steady_clock::now();
    done_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
}

std::optional<std::chrono::steady_clock::time_point> send_handle::state::completed_at() const {
  if (!done()) return std::nullopt;
  return completed_at_;
}

bool send_handle::state::wait_until(deadline until) {
  if (done()) return true;
  std::unique_lock lock(mu_);
  return cv_.wait_until(lock, until, [&] { return done(); });
}

status send_handle::state::result_status() const {
  // Called after done(): status_ is final.
  if (done()) return status_;
  std::lock_guard lock(mu_);
  return status_;
}

bool send_handle::done() const { return completed_ || !state_ || state_->done(); }

std::optional<std::chrono::steady_clock::time_point> send_handle::completed_at() const {
  return state_ ? state_->completed_at() : std::nullopt;
}

status send_handle::wait(deadline until) {
  if (completed_) return ok_status();
  if (!state_) return make_error(errc::invalid_argument, "send_handle: waiting on an empty handle");
  if (!state_->done()) {
    // Spin on the worker first, as receive() does: a send UCX could not finish in the call
    // completes here without a wake-up from the progress thread.
    wait_limit limit(until);
    auto done = [s = state_.get()] { return s->done(); };
    if (auto core = state_->channel.lock()) core->spin(spin_until(done), limit);
  }
  if (state_->wait_until(until)) return state_->result_status();
  // A peer that takes no data before the deadline is treated as dead: failing the channel makes UCX
  // complete (cancel) every request on it, after which the payload is no longer read.
  if (auto core = state_->channel.lock()) {
    core->abort(make_error(errc::io, "channel " + std::to_string(core->id()) +
                                         ": a send missed its deadline; the channel is closed"));
  }
  // Cancellation completes within a progress pass; the bound only guards against a transport bug.
  if (!state_->wait_until(clock::now() + std::chrono::seconds(30))) {
    return make_error(errc::internal, "send_handle: UCX did not cancel a timed-out send within 30 s");
  }
  status s = state_->result_status();
  if (s.ok()) return s;  // it completed just as the deadline passed
  return make_error(errc::io, "send deadline passed: " + s.err().message);
}

}  // namespace conveyor::transport
