// The caller-facing side: ucx_context and the channel implementation that forwards to channel_core.
#include "conveyor/transport/ucx_context.hpp"

#include <cassert>
#include <cstring>
#include <mutex>

#include "channel_core.hpp"
#include "compact_header.hpp"
#include "send_state.hpp"
#include "ucx_worker.hpp"

namespace conveyor::transport {
namespace {

class ucx_channel final : public channel {
 public:
  ucx_channel(std::shared_ptr<ucx_worker> worker, std::shared_ptr<channel_core> core)
      : worker_(std::move(worker)), core_(std::move(core)) {}

  ~ucx_channel() override {
    worker_->run_sync([core = core_] { core->close(); });
  }

  result<send_handle> send(const frame_header& header, payload_view payload) override {
    CONVEYOR_TRY(check_payload_size(header, payload.size));
    CONVEYOR_TRY(check_payload(payload));
    // Room after the header for a payload small enough to travel inline (no reallocation then).
    std::size_t tail = payload.size <= wire::max_inline_payload ? payload.size : 0;
    // The whole send under the worker lock, encode included (tens of nanoseconds): the lock then
    // also guards the channel's spare send state, which took a mutex of its own before (two locked
    // read-modify-writes a send, ~20 ns each on the GPU host).
    ucx_worker::worker_lock lock(*worker_);
    auto& s = state_for_send();
    header_form form = header_form::automatic;
    if (fits_inline(payload)) {
      // A small frame: the compact header straight into the state's inline buffer.
      const std::size_t n = compact::encode_to(header, s->inline_frame + sizeof(wire::preamble));
      if (n != 0) return send_inline(s, n, payload);
      // The compact form does not take this header (too big, or a kind or dtype it does not carry):
      // encode_header_into would only try it again before Cap'n Proto.
      form = header_form::capnp;
    }
    CONVEYOR_TRY(encode_header_into(header, s->separate_header, sizeof(wire::preamble), form, tail));
    return send_owned(s, payload);
  }

  result<send_handle> send_encoded(std::span<const std::byte> header_bytes, payload_view payload) override {
    CONVEYOR_TRY(check_payload(payload));
    ucx_worker::worker_lock lock(*worker_);
    auto& s = state_for_send();
    if (fits_inline(payload) && header_bytes.size() <= compact::max_bytes) {
      if (!header_bytes.empty()) {
        std::memcpy(s->inline_frame + sizeof(wire::preamble), header_bytes.data(), header_bytes.size());
      }
      return send_inline(s, header_bytes.size(), payload);
    }
    auto& bytes = s->separate_header;
    bytes.reserve(sizeof(wire::preamble) + header_bytes.size() +
                  (payload.size <= wire::max_inline_payload ? payload.size : 0));
    bytes.resize(sizeof(wire::preamble) + header_bytes.size());
    if (!header_bytes.empty()) std::memcpy(bytes.data() + sizeof(wire::preamble), header_bytes.data(), header_bytes.size());
    return send_owned(s, payload);
  }

  result<frame> receive(deadline until) override { return core_->receive(until); }
  status receive_into(frame& f, deadline until) override { return core_->receive_into(f, until); }
  status receive_into(frame& f, clock::duration timeout) override {
    return core_->receive_into(f, wait_limit::within(timeout));
  }

  status health() const override {
    if (auto why = core_->failure()) return *why;
    return ok_status();
  }

 private:
  /// A send state: the one kept from this channel's last send when that send completed and its
  /// handle is gone (the usual case for a caller that waits for each send), else a new one, which is
  /// then kept. A state is shared only by the handles, UCX's completion slots (while UCX owns a
  /// request) and the channel's in-flight list (never a completed send's, outside the worker lock),
  /// so use_count() == 1 (just spare_) on a completed one means nobody can reach it any more.
  /// Under the worker lock (channels may be sent on from several threads). Returns spare_ itself:
  /// a handle copies it only if the send is still running when send() returns.
  std::shared_ptr<send_handle::state>& state_for_send() {
    if (spare_ready_) {
      // Reset by start() as its last send left: nothing to do here.
      spare_ready_ = false;
      return spare_;
    }
    if (spare_ && spare_.use_count() == 1 && spare_->done()) {
      spare_->reset_for_reuse();
      return spare_;
    }
    spare_ = std::make_shared<send_handle::state>();
    spare_->channel = core_;
    return spare_;
  }

