// The compact frame header form (compact_header.hpp has the layout and the reasons).
#include "compact_header.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

namespace conveyor::transport::compact {
namespace {

// A new field in these structs must be carried here too (and in the Cap'n Proto schema): the sizes
// catch an addition at compile time. Update both forms, then these numbers.
static_assert(sizeof(sampling_params) == 32, "sampling_params changed: update the compact header form");
static_assert(sizeof(sequence_plan) == 112, "sequence_plan changed: update the compact header form");
static_assert(sizeof(tensor_desc) == 32, "tensor_desc changed: update the compact header form");
static_assert(sizeof(frame_header) == 80, "frame_header changed: update the compact header form");

constexpr std::uint8_t flag_logits_mask = 0x3;
constexpr std::uint8_t flag_sample = 0x4;
constexpr std::uint8_t flag_sampling = 0x8;
constexpr std::uint8_t flag_sample_rows = 0x10;

/// Writes the compact form at a pointer. Checked: into a buffer of `cap` bytes, dropping what would
/// not fit (fits() says so afterwards). Unchecked: no bound check per byte, for a header whose
/// worst case is known to fit (the checks were ~40% of a decode step's encode, callgrind).
template <bool Checked>
class writer {
 public:
  explicit writer(std::byte* p, std::size_t cap = 0) : p_(p), end_(p + cap) {}
  void u8(std::uint8_t v) {
    if (!Checked || p_ < end_) *p_ = std::byte{v};
    ++p_;
  }
  void varint(std::uint64_t v) {
    while (v >= 0x80) {
      u8(static_cast<std::uint8_t>(v | 0x80));
      v >>= 7;
    }
    u8(static_cast<std::uint8_t>(v));
  }
  void zigzag(std::int64_t v) { varint((static_cast<std::uint64_t>(v) << 1) ^ static_cast<std::uint64_t>(v >> 63)); }
  void f32(float v) {
    std::uint32_t bits;
    std::memcpy(&bits, &v, 4);
    for (int i = 0; i < 4; ++i) u8(static_cast<std::uint8_t>(bits >> (8 * i)));
  }
  /// False when the writes ran past the capacity (they were dropped).
  bool fits() const { return !Checked || p_ <= end_; }
  std::byte* pos() const { return p_; }

 private:
  std::byte* p_;
  std::byte* end_;
};

/// The most bytes the compact form of `h` can take (every varint at its longest).
std::size_t worst_case_bytes(const frame_header& h) {
  constexpr std::size_t u64 = 10, i32 = 5, sampling = 4 + i32 + 4 + u64 + u64;
  std::size_t n = sizeof tag + 1 + u64 + u64 + u64 + u64 * h.tensor.shape.size() + u64;
  for (const auto& s : h.seqs) {
    n += u64 + i32 + 1 + u64 + i32 * s.tokens.size() + u64 + i32 * s.block_table.size() + i32 + sampling;
  }
  return n;
}

class reader {
 public:
  explicit reader(std::span<const std::byte> b) : p_(b.data()), end_(b.data() + b.size()) {}
  // Every member inline: one call out of line with `this` would keep the position in memory
  // (a load and a store per field) through the whole decode.
  [[gnu::always_inline]] std::size_t left() const { return static_cast<std::size_t>(end_ - p_); }
  [[gnu::always_inline]] bool u8(std::uint8_t& v) {
    if (p_ == end_) return false;
    v = static_cast<std::uint8_t>(*p_++);
    return true;
  }
  [[gnu::always_inline]] bool varint(std::uint64_t& v) {
    // The one-byte value first, inline: a decode step's header is ~25 of them, and the loop below
    // cost ~20 instructions each (callgrind), the largest part of a small frame's decode. Accepts
    // exactly what the loop accepts.
    if (p_ != end_ && static_cast<std::uint8_t>(*p_) < 0x80) [[likely]] {
      v = static_cast<std::uint8_t>(*p_++);
      return true;
    }
    // Position and value in and out by value: a reference to them (or to this reader) would keep
    // them in memory across every varint of the caller (~4 loads and stores each, callgrind).
    const long_varint r = varint_long(p_, end_);
    if (r.p == nullptr) return false;
    p_ = r.p;
    v = r.v;
    return true;
  }
  struct long_varint {
    const std::byte* p;  // past the varint; nullptr: truncated or over 64 bits
    std::uint64_t v;
  };
  [[gnu::noinline]] static long_varint varint_long(const std::byte* p, const std::byte* end) {
    std::uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p == end) return {nullptr, 0};
      const auto b = static_cast<std::uint8_t>(*p++);
      // The tenth byte may only hold the top bit of a 64-bit value.
      if (shift == 63 && b > 1) return {nullptr, 0};
      v |= static_cast<std::uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return {p, v};
    }
    return {nullptr, 0};
  }
  [[gnu::always_inline]] bool zigzag(std::int64_t& v) {
    std::uint64_t u;
    if (!varint(u)) return false;
    v = static_cast<std::int64_t>(u >> 1) ^ -static_cast<std::int64_t>(u & 1);
    return true;
  }
  [[gnu::always_inline]] bool i32(std::int32_t& v) {
    // Zigzag maps the int32 range onto exactly [0, 2^32): one comparison instead of two.
    std::uint64_t u;
    if (!varint(u) || u > 0xffffffff) return false;
    v = static_cast<std::int32_t>(static_cast<std::uint32_t>(u >> 1) ^ (0u - static_cast<std::uint32_t>(u & 1)));
    return true;
  }
  /// A non-negative int32 (a position or a block id): zigzag even and below 2^32.
  [[gnu::always_inline]] bool nonnegative_i32(std::int32_t& v) {
    std::uint64_t u;
    if (!varint(u) || (u & 1) != 0 || u > 0xfffffffe) return false;
    v = static_cast<std::int32_t>(u >> 1);
    return true;
  }
  [[gnu::always_inline]] void skip(std::size_t n) { p_ += n; }
  [[gnu::always_inline]] bool f32(float& v) {
    if (left() < 4) return false;
    std::uint32_t bits = 0;
    for (int i = 0; i < 4; ++i) bits |= static_cast<std::uint32_t>(static_cast<std::uint8_t>(p_[i])) << (8 * i);
    p_ += 4;
    std::memcpy(&v, &bits, 4);
    return true;
  }
  /// A count of items that take at least one byte each: bounded by the bytes left, so a forged
  /// count cannot make the decoder reserve more than the message could hold.
  [[gnu::always_inline]] bool count(std::size_t& n) {
    std::uint64_t v;
    if (!varint(v) || v > left()) return false;
    n = static_cast<std::size_t>(v);
    return true;
  }

