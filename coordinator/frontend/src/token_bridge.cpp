#include "token_bridge.hpp"

namespace conveyor::frontend {

token_bridge::~token_bridge() noexcept = default;

void token_bridge::on_tokens(std::span<const std::int32_t> tokens) {
  std::lock_guard lock(mu_);
  if (detached_ || finished_) return;
  pending_.insert(pending_.end(), tokens.begin(), tokens.end());
  wake_locked();
}

void token_bridge::on_done(result<service::generate_summary> summary) {
  std::lock_guard lock(mu_);
  if (detached_ || finished_) return;
  finished_ = true;
  done_ = std::move(summary);
  wake_locked();
}

void token_bridge::wake_locked() {
  if (waiter_.get() == nullptr) return;  // the kj side is busy sending; it takes() before waiting again
  waiter_->fulfill();
  waiter_ = nullptr;
}

kj::Promise<void> token_bridge::when_ready() {
  std::lock_guard lock(mu_);
  if (!pending_.empty() || done_) return kj::READY_NOW;
  auto paf = kj::newPromiseAndCrossThreadFulfiller<void>();
  waiter_ = kj::mv(paf.fulfiller);
  return kj::mv(paf.promise);
}

token_bridge::batch token_bridge::take() {
  std::lock_guard lock(mu_);
  batch b;
  b.tokens.swap(pending_);
  b.done.swap(done_);
  return b;
}

void token_bridge::detach() {
  std::lock_guard lock(mu_);
  detached_ = true;
  pending_.clear();
  pending_.shrink_to_fit();
  waiter_ = nullptr;
}

}  // namespace conveyor::frontend
