// Cap'n Proto <-> plain frame header. The only file besides generated code that uses camelCase names.
#include "conveyor/transport/frame_codec.hpp"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>
#include <kj/io.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "compact_header.hpp"
#include "conveyor/schemas/frame.capnp.h"

namespace conveyor::transport {
namespace {

using kernels::dtype;

// The compact form (compact_header.hpp) writes the plain enums' values: they must be the schema's ordinals.
static_assert(static_cast<int>(schema::DType::I32) == static_cast<int>(dtype::i32) &&
              static_cast<int>(schema::DType::F16) == static_cast<int>(dtype::f16) &&
              static_cast<int>(schema::DType::BF16) == static_cast<int>(dtype::bf16));
static_assert(static_cast<int>(schema::FrameKind::CONTROL) == static_cast<int>(frame_kind::control) &&
              static_cast<int>(schema::FrameKind::LOGITS) == static_cast<int>(frame_kind::logits) &&
              static_cast<int>(schema::FrameKind::TOKENS) == static_cast<int>(frame_kind::tokens));
static_assert(static_cast<int>(schema::LogitsMode::ALL) == static_cast<int>(logits_mode::all) &&
              static_cast<int>(schema::LogitsMode::LAST) == static_cast<int>(logits_mode::last));

schema::DType to_wire(dtype t) {
  switch (t) {
    case dtype::f32: return schema::DType::F32;
    case dtype::bf16: return schema::DType::BF16;
    case dtype::f16: return schema::DType::F16;
    case dtype::i32: return schema::DType::I32;
    case dtype::i8:
    case dtype::f8e4m3: break;  // weight-only dtypes: check_wire_dtype refuses them before encoding
  }
  return schema::DType::F32;
}

result<dtype> from_wire(schema::DType t) {
  switch (t) {
    case schema::DType::F32: return dtype::f32;
    case schema::DType::BF16: return dtype::bf16;
    case schema::DType::F16: return dtype::f16;
    case schema::DType::I32: return dtype::i32;
  }
  return make_error(errc::bad_format, "frame header: unknown dtype " + std::to_string(static_cast<int>(t)));
}

result<frame_kind> from_wire(schema::FrameKind k) {
  switch (k) {
    case schema::FrameKind::ACTIVATIONS: return frame_kind::activations;
    case schema::FrameKind::TOKENS: return frame_kind::tokens;
    case schema::FrameKind::LOGITS: return frame_kind::logits;
    case schema::FrameKind::CONTROL: return frame_kind::control;
  }
  return make_error(errc::bad_format, "frame header: unknown frame kind " + std::to_string(static_cast<int>(k)));
}

schema::FrameKind to_wire(frame_kind k) {
  switch (k) {
    case frame_kind::activations: return schema::FrameKind::ACTIVATIONS;
    case frame_kind::tokens: return schema::FrameKind::TOKENS;
    case frame_kind::logits: return schema::FrameKind::LOGITS;
    case frame_kind::control: return schema::FrameKind::CONTROL;
  }
  return schema::FrameKind::CONTROL;
}

result<logits_mode> from_wire(schema::LogitsMode m) {
  switch (m) {
    case schema::LogitsMode::NONE: return logits_mode::none;
    case schema::LogitsMode::LAST: return logits_mode::last;
    case schema::LogitsMode::ALL: return logits_mode::all;
  }
  return make_error(errc::bad_format, "frame header: unknown logits mode " + std::to_string(static_cast<int>(m)));
}

schema::LogitsMode to_wire(logits_mode m) {
  switch (m) {
    case logits_mode::none: return schema::LogitsMode::NONE;
    case logits_mode::last: return schema::LogitsMode::LAST;
    case logits_mode::all: return schema::LogitsMode::ALL;
  }
  return schema::LogitsMode::NONE;
}

std::vector<std::byte> flatten(capnp::MessageBuilder& message, std::size_t headroom = 0, std::size_t tailroom = 0) {
  // Straight into the vector (no intermediate kj::Array).
  auto segments = message.getSegmentsForOutput();
  std::vector<std::byte> out;
  out.reserve(headroom + capnp::computeSerializedSizeInWords(segments) * sizeof(capnp::word) + tailroom);
  out.resize(headroom + capnp::computeSerializedSizeInWords(segments) * sizeof(capnp::word));
  kj::ArrayOutputStream stream(kj::arrayPtr(reinterpret_cast<kj::byte*>(out.data()) + headroom, out.size() - headroom));
  capnp::writeMessage(stream, segments);
  return out;
}

// Cap'n Proto reads words in place; a receive buffer need not be 8-byte aligned, so copy when it is not.
struct aligned_words {
  kj::Array<capnp::word> copy;  // not std::vector: capnp::word cannot be copied, which clang's libstdc++ checks
  kj::ArrayPtr<const capnp::word> view;
};

result<aligned_words> as_words(std::span<const std::byte> bytes, std::size_t max_bytes, const char* what) {
  if (bytes.empty()) return make_error(errc::bad_format, std::string(what) + ": empty");
  if (bytes.size() > max_bytes) {
    return make_error(errc::bad_format, std::string(what) + ": " + std::to_string(bytes.size()) +
                                            " bytes, over the limit of " + std::to_string(max_bytes));
  }
  if (bytes.size() % sizeof(capnp::word) != 0) {
    return make_error(errc::bad_format, std::string(what) + ": " + std::to_string(bytes.size()) +
                                            " bytes is not a whole number of 8-byte words (truncated?)");
  }
  aligned_words w;
  std::size_t n = bytes.size() / sizeof(capnp::word);
  if (reinterpret_cast<std::uintptr_t>(bytes.data()) % alignof(capnp::word) == 0) {
    w.view = kj::ArrayPtr<const capnp::word>(reinterpret_cast<const capnp::word*>(bytes.data()), n);
  } else {
    w.copy = kj::heapArray<capnp::word>(n);
    std::memcpy(w.copy.begin(), bytes.data(), bytes.size());
    w.view = kj::ArrayPtr<const capnp::word>(w.copy.begin(), n);
  }
  return w;
}

status check_sampling(const sampling_params& s, std::size_t i) {
  // The message is built only when a check fails: a string per sequence shows in small-frame latency.
  auto where = [i] { return "frame header: seqs[" + std::to_string(i) + "].sampling: "; };
  if (!std::isfinite(s.temperature) || s.temperature < 0.0f) {
    return make_error(errc::bad_format, where() + "temperature must be finite and >= 0");
  }
  if (s.top_k < 0) return make_error(errc::bad_format, where() + "top_k must be >= 0");
  if (!(s.top_p > 0.0f && s.top_p <= 1.0f)) return make_error(errc::bad_format, where() + "top_p must be in (0, 1]");
  return ok_status();
}

/// The checks both wire forms share: plan consistency and the tensor's shape.
/// The weight-only dtypes (quantized checkpoints) have no wire value: to_wire would send them as f32.
status check_wire_dtype(dtype t) {
  if (t <= dtype::i32) return ok_status();
  return make_error(errc::invalid_argument, "frame header: a frame's tensor is f32, bf16, f16 or i32, not " +
                                                std::string(kernels::dtype_name(t)));
}

status validate(const frame_header& h, const codec_limits& limits) {
  std::uint64_t total_tokens = 0;
  for (std::size_t i = 0; i < h.seqs.size(); ++i) {
    const auto& p = h.seqs[i];
    auto where = [i] { return "frame header: seqs[" + std::to_string(i) + "]"; };
    if (p.start_pos < 0) return make_error(errc::bad_format, where() + ": negative start_pos");
    for (auto b : p.block_table) {
      if (b < 0) return make_error(errc::bad_format, where() + ": negative block id in block_table");
    }
    if (p.block_table.empty() && (p.start_pos > 0 || !p.tokens.empty())) {
      return make_error(errc::bad_format, where() + ": empty block_table for a sequence with positions");
    }
    CONVEYOR_TRY(check_sampling(p.sampling, i));
    total_tokens += p.tokens.size();
  }
  if (h.tensor.shape.size() > limits.max_dims) {
    return make_error(errc::bad_format, "frame header: tensor rank " + std::to_string(h.tensor.shape.size()) +
                                            " over the limit of " + std::to_string(limits.max_dims));
  }
  CONVEYOR_TRY_ASSIGN(tensor_bytes, payload_bytes(h.tensor));  // rejects negative or overflowing shapes
  (void)tensor_bytes;
  if (h.kind == frame_kind::activations) {
    if (h.tensor.shape.size() != 2 || static_cast<std::uint64_t>(h.tensor.shape[0]) != total_tokens) {
      return make_error(errc::bad_format, "frame header: activations must be [tokens, hidden] with " +
                                              std::to_string(total_tokens) + " rows (the plan's new tokens)");
    }
  }
  if (h.kind == frame_kind::control && !h.tensor.shape.empty()) {
    return make_error(errc::bad_format, "frame header: a control frame carries no tensor");
  }
  return ok_status();
}

result<frame_header> read_header(schema::FrameHeader::Reader r, const codec_limits& limits) {
  frame_header h;
  CONVEYOR_TRY_ASSIGN(kind, from_wire(r.getKind()));
  h.kind = kind;
  h.microbatch_id = r.getMicrobatchId();
  h.step = r.getStep();
  auto seqs = r.getSeqs();
  if (seqs.size() > limits.max_seqs) {
    return make_error(errc::bad_format, "frame header: " + std::to_string(seqs.size()) +
                                            " sequences, over the limit of " + std::to_string(limits.max_seqs));
  }
  h.seqs.reserve(seqs.size());
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    auto s = seqs[i];
    sequence_plan p;
    p.seq_id = s.getSeqId();
    auto tokens = s.getTokens();
    p.tokens.reserve(tokens.size());
    for (auto t : tokens) p.tokens.push_back(t);
    p.start_pos = s.getStartPos();
    auto blocks = s.getBlockTable();
    p.block_table.reserve(blocks.size());
    for (auto b : blocks) p.block_table.push_back(b);
    CONVEYOR_TRY_ASSIGN(mode, from_wire(s.getLogits()));
    p.logits = mode;
    p.sample = s.getSample();
    p.sample_rows = s.getSampleRows();
    auto sp = s.getSampling();
    p.sampling = sampling_params{sp.getTemperature(), sp.getTopK(), sp.getTopP(), sp.getSeed(), sp.getStep()};
    h.seqs.push_back(std::move(p));
  }
  auto t = r.getTensor();
  CONVEYOR_TRY_ASSIGN(type, from_wire(t.getDtype()));
  h.tensor.type = type;
  auto shape = t.getShape();
  if (shape.size() > limits.max_dims) {
    return make_error(errc::bad_format, "frame header: tensor rank " + std::to_string(shape.size()) +
                                            " over the limit of " + std::to_string(limits.max_dims));
  }
  h.tensor.shape.reserve(shape.size());
  for (auto d : shape) h.tensor.shape.push_back(d);
  CONVEYOR_TRY(validate(h, limits));
  return h;
}

}  // namespace

