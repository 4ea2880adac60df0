#pragma once
// A caller's limit on a wait (private to transport/).
#include "conveyor/transport/channel.hpp"

namespace conveyor::transport {

/// How long a caller may wait: an absolute deadline, or a timeout counted from the first time the
/// wait reads the clock. A receive whose frame is already there, or arrives within the spin's first
/// batch of passes, then reads no clock at all (35-40 ns a read on the GPU host, where a small
/// frame's one-way is ~1 us); one that waits longer starts its timeout at most a batch late.
class wait_limit {
 public:
  wait_limit(deadline until) : until_(until) {}  // NOLINT: a deadline is a limit
  static wait_limit within(clock::duration timeout) {
    wait_limit w(deadline{});
    w.timeout_ = timeout;
    w.relative_ = true;
    return w;
  }
  /// The absolute deadline, counting a timeout from `now` if it has not started yet.
  deadline resolve(clock::time_point now) {
    if (relative_) {
      until_ = now + timeout_;
      relative_ = false;
    }
    return until_;
  }
  deadline resolve() { return relative_ ? resolve(clock::now()) : until_; }

 private:
  deadline until_;
  clock::duration timeout_{};
  bool relative_ = false;
};

/// What a spinning caller waits for (channel_core::spin, ucx_worker::spin_progress): a function
/// and the object it reads, called once a progress pass. A std::function cost a construction and a
/// destruction per receive and a call through its invoker per pass; this is two words on the stack.
class spin_until {
 public:
  /// `f` must outlive the spin (a lambda at the call site).
  template <class F>
  explicit spin_until(const F& f) : fn_(&call<F>), arg_(&f) {}
  bool operator()() const { return fn_(arg_); }

 private:
  template <class F>
  static bool call(const void* f) { return (*static_cast<const F*>(f))(); }
  bool (*fn_)(const void*);
  const void* arg_;
};

}  // namespace conveyor::transport