 private:
  const std::byte* p_;
  const std::byte* end_;
};

error bad(const std::string& what) { return make_error(errc::bad_format, "frame header (compact): " + what); }

bool sampling_is_default(const sampling_params& s) { return s == sampling_params{}; }

template <class W>
void write_fields(const frame_header& h, W& w) {
  for (auto b : tag) w.u8(static_cast<std::uint8_t>(b));
  w.u8(static_cast<std::uint8_t>(static_cast<unsigned>(h.kind) | (static_cast<unsigned>(h.tensor.type) << 4)));
  w.varint(h.microbatch_id);
  w.varint(h.step);
  w.varint(h.tensor.shape.size());
  for (auto d : h.tensor.shape) w.zigzag(d);
  w.varint(h.seqs.size());
  for (const auto& s : h.seqs) {
    if (!w.fits()) return;  // a large plan: stop early, the caller falls back to Cap'n Proto
    w.zigzag(s.seq_id);
    w.zigzag(s.start_pos);
    bool sampling = !sampling_is_default(s.sampling);
    w.u8(static_cast<std::uint8_t>(static_cast<unsigned>(s.logits) | (s.sample ? flag_sample : 0) |
                                   (sampling ? flag_sampling : 0) | (s.sample_rows != 1 ? flag_sample_rows : 0)));
    w.varint(s.tokens.size());
    for (auto t : s.tokens) w.zigzag(t);
    w.varint(s.block_table.size());
    for (auto b : s.block_table) w.zigzag(b);
    if (s.sample_rows != 1) w.zigzag(s.sample_rows);
    if (sampling) {
      w.f32(s.sampling.temperature);
      w.zigzag(s.sampling.top_k);
      w.f32(s.sampling.top_p);
      w.varint(s.sampling.seed);
      w.varint(s.sampling.step);
    }
  }
}

}  // namespace

bool is_compact(std::span<const std::byte> bytes) {
  return bytes.size() >= 4 && bytes[0] == tag[0] && bytes[1] == tag[1] && bytes[2] == tag[2];
}

