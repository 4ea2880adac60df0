#pragma once
// A CPU collective for ranks that are separate OS processes on one host: a tensor-parallel group
// whose ranks run in their own processes (own crash domain, own address space) and meet in one POSIX
// shared-memory segment. Same interface and same bits as cpu_group (threads): every element is summed
// in rank order, so a TP run gives identical activations whether its ranks are threads or processes.
#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "conveyor/base/result.hpp"
#include "conveyor/transport/collective.hpp"

namespace conveyor::transport {

struct shm_group_options {
  /// Bytes of the shared segment each rank owns; larger operations go through it in chunks. The
  /// segment is size * slot_bytes plus a page.
  std::size_t slot_bytes = std::size_t{4} << 20;
  /// A rank that waits longer than this for the others (at join or in an operation) fails, and so
  /// does the group for good. A peer process that died is noticed sooner: waiters look at the
  /// members' processes every `liveness_check` while they wait.
  std::chrono::milliseconds timeout{60000};
  std::chrono::milliseconds liveness_check{100};
  /// A waiter spins this long before it sleeps on a futex: trades a core for latency.
  std::chrono::microseconds spin{50};
};

/// A fresh group id (the shared-memory name), as an opaque blob for the control plane to carry to
/// every rank, like an NCCL unique id.
std::vector<std::byte> make_shm_group_id();

/// Joins the group `id` as `rank` of `size`: rank 0 creates the segment, the others open it. Returns
/// once every rank has joined (then the name is unlinked, so nothing is left behind even if the
/// processes crash), or an error at `options.timeout`. Every rank must pass the same size and
/// slot_bytes. Use the collective from one thread.
result<std::unique_ptr<collective>> join_shm_group(std::span<const std::byte> id, int size, int rank,
                                                   const shm_group_options& options = {});

}  // namespace conveyor::transport
