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

/// Encodes `header` as an unpacked Cap'n Proto message (flat bytes, word-aligned), after `headroom`
/// bytes left for the caller (a channel writes its wire preamble there, sparing a copy per frame).
result<std::vector<std::byte>> encode_header(const frame_header& header, std::size_t headroom = 0);

/// Decodes and validates a header: structure, enum values, plan consistency (block tables cover
/// the positions, no negative positions), tensor shape.
result<frame_header> decode_header(std::span<const std::byte> bytes, const codec_limits& limits = {});

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
