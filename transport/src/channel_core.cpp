// One channel's protocol on the progress thread: hello, sends, reassembly of received frames in
// sequence order, flow control of rendezvous receives, and failure.
#include "channel_core.hpp"

#include <cassert>
#include <cstring>
#include <string>

#include "ucx_worker.hpp"

namespace conveyor::transport {
namespace {

/// Payloads from this size on take the bulk endpoint (open() says why); smaller ones are sent
/// eagerly (copied) by UCX either way.
constexpr std::size_t bulk_min_payload = std::size_t{256} << 10;
static_assert(wire::max_inline_payload < bulk_min_payload, "post_inline sends on ep_ only");

std::string name(std::uint64_t id) { return "channel " + std::to_string(id); }

/// A bad frame's error, named (out of line: the strings made every caller save and restore
/// registers for a path small frames never take).
[[gnu::noinline, gnu::cold]] error frame_error(std::uint64_t channel, std::uint64_t seq, const error& why) {
  return make_error(why.code, name(channel) + ", frame " + std::to_string(seq) + ": " + why.message);
}

std::vector<std::byte> preamble_bytes(const wire::preamble& p, std::span<const std::byte> inline_header) {
  std::vector<std::byte> out(sizeof p + inline_header.size());
  std::memcpy(out.data(), &p, sizeof p);
  if (!inline_header.empty()) std::memcpy(out.data() + sizeof p, inline_header.data(), inline_header.size());
  return out;
}

}  // namespace

channel_core::channel_core(ucx_worker* worker, const channel_options& options) : worker_(worker), options_(options) {}

// ---------------------------------------------------------------- any thread

void channel_core::fail(error why) {
  {
    std::lock_guard lock(mu_);
    if (failure_) return;
    failure_ = std::move(why);
    failed_.store(true, std::memory_order_release);
    update_deliverable();
  }
  cv_.notify_all();
}

void channel_core::abort(error why) {
  fail(std::move(why));
  worker_->post([self = shared_from_this()] { self->close(); });
}

std::optional<error> channel_core::failure() const {
  std::lock_guard lock(mu_);
  return failure_;
}

std::uint64_t channel_core::peer_max_payload() const {
  return peer_max_payload_atomic_.load(std::memory_order_acquire);
}

status channel_core::wait_open(deadline until) {
  std::unique_lock lock(mu_);
  if (!cv_.wait_until(lock, until, [&] { return open_ || failure_.has_value(); })) {
    return make_error(errc::io, name(id()) + ": the peer did not answer the hello within " +
                                    std::to_string(options_.connect_timeout.count()) + " ms");
  }
  // Opened and then failed (a quick peer may send, say bye and go before we look): the frames it
  // sent are still delivered, and receive() reports the failure after them.
  if (open_) return ok_status();
  return *failure_;
}

bool channel_core::frame_ready() const { return deliverable_.load(std::memory_order_acquire); }

void channel_core::update_deliverable() {
  // With mu_ held.
  deliverable_.store(next_ready() || failure_.has_value(), std::memory_order_release);
}

void channel_core::spin(spin_until done, wait_limit& limit) {
  {
    ucx_worker::spin_scope spinning(*worker_);
    if (worker_->spin_progress(done, limit, worker_->config().busy_poll)) return;
  }
  worker_->take_over_now();
}

result<frame> channel_core::receive(deadline until) {
  result<frame> f{frame{}};
  CONVEYOR_TRY(receive_into(*f, until));
  return f;
}

status channel_core::receive_into(frame& f, wait_limit limit) {
  // Spin first (ucx_config::busy_poll), progressing the worker from this thread: a frame then goes
  // from UCX's callback to this caller with no thread hand-off, and a condition-variable sleep and
  // wake-up (tens of microseconds, more than a small frame's whole trip over shared memory) is paid
  // only when nothing came within the spin. After it, the progress thread takes over.
  bool offered = false;
  if (!frame_ready()) {
    // Offer `f` to the AM callback first: a small in-order frame is then copied straight into it,
    // and taking it needs neither the channel mutex nor the in-order slot's swap (on the GPU host
    // the take was ~0.2 us of a small frame's ~1.2 us one-way, on its critical path). The offer
    // costs a mutex pair too, but before the frame can arrive, while this thread would only spin.
    {
      std::lock_guard lock(mu_);
      if (waiting_ == nullptr && !next_ready() && !failure_) {
        waiting_ = &f;
        offered = true;
      }
    }
    auto arrived = [this] { return frame_ready() || filled_.load(std::memory_order_acquire); };
    spin(spin_until(arrived), limit);
  }
  std::unique_lock lock(mu_, std::defer_lock);
  if (offered) {
    if (!filled_.load(std::memory_order_acquire)) {
      lock.lock();
      if (waiting_ == &f) waiting_ = nullptr;  // withdrawn: no copy into `f` from here on
    }
    // (Under the lock, a copy that landed just before the withdrawal shows here.)
    if (filled_.load(std::memory_order_acquire)) {
      filled_.store(false, std::memory_order_relaxed);  // only the offering receiver clears it
      if (lock.owns_lock()) lock.unlock();
      return finish_receive(f, filled_seq_, std::nullopt);
    }
  }
  if (!lock.owns_lock()) lock.lock();
  for (;;) {
    if (next_ready()) {
      const std::uint64_t seq = next_deliver_;
      std::optional<error> rejected = take_next(f);
      lock.unlock();
      return finish_receive(f, seq, std::move(rejected));
    }
    // Frames that arrived whole before a failure are still delivered; after them, the failure.
    if (failure_) return *failure_;
    if (cv_.wait_until(lock, limit.resolve()) == std::cv_status::timeout && !next_ready() && !failure_) {
      return make_error(errc::io, name(id()) + ": no frame before the receive deadline");
    }
  }
}

status channel_core::finish_receive(frame& f, std::uint64_t seq, std::optional<error> rejected) {
  // Rendezvous frames may wait for the room this one frees (flow control); only then is the worker
  // needed here.
  if (has_deferred_.load(std::memory_order_acquire)) {
    ucx_worker::worker_lock w(*worker_);
    pump_deferred();
  }
  if (rejected) return *rejected;
  // Decoded here, on the receiver's thread and outside both locks, into the caller's vectors; the
  // payload's size checked against the shape the decode just read.
  status st = decode_frame_header(f.header_bytes, f.payload.size(), f.header, options_.header_limits);
  if (st.ok()) [[likely]] return st;
  return frame_error(id(), seq, st.err());
}

// ---------------------------------------------------------------- under the worker lock

status channel_core::open(const worker_address& peer) {
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.address = reinterpret_cast<const ucp_address_t*>(peer.data());
  // PEER mode: a dead peer fails the endpoint (and every request on it) instead of hanging it.
  ep.err_mode = worker_->peer_failure_detectable() ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
  peer_mode_ = ep.err_mode == UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &channel_core::on_ep_error;
  ep.err_handler.arg = this;  // the worker's channel map keeps this alive while the ep exists
  ucs_status_t st = ucp_ep_create(worker_->handle(), &ep, &ep_);
  if (st == UCS_ERR_UNREACHABLE && peer_mode_) {
    // UCX 1.13's shared-memory transports cannot detect a dead peer, so PEER mode refuses them;
    // fall back to no UCX error handling and rely on heartbeats (ucx_config::peer_timeout).
    ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    peer_mode_ = false;
    st = ucp_ep_create(worker_->handle(), &ep, &ep_);
  }
  if (st != UCS_OK) {
    ep_ = nullptr;
    return make_error(errc::io, name(id()) + ": cannot reach the peer's worker address: " + ucs_status_string(st));
  }
  if (peer_mode_) {
    // Large payloads go through a second endpoint without UCX error handling: with PEER mode,
    // UCX 1.13 disables its zero-copy rendezvous on tcp and streams through a bounce buffer (one
    // more copy on the receiver; ucx_perftest -e measured 0.8x of plain perftest, frames 0.7x).
    // Failure detection does not suffer: the PEER endpoint above sees the dead peer (same process,
    // same host) and close() then force-closes this one and fails what it still owes.
    ucp_ep_params_t bulk{};
    bulk.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    bulk.address = ep.address;
    bulk.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    if (ucp_ep_create(worker_->handle(), &bulk, &bulk_ep_) != UCS_OK) bulk_ep_ = nullptr;  // ep_ carries all then
  }
  channel_hello hello{frame_schema_version(), id(), worker_->instance(), options_.max_payload_bytes};
  auto bytes = encode_hello(hello);
  assert(bytes.ok());
  wire::preamble p;
  p.channel_id = id();
  p.instance = worker_->instance();
  p.header_bytes = static_cast<std::uint32_t>(bytes->size());
  auto s = std::make_shared<send_handle::state>();
  s->am_header = preamble_bytes(p, *bytes);
  s->channel = weak_from_this();
  s->expect(1);
  post_am(ep_, wire::am_hello, s->am_header.data(), s->am_header.size(), nullptr, 0, s);
  last_heard_ = last_sent_ = clock::now();
  return ok_status();
}

void channel_core::tick(clock::time_point now) {
  // Frames mark heard_/sent_ and the clock is read here, once a tick, not once a frame (a clock read
  // is a measurable part of a small frame's trip); both times are late by at most one tick.
  if (heard_) last_heard_ = now;
  if (sent_) last_sent_ = now;
  heard_ = sent_ = false;
  if (closed_ || ep_ == nullptr || peer_instance_ == 0) return;
  auto timeout = worker_->config().peer_timeout;
  if (now - last_heard_ > timeout) {
    fail(make_error(errc::io, name(id()) + ": lost the peer (silent for more than " +
                                  std::to_string(timeout.count()) + " ms)"));
    close();
    return;
  }
  if (now - last_sent_ > timeout / 4) {
    wire::preamble p;
    p.channel_id = id();
    p.instance = worker_->instance();
    auto s = std::make_shared<send_handle::state>();
    s->am_header = preamble_bytes(p, {});
    s->expect(1);
    post_am(ep_, wire::am_heartbeat, s->am_header.data(), s->am_header.size(), nullptr, 0, s);
  }
}

void channel_core::on_hello(const wire::preamble& p, std::span<const std::byte> hello_bytes) {
  auto hello = decode_hello(hello_bytes);
  if (!hello.ok()) {
    fail(make_error(errc::bad_format, name(id()) + ": the peer's hello is malformed: " + hello.err().message));
    return;
  }
  if (hello->schema_version != frame_schema_version()) {
    fail(make_error(errc::unsupported, name(id()) + ": the peer speaks frame schema v" +
                                           std::to_string(hello->schema_version) + ", this build v" +
                                           std::to_string(frame_schema_version())));
    return;
  }
  if (peer_instance_ != 0 && peer_instance_ != p.instance) return;  // a stranger on a taken id
  peer_instance_ = p.instance;
  last_heard_ = clock::now();
  {
    std::lock_guard lock(mu_);
    open_ = true;
    peer_max_payload_ = hello->max_payload_bytes;
    peer_max_payload_atomic_.store(hello->max_payload_bytes, std::memory_order_release);
  }
  cv_.notify_all();
}

bool channel_core::from_current_peer(const wire::preamble& p) const {
  return peer_instance_ != 0 && p.instance == peer_instance_ && !closed_;
}

channel_core::partial_frame& channel_core::partial(const wire::preamble& p) {
  auto [it, fresh] = partial_.try_emplace(p.seq);
  if (fresh) it->second.pre = p;
  return it->second;
}

void channel_core::reject(std::uint64_t seq, error why) {
  auto& pf = partial_[seq];
  if (!pf.err) pf.err = std::move(why);
  pf.header_ready = pf.payload_ready = true;
  try_finish(seq);
}

ucs_status_t channel_core::on_frame(const wire::preamble& p, const void* header, std::size_t header_length,
                                    void* data, std::size_t length, const ucp_am_recv_param_t* param) {
  // The usual small frame first, in one test: whole in the AM header (payload inline, its sizes
  // consistent and within this end's limits), from the current peer, nothing of it pending. It
  // passes every check below, which a frame that fails any of these goes through for its reason
  // (deliver_in_place refusing it too: then it is simply tried there again, without side effects).
  const std::size_t inline_len = header_length - sizeof(wire::preamble);
  if (p.flags == wire::flag_payload_inline && length == 0 && (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) == 0 &&
      inline_len >= p.header_bytes && inline_len - p.header_bytes == p.payload_bytes &&
      p.payload_bytes <= options_.max_payload_bytes && p.header_bytes <= options_.header_limits.max_header_bytes &&
      partial_.empty() && from_current_peer(p)) [[likely]] {
    heard_ = true;
    auto* h = static_cast<const std::byte*>(header) + sizeof(wire::preamble);
    if (deliver_in_place(p.seq, {h, p.header_bytes}, h + p.header_bytes, p.payload_bytes)) return UCS_OK;
  }
  bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  if (!from_current_peer(p)) return rndv ? UCS_ERR_NOT_CONNECTED : UCS_OK;
  heard_ = true;
  // Built only on the error paths: a string per frame is measurable at small-frame latencies.
  auto where = [&] { return name(id()) + ", frame " + std::to_string(p.seq); };
  if (p.payload_bytes > options_.max_payload_bytes) {
    reject(p.seq, make_error(errc::bad_format, where() + ": payload of " + std::to_string(p.payload_bytes) +
                                                   " bytes is over this end's limit of " +
                                                   std::to_string(options_.max_payload_bytes)));
    return rndv ? UCS_ERR_EXCEEDS_LIMIT : UCS_OK;  // the sender's send fails too
  }
  if (p.header_bytes > options_.header_limits.max_header_bytes) {
    reject(p.seq, make_error(errc::bad_format, where() + ": header of " + std::to_string(p.header_bytes) +
                                                   " bytes is over the limit of " +
                                                   std::to_string(options_.header_limits.max_header_bytes)));
    return rndv ? UCS_ERR_EXCEEDS_LIMIT : UCS_OK;
  }
  // A small payload may travel inside the AM header, after the frame header (wire::flag_payload_inline).
  const bool payload_inline = (p.flags & wire::flag_payload_inline) != 0;
  if (payload_inline && (rndv || length != 0 || (p.flags & wire::flag_header_separate) != 0 || inline_len < p.header_bytes)) {
    reject(p.seq, make_error(errc::bad_format, where() + ": malformed inline-payload frame (" +
                                                   std::to_string(inline_len) + " bytes after the preamble, header of " +
                                                   std::to_string(p.header_bytes) + ", " + std::to_string(length) +
                                                   " data bytes)"));
    return rndv ? UCS_ERR_INVALID_PARAM : UCS_OK;
  }
  const std::size_t arrived = payload_inline ? inline_len - p.header_bytes : length;
  if (arrived != p.payload_bytes) {
    reject(p.seq, make_error(errc::bad_format, where() + ": " + std::to_string(arrived) + " payload bytes arrived, " +
                                                   std::to_string(p.payload_bytes) + " announced (truncated)"));
    return rndv ? UCS_ERR_MESSAGE_TRUNCATED : UCS_OK;
  }
  if (!rndv && (p.flags & wire::flag_header_separate) == 0 && (payload_inline || inline_len == p.header_bytes) &&
      partial_.find(p.seq) == partial_.end()) {
    // The common small frame: header and payload both here, nothing to pair up (no partial entry).
    auto* h = static_cast<const std::byte*>(header) + sizeof(wire::preamble);
    const void* src = payload_inline ? static_cast<const void*>(h + p.header_bytes) : data;
    if (deliver_in_place(p.seq, {h, p.header_bytes}, src, arrived)) return UCS_OK;
    payload_buffer payload(worker_->pool(), arrived);
    if (arrived != 0) std::memcpy(payload.data(), src, arrived);
    finish(p.seq, std::vector<std::byte>(h, h + p.header_bytes), std::move(payload), arrived);
    return UCS_OK;
  }
  if (payload_inline) {
    reject(p.seq, make_error(errc::bad_format, where() + ": an inline-payload frame reuses a sequence number"));
    return UCS_OK;
  }
  auto& pf = partial(p);
  pf.pre = p;
  if ((p.flags & wire::flag_header_separate) == 0) {
    if (inline_len != p.header_bytes) {
      reject(p.seq, make_error(errc::bad_format, where() + ": inline header is " + std::to_string(inline_len) +
                                                     " bytes, " + std::to_string(p.header_bytes) + " announced"));
      return rndv ? UCS_ERR_MESSAGE_TRUNCATED : UCS_OK;
    }
    auto* h = static_cast<const std::byte*>(header) + sizeof(wire::preamble);
    pf.header_bytes.assign(h, h + inline_len);
    pf.header_ready = true;
  }
  if (!rndv) {
    pf.payload = payload_buffer(worker_->pool(), length);
    if (length != 0) std::memcpy(pf.payload.data(), data, length);
    {
      std::lock_guard lock(mu_);
      buffered_bytes_ += length;
    }
    pf.payload_ready = true;
    try_finish(p.seq);
    return UCS_OK;
  }
  bool defer, next;
  {
    std::lock_guard lock(mu_);
    // Flow control: beyond the budget, leave the data at the sender (its send stays pending) until
    // receive() frees room. The frame receive() waits for is always admitted: the bytes buffered
    // may belong to frames after it (eager ones are never held back, and over tcp a later small
    // frame can overtake a big one on the bulk endpoint), which cannot be taken before it.
    next = p.seq == next_deliver_;
    defer = !next && buffered_bytes_ != 0 && buffered_bytes_ + length > options_.max_buffered_bytes;
  }
  if (!next && (defer || !deferred_.empty())) {
    deferred_.push_back({p.seq, data, length});
    has_deferred_.store(true, std::memory_order_release);
    return UCS_INPROGRESS;
  }
  start_rndv(p.seq, data, length);
  return UCS_INPROGRESS;
}

ucs_status_t channel_core::on_separate_header(const wire::preamble& p, void* data, std::size_t length,
                                              const ucp_am_recv_param_t* param) {
  bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  if (!from_current_peer(p)) return rndv ? UCS_ERR_NOT_CONNECTED : UCS_OK;
  heard_ = true;
  // Built only on the error paths: a string per frame is measurable at small-frame latencies.
  auto where = [&] { return name(id()) + ", frame " + std::to_string(p.seq); };
  if (length != p.header_bytes || length > options_.header_limits.max_header_bytes) {
    reject(p.seq, make_error(errc::bad_format, where() + ": separate header of " + std::to_string(length) +
                                                   " bytes (announced " + std::to_string(p.header_bytes) +
                                                   ", limit " + std::to_string(options_.header_limits.max_header_bytes) + ")"));
    return rndv ? UCS_ERR_EXCEEDS_LIMIT : UCS_OK;
  }
  auto& pf = partial(p);
  pf.header_bytes.resize(length);
  if (!rndv) {
    std::memcpy(pf.header_bytes.data(), data, length);
    pf.header_ready = true;
    try_finish(p.seq);
    return UCS_OK;
  }
  recv_rndv(p.seq, true, data, pf.header_bytes.data(), length);
  return UCS_INPROGRESS;
}

void channel_core::start_rndv(std::uint64_t seq, void* desc, std::size_t length) {
  auto& pf = partial_[seq];
  pf.payload = payload_buffer(worker_->pool(), length);
  if (pf.payload.data() == nullptr) {
    ucp_am_data_release(worker_->handle(), desc);
    reject(seq, make_error(errc::out_of_memory, name(id()) + ", frame " + std::to_string(seq) +
                                                    ": cannot allocate " + std::to_string(length) + " bytes"));
    return;
  }
  {
    std::lock_guard lock(mu_);
    buffered_bytes_ += length;
  }
  recv_rndv(seq, false, desc, pf.payload.data(), length);
}

void channel_core::recv_rndv(std::uint64_t seq, bool header, void* desc, void* into, std::size_t length) {
  auto* ctx = new recv_context{shared_from_this(), seq, header};
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  rp.cb.recv_am = &channel_core::on_recv_done;
  rp.user_data = ctx;
  ucs_status_ptr_t req = ucp_am_recv_data_nbx(worker_->handle(), desc, into, length, &rp);
  if (req == nullptr) {
    on_recv_done(nullptr, UCS_OK, length, ctx);
  } else if (UCS_PTR_IS_ERR(req)) {
    on_recv_done(nullptr, UCS_PTR_STATUS(req), 0, ctx);
  } else {
    worker_->request_started();
  }
}

void channel_core::on_recv_done(void* request, ucs_status_t st, std::size_t, void* user_data) {
  auto* ctx = static_cast<recv_context*>(user_data);
  auto& self = *ctx->core;
  if (request != nullptr) {
    ucp_request_free(request);
    self.worker_->request_done();
  }
  auto it = self.partial_.find(ctx->seq);
  if (it != self.partial_.end()) {
    if (st != UCS_OK) {
      self.reject(ctx->seq, make_error(errc::io, name(self.id()) + ", frame " + std::to_string(ctx->seq) +
                                                     ": receive failed: " + ucs_status_string(st)));
    } else {
      (ctx->header ? it->second.header_ready : it->second.payload_ready) = true;
      self.try_finish(ctx->seq);
    }
  }
  delete ctx;
}

void channel_core::pump_deferred() {
  if (closed_ || deferred_.empty()) return;
  std::uint64_t want;
  {
    std::lock_guard lock(mu_);
    want = next_deliver_;
  }
  // The frame receive() waits for first, whatever the budget (on_frame says why).
  for (auto it = deferred_.begin(); it != deferred_.end(); ++it) {
    if (it->seq == want) {
      auto d = *it;
      deferred_.erase(it);
      if (deferred_.empty()) has_deferred_.store(false, std::memory_order_release);
      start_rndv(d.seq, d.desc, d.length);
      break;
    }
  }
  while (!deferred_.empty() && !closed_) {
    auto d = deferred_.front();
    {
      std::lock_guard lock(mu_);
      if (buffered_bytes_ != 0 && buffered_bytes_ + d.length > options_.max_buffered_bytes) return;
    }
    deferred_.pop_front();
    if (deferred_.empty()) has_deferred_.store(false, std::memory_order_release);
    start_rndv(d.seq, d.desc, d.length);
  }
}

void channel_core::try_finish(std::uint64_t seq) {
  auto it = partial_.find(seq);
  if (it == partial_.end()) return;
  auto& pf = it->second;
  if (!(pf.header_ready && pf.payload_ready)) return;
  auto node = partial_.extract(it);
  auto& done = node.mapped();
  if (done.err) {
    std::lock_guard lock(mu_);
    buffered_bytes_ -= done.payload.size();
    deliver(seq, raw_frame{{}, {}, std::move(done.err)});
    return;
  }
  finish(seq, std::move(done.header_bytes), std::move(done.payload));
}

void channel_core::finish(std::uint64_t seq, std::vector<std::byte> header_bytes, payload_buffer payload,
                          std::size_t uncounted) {
  std::lock_guard lock(mu_);
  buffered_bytes_ += uncounted;
  deliver(seq, raw_frame{std::move(header_bytes), std::move(payload), std::nullopt});
}

void channel_core::copy_small_frame(std::span<const std::byte> header, const void* payload, std::size_t size,
                                    std::vector<std::byte>& header_out, payload_buffer& payload_out) {
  header_out.assign(header.begin(), header.end());
  if (size == 0) {
    payload_out = payload_buffer();
    return;
  }
  if (!payload_out.reuse_for(size)) payload_out = payload_buffer(worker_->pool(), size);
  std::memcpy(payload_out.data(), payload, size);
}

bool channel_core::deliver_in_place(std::uint64_t seq, std::span<const std::byte> header, const void* payload,
                                    std::size_t size) {
  // Copied under mu_ (the receiver swaps next_'s buffers out under it), so only small payloads.
  constexpr std::size_t max_in_place = std::size_t{64} << 10;
  if (size > max_in_place) return false;
  {
    std::lock_guard lock(mu_);
    if (seq != next_deliver_ || next_full_) return false;
    if (waiting_ != nullptr) {
      // A receiver offered its frame (receive_into): the frame is taken as it lands.
      copy_small_frame(header, payload, size, waiting_->header_bytes, waiting_->payload);
      waiting_ = nullptr;
      ++next_deliver_;
      filled_seq_ = seq;
      filled_.store(true, std::memory_order_release);
      update_deliverable();
      return true;  // no notify: the offering receiver spins, it never waits on cv_ while offered
    }
    copy_small_frame(header, payload, size, next_.header_bytes, next_.payload);
    next_.err.reset();
    next_full_ = true;
    buffered_bytes_ += size;
    update_deliverable();
  }
  cv_.notify_all();
  return true;
}

void channel_core::deliver(std::uint64_t seq, raw_frame&& f) {
  // Called with mu_ held.
  bool wake = seq == next_deliver_;
  if (wake && !next_full_) {
    next_ = std::move(f);  // the usual, in-order case: no map node per frame
    next_full_ = true;
  } else {
    ready_.emplace(seq, std::move(f));
  }
  if (wake) update_deliverable();
  if (wake) cv_.notify_all();
}

bool channel_core::next_ready() const {
  return next_full_ || (!ready_.empty() && ready_.begin()->first == next_deliver_);
}

std::optional<error> channel_core::take_next(frame& f) {
  // With mu_ held and next_ready(). next_ holds frame next_deliver_ when next_full_ (deliver puts
  // only that frame there), so the map cannot hold it too.
  ++next_deliver_;
  std::optional<error> rejected;
  if (next_full_) {
    // Swapped, not moved: the caller's previous buffers stay here for the next small frame.
    std::swap(f.header_bytes, next_.header_bytes);
    std::swap(f.payload, next_.payload);
    rejected = std::move(next_.err);
    next_.err.reset();
    next_full_ = false;
  } else {
    auto node = ready_.extract(ready_.begin());
    auto& r = node.mapped();
    f.header_bytes = std::move(r.header_bytes);
    f.payload = std::move(r.payload);
    rejected = std::move(r.err);
  }
  buffered_bytes_ -= f.payload.size();  // rejected frames hold no payload (dropped at delivery)
  update_deliverable();
  return rejected;
}

void channel_core::on_bye() {
  fail(make_error(errc::io, name(id()) + ": the peer closed the channel"));
}

void channel_core::on_ep_error(void* arg, ucp_ep_h, ucs_status_t st) {
  auto* self = static_cast<channel_core*>(arg);
  self->fail(make_error(errc::io, name(self->id()) + ": lost the peer (" + ucs_status_string(st) + ")"));
  // A failed endpoint must still be closed, in force mode; not from inside UCX's callback.
  self->worker_->post([core = self->shared_from_this()] { core->close(); });
}

void channel_core::post_am(ucp_ep_h ep, unsigned id, const void* header, std::size_t header_length, const void* data,
                           std::size_t length, const std::shared_ptr<send_handle::state>& s) {
  // The completion context lives in the send's state (no allocation per send); it holds the state
  // alive only while UCX owns a request, which is never the case for a small eager send (it
  // completes in the call, and UCX calls no callback then).
  auto& slot = s->request(worker_);
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  rp.cb.send = &channel_core::on_send_done;
  if (data != nullptr && data == s->payload.data && s->payload.memory == memory_type::cuda) {
    // Only a UCX that reported CUDA memory gets here (send_owned): it moves the bytes itself.
    rp.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMORY_TYPE;
    rp.memory_type = UCS_MEMORY_TYPE_CUDA;
  }
  if (s->channel.expired()) s->channel = weak_from_this();
  rp.user_data = &slot;
  sent_ = true;
  ucs_status_ptr_t req = ucp_am_send_nbx(ep, id, header, header_length, data, length, &rp);
  if (req == nullptr) {
    s->complete_posted_inline();
  } else if (UCS_PTR_IS_ERR(req)) {
    on_send_done(nullptr, UCS_PTR_STATUS(req), &slot);
  } else {
    // Only sends UCX still owns are tracked. The callback cannot run before this (it runs from a
    // progress pass, under the worker lock this thread holds).
    slot.pending = true;
    worker_->request_started();
    in_flight_[s.get()] = s;
    slot.keep = s;
  }
}

void channel_core::on_send_done(void* request, ucs_status_t st, void* user_data) {
  auto* slot = static_cast<send_handle::state::request_slot*>(user_data);
  auto keep = std::move(slot->keep);  // keeps the state alive until this returns
  auto& s = *slot->owner;
  if (request != nullptr) ucp_request_free(request);
  if (slot->pending) {
    slot->worker->request_done();
    if (auto core = s.channel.lock()) core->in_flight_.erase(&s);
  }
  if (st == UCS_OK) {
    s.complete_one(ok_status());
  } else {
    auto core = s.channel.lock();
    std::string who = core ? name(core->id()) : std::string("channel");
    std::optional<error> why = core ? core->failure() : std::nullopt;
    s.complete_one(make_error(errc::io, who + ": send failed: " + ucs_status_string(st) +
                                            (why ? " (" + why->message + ")" : std::string())));
  }
}

void channel_core::start_send(const std::shared_ptr<send_handle::state>& s) {
  if (failed() || ep_ == nullptr || closed_) {
    auto why = failure();
    s->expect(1);
    s->complete_one(why ? *why : make_error(errc::io, name(id()) + ": closed"));
    return;
  }
  if (s->payload_inline) {
    // The whole frame is in the state's inline buffer (send_inline) or, else, in separate_header.
    assert(s->header_offset == sizeof(wire::preamble));
    if (s->inline_frame_size != 0) return post_inline(s, s->inline_frame, s->inline_frame_size);
    return post_inline(s, s->separate_header.data(), s->separate_header.size());
  }
  wire::preamble p;
  p.channel_id = id();
  p.instance = worker_->instance();
  p.seq = next_send_seq_++;
  p.payload_bytes = s->payload.size;
  assert(s->header_offset <= s->separate_header.size());
  // Large payloads through the endpoint that can stream them zero-copy (see open()).
  ucp_ep_h ep = ep_;
  if (bulk_ep_ != nullptr && s->payload.size >= bulk_min_payload) {
    ep = bulk_ep_;
    s->on_bulk_ep = true;
  }
  const std::size_t header_size = s->separate_header.size() - s->header_offset;
  p.header_bytes = static_cast<std::uint32_t>(header_size);
  if (sizeof p + header_size <= worker_->max_am_header()) {
    if (s->header_offset == sizeof p) {
      std::memcpy(s->separate_header.data(), &p, sizeof p);  // into the room left in front
      s->expect(1);
      post_am(ep, wire::am_frame, s->separate_header.data(), s->separate_header.size(), s->payload.data, s->payload.size, s);
      return;
    }
    s->am_header = preamble_bytes(p, std::span(s->separate_header).subspan(s->header_offset));
    s->expect(1);
    post_am(ep, wire::am_frame, s->am_header.data(), s->am_header.size(), s->payload.data, s->payload.size, s);
    return;
  }
  // Too big for a UCX AM header: the header goes first as its own message (same ep, so it is
  // ordered before the frame's data; the receiver pairs them by seq either way).
  p.flags = wire::flag_header_separate;
  s->separate_preamble = preamble_bytes(p, {});
  s->am_header = s->separate_preamble;
  s->expect(2);
  post_am(ep, wire::am_header, s->separate_preamble.data(), s->separate_preamble.size(),
          s->separate_header.data() + s->header_offset, header_size, s);
  post_am(ep, wire::am_frame, s->am_header.data(), s->am_header.size(), s->payload.data, s->payload.size, s);
}

void channel_core::start_inline_send(const std::shared_ptr<send_handle::state>& s, std::size_t size) {
  assert(s->payload_inline && s->inline_frame_size == size && s->header_offset == sizeof(wire::preamble));
  // A failed or closed channel: start_send's way of failing the send.
  if (failed() || ep_ == nullptr || closed_) [[unlikely]] return start_send(s);
  post_inline(s, s->inline_frame, size);
}

void channel_core::post_inline(const std::shared_ptr<send_handle::state>& s, std::byte* frame, std::size_t size) {
  // send_owned or send_inline appended the payload to the header (and checked it fits a UCX AM
  // header): one header-only message, which UCX 1.13 can send inline ("short"); with both a header
  // and data it always takes the buffered-copy path. A payload this small never takes the bulk
  // endpoint (bulk_min_payload).
  wire::preamble p;
  p.channel_id = id();
  p.instance = worker_->instance();
  p.seq = next_send_seq_++;
  p.payload_bytes = s->payload.size;
  p.header_bytes = static_cast<std::uint32_t>(size - sizeof p - s->payload.size);
  p.flags = wire::flag_payload_inline;
  std::memcpy(frame, &p, sizeof p);
  s->expect(1);
  post_am(ep_, wire::am_frame, frame, size, nullptr, 0, s);
}

void channel_core::close() {
  if (closed_) return;
  closed_ = true;
  for (auto& d : deferred_) ucp_am_data_release(worker_->handle(), d.desc);
  deferred_.clear();
  has_deferred_.store(false, std::memory_order_release);
  if (ep_ != nullptr) {
    bool failed = failure().has_value();
    if (!failed) {
      // Best effort: lets the peer report "closed" rather than "lost".
      wire::preamble p;
      p.channel_id = id();
      p.instance = worker_->instance();
      auto s = std::make_shared<send_handle::state>();
      s->am_header = preamble_bytes(p, {});
      s->expect(1);
      post_am(ep_, wire::am_bye, s->am_header.data(), s->am_header.size(), nullptr, 0, s);
    }
    // Without UCX error handling a flush would wait forever on a dead peer: force it then.
    worker_->close_ep(ep_, failed || !peer_mode_, shared_from_this());
    ep_ = nullptr;
  }
  if (bulk_ep_ != nullptr) {
    // No UCX error handling on this one: a flush could wait forever on a dead peer.
    worker_->close_ep(bulk_ep_, true, shared_from_this());
    bulk_ep_ = nullptr;
  }
  // UCX leaves sends on endpoints without error handling pending after a force close (all of them
  // over shared memory, the bulk ones over tcp). A peer process that is gone cannot read the
  // payloads any more; one that is merely silent could still read (never write) them through cma,
  // which cannot corrupt this process.
  // TODO(reliability): the UCX requests (and rendezvous receive buffers) leak here.
  auto why = failure().value_or(make_error(errc::io, name(id()) + ": closed"));
  for (auto it = in_flight_.begin(); it != in_flight_.end();) {
    auto s = it->second.lock();
    if (!peer_mode_ || (s && s->on_bulk_ep)) {
      if (s) s->fail_now(why);
      it = in_flight_.erase(it);
    } else {
      ++it;
    }
  }
  fail(make_error(errc::io, name(id()) + ": closed"));
  worker_->remove_channel(id());
}

}  // namespace conveyor::transport
