#pragma once
// The compact wire form of a frame header (private to transport/): every field of frame_header, as
// varints behind a 4-byte tag, for small headers (a decode step of a few sequences). Cap'n Proto
// (schemas/frame.capnp) stays the form of large headers; decode_header tells them apart by the tag,
// which no Cap'n Proto flat message can start with (it would announce ~23 million segments).
//
// Why: a one-sequence decode step is ~210 bytes in Cap'n Proto and ~25 here; with the channel's
// preamble and a few payload bytes the whole frame then fits UCX's inline ("short") active message
// over shared memory (<= 92 bytes with UCX 1.13's posix transport) instead of a buffered copy, and
// encoding/decoding costs tens of nanoseconds instead of ~300 (bench/NOTES.md, transport_bench,
// third pass).
//
// Layout, version 1 (all integers LEB128 varints, signed ones zigzag-encoded; floats 4 bytes LE):
//   tag[4] = CF 56 48 01 ("\xCFVH", version 1)
//   kind_dtype: u8   low 4 bits frame_kind, high 4 bits dtype
//   microbatch_id, step: varint
//   ndims: varint, then ndims zigzag dims
//   nseqs: varint, then per sequence:
//     seq_id: zigzag   start_pos: zigzag (int32)
//     flags: u8  bits 0-1 logits_mode, bit 2 sample, bit 3 sampling follows, bit 4 sample_rows follows
//     ntokens: varint, tokens: zigzag (int32)   nblocks: varint, blocks: zigzag (int32)
//     [sample_rows: zigzag (int32)]                        when bit 4 (else 1)
//     [temperature f32, top_k zigzag, top_p f32, seed varint, step varint]  when bit 3 (else defaults)
//   nothing after the last sequence.
// Any change to frame_header must change this form too: compact_header.cpp static_asserts the sizes.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "conveyor/base/result.hpp"
#include "conveyor/transport/frame.hpp"

namespace conveyor::transport::compact {

inline constexpr std::byte tag[4] = {std::byte{0xCF}, std::byte{0x56}, std::byte{0x48}, std::byte{0x01}};

/// Largest compact header the encoder produces; a bigger header goes out as Cap'n Proto.
inline constexpr std::size_t max_bytes = 256;

/// True when `bytes` starts with the compact tag (any version byte: a newer one is rejected by decode).
bool is_compact(std::span<const std::byte> bytes);

/// Writes the compact form after `headroom` bytes (their content unspecified), with capacity for
/// `tailroom` more, into `out` (reusing its capacity); false (and `out` unspecified) when it would
/// be over max_bytes.
bool encode(const frame_header& h, std::size_t headroom, std::size_t tailroom, std::vector<std::byte>& out);

/// Writes the compact form at `out` (room for max_bytes); its size, or 0 when it would be over
/// max_bytes or the header has a dtype or kind the form does not carry (where encode says false).
std::size_t encode_to(const frame_header& h, std::byte* out);

/// Parses the compact form into `h` (written in place, so a small frame's header is not moved
/// around; every field is set, so `h` may be a previous frame's header whose vectors keep their
/// capacity) structurally: bounds, varint overflow, enum ranges, counts,
/// trailing bytes. The plan checks shared with the Cap'n Proto form are frame_codec's.
status decode(std::span<const std::byte> bytes, std::size_t max_seqs, std::size_t max_dims, frame_header& h);

/// decode and frame_codec's plan checks (validate) in one pass, with no error values: true when
/// both would accept `bytes` (and `h` then holds what decode writes); false when either would
/// reject it, or possibly for an input they accept (never so far: the fuzz target checks both
/// ways), and the caller then runs them for the result and its reason. `h` is unspecified after false.
/// True also means h.tensor's size computes (no negative dimension, no overflow): the caller may
/// multiply it out unchecked (frame_codec's decode_frame_header does).
bool decode_checked(std::span<const std::byte> bytes, std::size_t max_seqs, std::size_t max_dims, frame_header& h);

}  // namespace conveyor::transport::compact
