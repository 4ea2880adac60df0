#pragma once
// The collective interface of a tensor-parallel group. It lives with the kernels (it needs nothing
// but dtype) so the engine can call it without depending on transport, which implements it (CPU
// threads, NCCL). The executor calls it after its row-parallel matmuls (o_proj, down_proj).
#include <cstddef>

#include "conveyor/base/result.hpp"
#include "conveyor/kernels/dtype.hpp"

namespace conveyor::kernels {

/// One rank's handle on a group. Every rank must call the same operations in the same order with the
/// same counts (as with NCCL/MPI); a rank that does not show up turns into an error on the others
/// (CPU group: after its timeout), never a silent hang of the whole process.
///
/// Memory: host pointers for the CPU group, device pointers for NCCL. Completion: the CPU group
/// completes before returning; NCCL enqueues on the group's CUDA stream (stream order).
class collective {
 public:
  virtual ~collective() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// data[i] = sum over ranks of data[i], in place. All ranks get bitwise identical results (the CPU
  /// group sums in rank order), so replicated activations stay identical across the group.
  virtual status all_reduce_sum(void* data, std::size_t count, dtype type) = 0;
  /// out = concat over ranks (in rank order) of each rank's `count` elements of `in`; `out` holds
  /// size() * count elements. `in` may alias out + rank() * count.
  virtual status all_gather(const void* in, void* out, std::size_t count, dtype type) = 0;
  /// Copies `root`'s `count` elements of `data` into every rank's `data`.
  virtual status broadcast(void* data, std::size_t count, dtype type, int root) = 0;
};

}  // namespace conveyor::transport