std::uint32_t frame_schema_version() { return schema::FRAME_SCHEMA_VERSION; }

namespace {

enum class size_fault { none, negative, overflow };

/// A tensor's bytes into `n`, or what is wrong with its shape (payload_bytes says it in words).
size_fault tensor_bytes(const tensor_desc& tensor, std::uint64_t& n) {
  n = 0;
  if (tensor.shape.empty()) return size_fault::none;
  n = kernels::dtype_size(tensor.type);
  for (auto d : tensor.shape) {
    if (d < 0) return size_fault::negative;
    if (__builtin_mul_overflow(n, static_cast<std::uint64_t>(d), &n)) return size_fault::overflow;
  }
  return size_fault::none;
}

/// check_payload_size's error (out of line: its strings made the caller save and restore six
/// registers and a frame of stack on every call, ~25 instructions).
[[gnu::noinline, gnu::cold]] status payload_size_error(const frame_header& header, std::uint64_t size) {
  CONVEYOR_TRY_ASSIGN(want, payload_bytes(header.tensor));
  if (want != size) {
    std::string shape;
    for (auto d : header.tensor.shape) shape += (shape.empty() ? "" : ",") + std::to_string(d);
    return make_error(errc::bad_format, "frame payload is " + std::to_string(size) + " bytes but the header's " +
                                            std::string(kernels::dtype_name(header.tensor.type)) + "[" + shape +
                                            "] needs " + std::to_string(want) +
                                            (size < want ? " (truncated)" : " (trailing bytes)"));
  }
  return ok_status();
}

}  // namespace