std::size_t encode_to(const frame_header& h, std::byte* out) {
  // Only the dtypes frame.capnp knows travel (the Cap'n Proto path handles any other the same way).
  if (h.tensor.type > kernels::dtype::i32 || h.kind > frame_kind::control) return 0;
  if (worst_case_bytes(h) <= max_bytes) {
    writer<false> w(out);
    write_fields(h, w);
    return static_cast<std::size_t>(w.pos() - out);
  }
  writer<true> w(out, max_bytes);
  write_fields(h, w);
  if (!w.fits()) return 0;
  return static_cast<std::size_t>(w.pos() - out);
}

bool encode(const frame_header& h, std::size_t headroom, std::size_t tailroom, std::vector<std::byte>& out) {
  std::byte buf[max_bytes];
  const std::size_t n = encode_to(h, buf);
  if (n == 0) return false;  // (a compact header is never empty: the tag alone is 4 bytes)
  out.reserve(headroom + n + tailroom);  // a reused vector (a channel's send state) keeps its capacity
  out.resize(headroom + n);
  std::memcpy(out.data() + headroom, buf, n);
  return true;
}

status decode(std::span<const std::byte> bytes, std::size_t max_seqs, std::size_t max_dims, frame_header& h) {
  if (!is_compact(bytes)) return bad("no compact tag");
  if (bytes[3] != tag[3]) {
    return bad("version " + std::to_string(static_cast<unsigned>(bytes[3])) + ", this build reads version " +
               std::to_string(static_cast<unsigned>(tag[3])));
  }
  reader r(bytes.subspan(4));
  std::uint8_t kd;
  if (!r.u8(kd)) return bad("truncated before the frame kind");
  if ((kd & 0xf) > static_cast<unsigned>(frame_kind::control)) return bad("unknown frame kind " + std::to_string(kd & 0xf));
  if ((kd >> 4) > static_cast<unsigned>(kernels::dtype::i32)) return bad("unknown dtype " + std::to_string(kd >> 4));
  h.kind = static_cast<frame_kind>(kd & 0xf);
  h.tensor.type = static_cast<kernels::dtype>(kd >> 4);
  if (!r.varint(h.microbatch_id) || !r.varint(h.step)) return bad("truncated microbatch id or step");
  std::size_t ndims;
  if (!r.count(ndims)) return bad("bad tensor rank");
  if (ndims > max_dims) return bad("tensor rank " + std::to_string(ndims) + " over the limit of " + std::to_string(max_dims));
  h.tensor.shape.resize(ndims);
  for (auto& d : h.tensor.shape) {
    if (!r.zigzag(d)) return bad("truncated tensor shape");
  }
  std::size_t nseqs;
  if (!r.count(nseqs)) return bad("bad sequence count");
  if (nseqs > max_seqs) {
    return bad(std::to_string(nseqs) + " sequences, over the limit of " + std::to_string(max_seqs));
  }
  h.seqs.resize(nseqs);
  for (std::size_t i = 0; i < nseqs; ++i) {
    auto& s = h.seqs[i];
    auto where = [i] { return "seqs[" + std::to_string(i) + "]: "; };
    std::uint8_t flags;
    if (!r.zigzag(s.seq_id) || !r.i32(s.start_pos) || !r.u8(flags)) return bad(where() + "truncated or out of range");
    if ((flags & ~(flag_logits_mask | flag_sample | flag_sampling | flag_sample_rows)) != 0) {
      return bad(where() + "unknown flag bits");
    }
    if ((flags & flag_logits_mask) > static_cast<unsigned>(logits_mode::all)) {
      return bad(where() + "unknown logits mode " + std::to_string(flags & flag_logits_mask));
    }
    s.logits = static_cast<logits_mode>(flags & flag_logits_mask);
    s.sample = (flags & flag_sample) != 0;
    std::size_t n;
    if (!r.count(n)) return bad(where() + "bad token count");
    s.tokens.resize(n);
    for (auto& t : s.tokens) {
      if (!r.i32(t)) return bad(where() + "truncated or out-of-range token");
    }
    if (!r.count(n)) return bad(where() + "bad block count");
    s.block_table.resize(n);
    for (auto& b : s.block_table) {
      if (!r.i32(b)) return bad(where() + "truncated or out-of-range block id");
    }
    // `h` may be a reused header (receive_into): fields the form leaves out get their defaults here.
    s.sample_rows = 1;
    if ((flags & flag_sample_rows) != 0 && !r.i32(s.sample_rows)) return bad(where() + "truncated sample_rows");
    s.sampling = sampling_params{};
    if ((flags & flag_sampling) != 0) {
      std::int32_t top_k;
      if (!r.f32(s.sampling.temperature) || !r.i32(top_k) || !r.f32(s.sampling.top_p) ||
          !r.varint(s.sampling.seed) || !r.varint(s.sampling.step)) {
        return bad(where() + "truncated sampling parameters");
      }
      s.sampling.top_k = top_k;
    }
  }
  if (r.left() != 0) return bad(std::to_string(r.left()) + " trailing bytes after the last sequence");
  return ok_status();
}