  /// The checks of a payload that need no header (before the worker lock: they fail without it).
  /// The prefix of a send's error messages; built on the error paths only (a string per frame
  /// shows at small sizes).
  std::string where() const { return "channel " + std::to_string(core_->id()) + ": "; }

  status check_payload(const payload_view& payload) const {
    // The usual answer inline; the reasons (strings) in payload_error.
    if (!core_->failed() && (payload.memory != memory_type::cuda || worker_->device_memory()) &&
        (payload.size == 0 || payload.data != nullptr) && payload.size <= payload_limit()) {
      return ok_status();
    }
    return payload_error(payload);
  }

  std::uint64_t payload_limit() const {
    const auto& opts = core_->options();
    std::uint64_t limit = opts.max_payload_bytes;
    if (opts.respect_peer_limit) limit = std::min(limit, core_->peer_max_payload());
    return limit;
  }

  [[gnu::noinline, gnu::cold]] status payload_error(const payload_view& payload) const {
    if (core_->failed()) {
      if (auto why = core_->failure()) return *why;
    }
    if (payload.memory == memory_type::cuda && !worker_->device_memory()) {
      // Debian's UCX cannot read device memory: callers stage through host memory (staging_pool).
      return make_error(errc::unsupported, where() + "a device-memory payload needs a CUDA-aware UCX; this one " +
                                               "reports host memory only (stage it through a pinned host buffer)");
    }
    if (payload.size != 0 && payload.data == nullptr) {
      return make_error(errc::invalid_argument, where() + "payload has a size but no data");
    }
    const std::uint64_t limit = payload_limit();
    if (payload.size > limit) {
      return make_error(errc::invalid_argument, where() + "payload of " + std::to_string(payload.size) +
                                                    " bytes is over the limit of " + std::to_string(limit) +
                                                    " (the smaller of both ends' max_payload_bytes)");
    }
    return ok_status();
  }

  /// A payload that may travel inside the AM header (wire::flag_payload_inline) if the header is small.
  static bool fits_inline(const payload_view& payload) {
    return payload.memory != memory_type::cuda && payload.size <= wire::max_inline_payload;
  }

  error header_too_big(std::size_t header_size) const {
    return make_error(errc::invalid_argument, where() + "header of " + std::to_string(header_size) +
                                                  " bytes is over the limit of " +
                                                  std::to_string(core_->options().header_limits.max_header_bytes));
  }

  /// Under the worker lock, after check_payload, fits_inline(payload): `header_size` bytes of
  /// encoded header are in `s->inline_frame` after sizeof(wire::preamble) bytes of room. The
  /// payload is copied behind them and the frame sent from there (send_owned's inline case
  /// without the vector); a frame too big for one UCX AM header goes through send_owned.
  result<send_handle> send_inline(const std::shared_ptr<send_handle::state>& s, std::size_t header_size,
                                  payload_view payload) {
    if (header_size > core_->options().header_limits.max_header_bytes) return header_too_big(header_size);
    const std::size_t total = sizeof(wire::preamble) + header_size + payload.size;
    if (total > worker_->max_am_header()) {
      auto& bytes = s->separate_header;
      bytes.resize(sizeof(wire::preamble) + header_size);
      std::memcpy(bytes.data() + sizeof(wire::preamble), s->inline_frame + sizeof(wire::preamble), header_size);
      return send_owned(s, payload);
    }
    if (payload.size != 0) std::memcpy(s->inline_frame + sizeof(wire::preamble) + header_size, payload.data, payload.size);
    s->inline_frame_size = total;
    s->payload_inline = true;
    s->header_offset = sizeof(wire::preamble);
    s->payload = payload;
    core_->start_inline_send(s, total);
    return finished(s);
  }