result<std::uint64_t> payload_bytes(const tensor_desc& tensor) {
  std::uint64_t n = 0;
  switch (tensor_bytes(tensor, n)) {
    case size_fault::negative: return make_error(errc::bad_format, "frame header: negative tensor dimension");
    case size_fault::overflow: return make_error(errc::bad_format, "frame header: tensor size overflows 64 bits");
    case size_fault::none: break;
  }
  return n;
}

status check_payload_size(const frame_header& header, std::uint64_t size) {
  // Checked on every send and every receive; the error (and payload_bytes' reason) only when it fails.
  std::uint64_t n = 0;
  if (tensor_bytes(header.tensor, n) == size_fault::none && n == size) return ok_status();
  return payload_size_error(header, size);
}

result<std::vector<std::byte>> encode_header(const frame_header& h, std::size_t headroom, header_form form,
                                             std::size_t tailroom) {
  std::vector<std::byte> out;
  CONVEYOR_TRY(encode_header_into(h, out, headroom, form, tailroom));
  return out;
}

status encode_header_into(const frame_header& h, std::vector<std::byte>& out, std::size_t headroom, header_form form,
                          std::size_t tailroom) {
  CONVEYOR_TRY(check_wire_dtype(h.tensor.type));
  // Small headers (a decode step) in the compact form; Cap'n Proto for the rest (compact_header.hpp).
  if (form == header_form::automatic && compact::encode(h, headroom, tailroom, out)) return ok_status();
  try {
    // A first segment on the stack, sized for the usual header: MallocMessageBuilder's default
    // first segment is an 8 KiB calloc per message, a good part of a small frame's cost.
    std::size_t estimate = 16;
    for (const auto& p : h.seqs) estimate += 12 + (p.tokens.size() + p.block_table.size()) / 2 + 2;
    estimate += h.tensor.shape.size();
    constexpr std::size_t stack_words = 256;
    alignas(capnp::word) std::byte scratch[stack_words * sizeof(capnp::word)];
    std::size_t first_words = std::min(estimate, stack_words);
    std::memset(scratch, 0, first_words * sizeof(capnp::word));  // the builder requires zeroed memory
    capnp::MallocMessageBuilder message(
        kj::arrayPtr(reinterpret_cast<capnp::word*>(scratch), first_words));
    auto b = message.initRoot<schema::FrameHeader>();
    b.setKind(to_wire(h.kind));
    b.setMicrobatchId(h.microbatch_id);
    b.setStep(h.step);
    auto seqs = b.initSeqs(static_cast<unsigned>(h.seqs.size()));
    for (std::size_t i = 0; i < h.seqs.size(); ++i) {
      const auto& p = h.seqs[i];
      auto s = seqs[i];
      s.setSeqId(p.seq_id);
      auto tokens = s.initTokens(static_cast<unsigned>(p.tokens.size()));
      for (std::size_t j = 0; j < p.tokens.size(); ++j) tokens.set(j, p.tokens[j]);
      s.setStartPos(p.start_pos);
      auto blocks = s.initBlockTable(static_cast<unsigned>(p.block_table.size()));
      for (std::size_t j = 0; j < p.block_table.size(); ++j) blocks.set(j, p.block_table[j]);
      s.setLogits(to_wire(p.logits));
      s.setSample(p.sample);
      s.setSampleRows(p.sample_rows);
      auto sp = s.initSampling();
      sp.setTemperature(p.sampling.temperature);
      sp.setTopK(p.sampling.top_k);
      sp.setTopP(p.sampling.top_p);
      sp.setSeed(p.sampling.seed);
      sp.setStep(p.sampling.step);
    }
    auto t = b.initTensor();
    t.setDtype(to_wire(h.tensor.type));
    auto shape = t.initShape(static_cast<unsigned>(h.tensor.shape.size()));
    for (std::size_t j = 0; j < h.tensor.shape.size(); ++j) shape.set(j, h.tensor.shape[j]);
    out = flatten(message, headroom, tailroom);
    return ok_status();
  } catch (const kj::Exception& e) {
    // Only a list over Cap'n Proto's 2^29-element limit gets here: a caller bug, but report it as a value.
    return make_error(errc::invalid_argument, std::string("frame header: cannot encode: ") + e.getDescription().cStr());
  }
}

