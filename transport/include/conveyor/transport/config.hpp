#pragma once
// Settings of the UCX data plane. Plain structs: the config loader fills them from TOML.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "conveyor/transport/frame_codec.hpp"

namespace conveyor::transport {

/// One UCX context + worker (one per process, normally).
struct ucx_config {
  /// Which transports UCX may use: "auto" (what UCX picks, or the UCX_TLS environment variable when
  /// set), "tcp", "shm" (posix + sysv shared memory, + cma for large copies), or a raw UCX_TLS list
  /// such as "posix,self". Applied with ucp_config_modify, so it overrides UCX_TLS from the environment.
  std::string tls = "auto";
  /// Network devices for tcp ("all", or a UCX_NET_DEVICES list such as "lo" or "eth0").
  std::string net_devices = "all";
  /// How often UCX checks that each peer is alive; with `keepalive_interval` this bounds how long
  /// a dead peer can go unnoticed on transports that see no socket close (shared memory).
  std::chrono::milliseconds keepalive_interval{500};
  /// A peer whose channel carried nothing (not even a heartbeat) for this long is declared dead, and
  /// every pending operation on the channel fails. Heartbeats go out every peer_timeout / 4 on an
  /// idle channel. This is the bound on transports where UCX cannot watch the peer (UCX 1.13's shared
  /// memory has no peer-failure support); tcp usually notices a dead peer at once.
  std::chrono::milliseconds peer_timeout{2000};
  /// A thread that waits for a frame or a send spins on the worker this long before it blocks, and
  /// the progress thread spins this long after the worker goes idle before sleeping on its event
  /// fd: trades a core for latency.
  std::chrono::microseconds busy_poll{50};
  /// While UCX requests are outstanding (a rendezvous send or receive is moving data), the progress
  /// thread keeps polling this long without progress before it sleeps, instead of busy_poll: a
  /// tcp stream stalls for a sleep and wake-up each time a socket buffer runs empty or full, and
  /// ucx_perftest, which never sleeps, streamed 1.5x faster than frames did (bench/NOTES.md). Frames
  /// waiting for the receiver to make room (flow control) are not outstanding requests.
  std::chrono::microseconds transfer_poll{1000};
  /// Received-payload buffers kept for reuse once their frames are dropped (all channels together).
  std::size_t max_pooled_bytes = std::size_t{1} << 30;
};

/// One channel (both ends must agree on `channel_id`).
struct channel_options {
  /// Chosen by the control plane; routes frames to this channel on a worker shared by many channels.
  std::uint64_t channel_id = 0;
  /// Largest payload this end accepts (and sends); a bigger frame is refused with a reason.
  std::uint64_t max_payload_bytes = std::uint64_t{1} << 30;
  /// Limits on headers this end decodes.
  codec_limits header_limits;
  /// How long connect() waits for the peer's hello.
  std::chrono::milliseconds connect_timeout{10000};
  /// Frames received but not yet taken by receive() may hold at most this many payload bytes; further
  /// rendezvous frames wait in UCX (their senders do not complete) until receive() catches up.
  std::uint64_t max_buffered_bytes = std::uint64_t{1} << 30;
  /// Refuse, before sending, a payload over the peer's announced limit. Only tests turn this off,
  /// to reach the receiver's own check.
  bool respect_peer_limit = true;
};

}  // namespace conveyor::transport