  /// Under the worker lock, after check_payload: `s->separate_header` holds the encoded header
  /// after sizeof(wire::preamble) bytes of room.
  result<send_handle> send_owned(const std::shared_ptr<send_handle::state>& s, payload_view payload) {
    auto& header_bytes = s->separate_header;
    const std::size_t header_size = header_bytes.size() - sizeof(wire::preamble);
    if (header_size > core_->options().header_limits.max_header_bytes) return header_too_big(header_size);
    if (payload.memory != memory_type::cuda && payload.size <= wire::max_inline_payload &&
        sizeof(wire::preamble) + header_size + payload.size <= worker_->max_am_header()) {
      // A small payload rides in the AM header (wire::flag_payload_inline): UCX can then send the
      // frame inline, and the caller's buffer is free as soon as this returns.
      header_bytes.resize(header_bytes.size() + payload.size);
      if (payload.size != 0) std::memcpy(header_bytes.data() + sizeof(wire::preamble) + header_size, payload.data, payload.size);
      s->payload_inline = true;
    }
    return start(s, payload);
  }

  /// Under the worker lock: `s` (its header after sizeof(wire::preamble) bytes) goes to UCX.
  send_handle start(const std::shared_ptr<send_handle::state>& s, payload_view payload) {
    s->header_offset = sizeof(wire::preamble);
    s->payload = payload;
    // Sent from this thread (no hand-off to the progress thread): ucp_am_send_nbx does not block,
    // and the worker lock waits at most one progress pass. Sends stay in call order per channel.
    core_->start_send(s);
    return finished(s);
  }

  /// The handle of a send just started (under the worker lock).
  send_handle finished(const std::shared_ptr<send_handle::state>& s) {
    // A send UCX finished in the call (the usual small frame) needs no shared state: its handle
    // is just "done, OK" (no shared_ptr copy, a locked increment and a decrement, per small frame).
    if (s->succeeded()) {
      // Made ready for the next send now, while this frame travels, rather than at the start of
      // the next send: in a ping-pong that one answers a frame, and its path up to the FIFO write
      // is the round trip's critical path (~50 instructions; bench/NOTES.md, session 9). `s` is
      // spare_ (state_for_send), and with no handle handed out nobody else can reach it.
      assert(&s == &spare_);
      if (s.use_count() == 1) {
        s->reset_for_reuse();
        spare_ready_ = true;
      }
      return send_handle::completed();
    }
    return send_handle(s);
  }

  std::shared_ptr<ucx_worker> worker_;
  std::shared_ptr<channel_core> core_;
  std::shared_ptr<send_handle::state> spare_;  // under the worker lock
  /// spare_ is reset and unused (start() reset it after a send that completed in the call); under
  /// the worker lock. A send that fails before it posts leaves it false, so its half-written state is
  /// never reused.
  bool spare_ready_ = false;
};

}  // namespace

ucx_context::ucx_context(std::shared_ptr<ucx_worker> worker) : worker_(std::move(worker)) {}
ucx_context::~ucx_context() = default;

result<std::unique_ptr<ucx_context>> ucx_context::create(const ucx_config& config) {
  CONVEYOR_TRY_ASSIGN(worker, ucx_worker::start(config));
  return std::unique_ptr<ucx_context>(new ucx_context(std::move(worker)));
}

const worker_address& ucx_context::address() const { return worker_->address(); }

std::string ucx_context::describe() const { return worker_->describe(); }

bool ucx_context::device_memory() const { return worker_->device_memory(); }

result<std::unique_ptr<channel>> ucx_context::connect(const worker_address& peer, const channel_options& options) {
  if (peer.empty()) return make_error(errc::invalid_argument, "connect: empty peer address");
  auto core = std::make_shared<channel_core>(worker_.get(), options);
  status opened;
  bool registered = false;
  worker_->run_sync([&] {
    registered = worker_->add_channel(core);
    if (registered) opened = core->open(peer);
  });
  if (!registered) {
    return make_error(errc::invalid_argument, "connect: channel id " + std::to_string(options.channel_id) +
                                                  " is already open on this worker");
  }
  // From here the channel object owns the close, on every path.
  auto ch = std::make_unique<ucx_channel>(worker_, core);
  CONVEYOR_TRY(opened);
  CONVEYOR_TRY(core->wait_open(clock::now() + options.connect_timeout));
  return std::unique_ptr<channel>(std::move(ch));
}

}  // namespace conveyor::transport