result<frame_header> decode_header(std::span<const std::byte> bytes, const codec_limits& limits) {
  result<frame_header> out{frame_header{}};  // filled in place: no moves of the decoded header
  CONVEYOR_TRY(decode_header_into(bytes, *out, limits));
  return out;
}

namespace {

/// decode_header_into for all but a compact header its one-pass check accepts (out of line, so the
/// small frame's path does not pay this code's register saves).
[[gnu::noinline]] status decode_header_slow(std::span<const std::byte> bytes, frame_header& out,
                                            const codec_limits& limits) {
  if (compact::is_compact(bytes)) {
    if (bytes.size() > limits.max_header_bytes) {
      return make_error(errc::bad_format, "frame header: " + std::to_string(bytes.size()) +
                                              " bytes, over the limit of " + std::to_string(limits.max_header_bytes));
    }
    CONVEYOR_TRY(compact::decode(bytes, limits.max_seqs, limits.max_dims, out));
    return validate(out, limits);
  }
  CONVEYOR_TRY_ASSIGN(words, as_words(bytes, limits.max_header_bytes, "frame header"));
  try {
    capnp::ReaderOptions options;
    options.traversalLimitInWords = limits.max_traversal_words;
    options.nestingLimit = limits.max_nesting;
    capnp::FlatArrayMessageReader reader(words.view, options);
    if (reader.getEnd() != words.view.end()) {
      return make_error(errc::bad_format, "frame header: trailing bytes after the message");
    }
    CONVEYOR_TRY_ASSIGN(h, read_header(reader.getRoot<schema::FrameHeader>(), limits));
    out = std::move(h);
    return ok_status();
  } catch (const kj::Exception& e) {
    return make_error(errc::bad_format, std::string("frame header: malformed Cap'n Proto message: ") +
                                            e.getDescription().cStr());
  }
}

}  // namespace

