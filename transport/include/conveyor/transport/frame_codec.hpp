#pragma once
// Converts frame headers to and from their Cap'n Proto wire form, and checks what arrives.
// A header from the network is external input: every problem comes back as an error value.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "conveyor/base/result.hpp"
#include "conveyor/transport/frame.hpp"

namespace conveyor::transport {

/// Bounds on what a decoder accepts, so a hostile or corrupt header cannot make it allocate or recurse
/// without limit.
struct codec_limits {
  std::size_t max_header_bytes = 4u << 20;          ///< encoded header size
  std::uint64_t max_traversal_words = 1u << 20;     ///< Cap'n Proto read limit (8 bytes a word)
  int max_nesting = 16;                             ///< Cap'n Proto nesting limit
  std::size_t max_seqs = 1u << 16;                  ///< sequences in one plan
  std::size_t max_dims = 8;                         ///< tensor rank
};

/// The schema version this build speaks (frame.capnp's frameSchemaVersion).
std::uint32_t frame_schema_version();

/// Which wire form encode_header writes. `automatic`: the compact form (varints, every field, see
/// src/compact_header.hpp) when it fits in 256 bytes, else Cap'n Proto (schemas/frame.capnp).
/// decode_header reads both.
enum class header_form { automatic, capnp };

/// Encodes `header` (see header_form) after `headroom` bytes left for the caller (a channel writes
/// its wire preamble there, sparing a copy per frame), with capacity for `tailroom` more bytes (a
/// channel appends a small payload there). The Cap'n Proto form is an unpacked message (flat
/// bytes, word-aligned).
result<std::vector<std::byte>> encode_header(const frame_header& header, std::size_t headroom = 0,
                                             header_form form = header_form::automatic, std::size_t tailroom = 0);

/// encode_header into `out`, reusing its capacity (a channel keeps one per send state, so a small
/// frame's header allocates nothing); the headroom bytes' content is unspecified.
status encode_header_into(const frame_header& header, std::vector<std::byte>& out, std::size_t headroom = 0,
                          header_form form = header_form::automatic, std::size_t tailroom = 0);

/// Decodes and validates a header in either form: structure, enum values, plan consistency (block tables cover
/// the positions, no negative positions), tensor shape.
result<frame_header> decode_header(std::span<const std::byte> bytes, const codec_limits& limits = {});

/// decode_header into `out`, reusing its vectors' capacity (channel::receive_into). Every field is
/// written on success; on an error `out` is unspecified (but valid).
status decode_header_into(std::span<const std::byte> bytes, frame_header& out, const codec_limits& limits = {});

/// decode_header_into, then check_payload_size(out, payload_size): the same result and the same
/// errors, in that order. A compact header's tensor size comes from its decode (a channel's receive
/// of a small frame then walks the shape once, not twice).
status decode_frame_header(std::span<const std::byte> bytes, std::uint64_t payload_size, frame_header& out,
                           const codec_limits& limits = {});

/// Bytes the header's tensor occupies, or an error if the shape is negative or overflows.
result<std::uint64_t> payload_bytes(const tensor_desc& tensor);

/// Checks that a payload of `size` bytes matches the header's tensor.
status check_payload_size(const frame_header& header, std::uint64_t size);

/// The hello that opens a channel (frame.capnp's ChannelHello).
struct channel_hello {
  std::uint32_t schema_version = 0;
  std::uint64_t channel_id = 0;
  std::uint64_t instance = 0;
  std::uint64_t max_payload_bytes = 0;
};

result<std::vector<std::byte>> encode_hello(const channel_hello& hello);
result<channel_hello> decode_hello(std::span<const std::byte> bytes);

}  // namespace conveyor::transport
