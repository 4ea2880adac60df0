#pragma once
// The NCCL collective for GPU ranks. Builds without CUDA return errc::unsupported, so callers need
// no #ifdef. No NCCL or CUDA header leaks out of here.
#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "conveyor/transport/collective.hpp"

namespace conveyor::transport {

/// Whether this build has NCCL (CONVEYOR_HAVE_CUDA at configure time).
bool nccl_available();

/// A fresh NCCL unique id, as an opaque blob. One rank makes it; the control plane carries it to
/// the others (the same path as UCX worker addresses).
result<std::vector<std::byte>> make_nccl_unique_id();

/// Joins an NCCL group as `rank` of `size` on CUDA device `device`; blocks until every rank has
/// joined (ncclCommInitRank). Operations are enqueued on `cuda_stream` (a cudaStream_t; nullptr =
/// the legacy default stream) and take device pointers. f32, bf16, f16 and i32 are supported.
result<std::unique_ptr<collective>> make_nccl_collective(std::span<const std::byte> unique_id, int size,
                                                         int rank, int device, void* cuda_stream);

/// The communicators of a group whose ranks are threads of this process: rank r on `devices[r]`,
/// enqueuing on `streams[r]`. ncclCommInitRank blocks until every rank joined, so the ranks
/// initialise in parallel threads here.
result<std::vector<std::unique_ptr<collective>>> make_nccl_group(const std::vector<int>& devices,
                                                                 const std::vector<void*>& streams);

}  // namespace conveyor::transport