status decode_header_into(std::span<const std::byte> bytes, frame_header& out, const codec_limits& limits) {
  // Into `out`'s own vectors: a small frame's header then allocates nothing once they have grown.
  // The compact form's one-pass check first (no error values built); a header it refuses, and any
  // Cap'n Proto one, goes through the strict decode and validate, which say why.
  if (bytes.size() <= limits.max_header_bytes && compact::decode_checked(bytes, limits.max_seqs, limits.max_dims, out)) {
    return ok_status();
  }
  return decode_header_slow(bytes, out, limits);
}

status decode_frame_header(std::span<const std::byte> bytes, std::uint64_t payload_size, frame_header& out,
                           const codec_limits& limits) {
  if (bytes.size() <= limits.max_header_bytes &&
      compact::decode_checked(bytes, limits.max_seqs, limits.max_dims, out)) [[likely]] {
    // decode_checked has checked the shape (payload_bytes would accept it): multiplied out
    // unchecked, a few instructions, where check_payload_size's checked walk cost ~45. (Taking
    // the size out of the decode's own pass cost more: the live value made it spill registers.)
    std::uint64_t n = 0;
    if (!out.tensor.shape.empty()) {
      n = kernels::dtype_size(out.tensor.type);
      for (auto d : out.tensor.shape) n *= static_cast<std::uint64_t>(d);
    }
    if (n == payload_size) [[likely]] return ok_status();
    return payload_size_error(out, payload_size);
  }
  CONVEYOR_TRY(decode_header_slow(bytes, out, limits));
  return check_payload_size(out, payload_size);
}

result<std::vector<std::byte>> encode_hello(const channel_hello& hello) {
  capnp::MallocMessageBuilder message;
  auto b = message.initRoot<schema::ChannelHello>();
  b.setSchemaVersion(hello.schema_version);
  b.setChannelId(hello.channel_id);
  b.setInstance(hello.instance);
  b.setMaxPayloadBytes(hello.max_payload_bytes);
  return flatten(message);
}

result<channel_hello> decode_hello(std::span<const std::byte> bytes) {
  CONVEYOR_TRY_ASSIGN(words, as_words(bytes, 4096, "channel hello"));
  try {
    capnp::ReaderOptions options;
    options.traversalLimitInWords = 512;
    capnp::FlatArrayMessageReader reader(words.view, options);
    auto r = reader.getRoot<schema::ChannelHello>();
    return channel_hello{r.getSchemaVersion(), r.getChannelId(), r.getInstance(), r.getMaxPayloadBytes()};
  } catch (const kj::Exception& e) {
    return make_error(errc::bad_format, std::string("channel hello: malformed: ") + e.getDescription().cStr());
  }
}

}  // namespace conveyor::transport
