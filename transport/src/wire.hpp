#pragma once
// The fixed preamble that precedes every UCX active message of a channel (private to transport/).
// It is not Cap'n Proto because the receiver needs it before it can size any buffer, and because a
// frame's Cap'n Proto header may travel in a separate message when it is too big for a UCX AM header.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>

namespace conveyor::transport::wire {

/// UCX active-message ids of a channel.
enum am_id : unsigned {
  am_hello = 0x43590,   ///< preamble + ChannelHello (Cap'n Proto) in the AM header
  am_frame = 0x43591,   ///< preamble [+ inline frame header] in the AM header; payload as data
  am_header = 0x43592,  ///< preamble in the AM header; a frame header too big to inline, as data
  am_bye = 0x43593,     ///< preamble only: the peer closed the channel on purpose
  am_heartbeat = 0x43594,  ///< preamble only: the peer is alive (sent on idle channels)
};

constexpr std::uint32_t magic = 0x46595643;  // "CVYF"

/// Set in `flags` when the frame header travels in a separate am_header message.
constexpr std::uint32_t flag_header_separate = 1;
/// Set in `flags` when the payload follows the frame header inside the AM header (no AM data): UCX
/// 1.13 sends a message inline ("short", no buffer copy) only when it has a header or data, not both.
constexpr std::uint32_t flag_payload_inline = 2;
/// Largest payload a sender puts inline.
constexpr std::size_t max_inline_payload = 256;

struct preamble {
  std::uint32_t magic = wire::magic;
  std::uint32_t header_bytes = 0;  ///< encoded Cap'n Proto header (hello or frame)
  std::uint64_t channel_id = 0;
  std::uint64_t instance = 0;      ///< the sender's context instance
  std::uint64_t seq = 0;           ///< frame number on this channel, from 0
  std::uint64_t payload_bytes = 0;
  std::uint32_t flags = 0;
  std::uint32_t reserved = 0;
};
static_assert(sizeof(preamble) == 48);

/// Reads a preamble from an AM header; nullopt when it is too short or its magic is wrong.
inline std::optional<preamble> read_preamble(const void* header, std::size_t length) {
  if (header == nullptr || length < sizeof(preamble)) return std::nullopt;
  preamble p;
  std::memcpy(&p, header, sizeof p);
  if (p.magic != magic) return std::nullopt;
  return p;
}

}  // namespace conveyor::transport::wire