bool decode_checked(std::span<const std::byte> bytes, std::size_t max_seqs, std::size_t max_dims, frame_header& h) {
  // One pass that both parses and applies frame_codec's plan checks (validate), with no status or
  // string per field: the strict decode plus validate cost ~710 instructions for the bench's
  // one-sequence header (callgrind), a good part of a small frame's receive. It must never accept
  // what decode + validate reject (the fuzz target compares them on every input); it returns false
  // on anything else, and the caller then runs those for the reason.
  reader r(bytes);
  if (bytes.size() < sizeof tag + 1 || std::memcmp(bytes.data(), tag, sizeof tag) != 0) return false;
  const auto kd = static_cast<std::uint8_t>(bytes[sizeof tag]);
  r.skip(sizeof tag + 1);
  if ((kd & 0xf) > static_cast<unsigned>(frame_kind::control) || (kd >> 4) > static_cast<unsigned>(kernels::dtype::i32)) {
    return false;
  }
  h.kind = static_cast<frame_kind>(kd & 0xf);
  h.tensor.type = static_cast<kernels::dtype>(kd >> 4);
  if (!r.varint(h.microbatch_id) || !r.varint(h.step)) return false;
  std::size_t ndims;
  if (!r.count(ndims) || ndims > max_dims) return false;
  h.tensor.shape.resize(ndims);
  // payload_bytes' checks (validate runs it): no negative dimension, no 64-bit overflow of the size.
  std::uint64_t size = kernels::dtype_size(h.tensor.type);
  for (auto& d : h.tensor.shape) {
    std::uint64_t u;
    if (!r.varint(u) || (u & 1) != 0) return false;  // odd zigzag: negative
    d = static_cast<std::int64_t>(u >> 1);
    if (__builtin_mul_overflow(size, u >> 1, &size)) return false;
  }
  std::size_t nseqs;
  if (!r.count(nseqs) || nseqs > max_seqs) return false;
  h.seqs.resize(nseqs);
  std::uint64_t total_tokens = 0;
  for (auto& s : h.seqs) {
    std::uint8_t flags;
    if (!r.zigzag(s.seq_id) || !r.nonnegative_i32(s.start_pos) || !r.u8(flags)) return false;
    if ((flags & ~(flag_logits_mask | flag_sample | flag_sampling | flag_sample_rows)) != 0 ||
        (flags & flag_logits_mask) > static_cast<unsigned>(logits_mode::all)) {
      return false;
    }
    s.logits = static_cast<logits_mode>(flags & flag_logits_mask);
    s.sample = (flags & flag_sample) != 0;
    std::size_t n;
    if (!r.count(n)) return false;
    s.tokens.resize(n);
    for (auto& t : s.tokens) {
      if (!r.i32(t)) return false;
    }
    total_tokens += n;
    if (!r.count(n)) return false;
    if (n == 0 && (s.start_pos > 0 || !s.tokens.empty())) return false;  // no blocks for its positions
    s.block_table.resize(n);
    for (auto& b : s.block_table) {
      if (!r.nonnegative_i32(b)) return false;
    }
    s.sample_rows = 1;
    if ((flags & flag_sample_rows) != 0 && !r.i32(s.sample_rows)) return false;
    s.sampling = sampling_params{};
    if ((flags & flag_sampling) != 0) {
      auto& sp = s.sampling;
      if (!r.f32(sp.temperature) || !r.i32(sp.top_k) || !r.f32(sp.top_p) || !r.varint(sp.seed) || !r.varint(sp.step)) {
        return false;
      }
      // check_sampling's ranges.
      if (!std::isfinite(sp.temperature) || sp.temperature < 0.0f || sp.top_k < 0 || !(sp.top_p > 0.0f && sp.top_p <= 1.0f)) {
        return false;
      }
    }
  }
  if (r.left() != 0) return false;
  if (h.kind == frame_kind::activations &&
      (ndims != 2 || static_cast<std::uint64_t>(h.tensor.shape[0]) != total_tokens)) {
    return false;
  }
  if (h.kind == frame_kind::control && ndims != 0) return false;
  return true;
}

}  // namespace conveyor::transport::compact
