#pragma once
// Memory planned up front: how many KV blocks a stage's backend can hold after its weights and step
// workspace, from a fraction of the free memory. Running out is a clear error at start, never an
// out-of-memory in the middle of a request.
#include <cstddef>
#include <string>
#include <vector>

#include "conveyor/base/result.hpp"
#include "conveyor/engine/executor.hpp"
#include "conveyor/engine/model_config.hpp"
#include "conveyor/engine/stage.hpp"
#include "conveyor/kernels/backend.hpp"

namespace conveyor::engine {

/// Bytes a stage's weights take in `backend` (matrices in its weight dtype, vectors in float32;
/// quantized matrices one byte per element + a float32 scale per row).
std::size_t estimate_weight_bytes(const kernels::backend& backend, const model_config& config, stage_range range,
                                  const weight_quant_options& quant = {});
/// The same from the size of one unquantized weight element (the planner knows no backend).
std::size_t estimate_weight_bytes(std::size_t weight_elem_bytes, const model_config& config, stage_range range,
                                  const weight_quant_options& quant = {});

/// Bytes of a stage's step workspace (activations, logits, plan arrays) for `options`.
std::size_t estimate_workspace_bytes(const kernels::backend& backend, const model_config& config, stage_range range,
                                     const executor_options& options);

struct memory_plan_options {
  /// Share of the memory that is free once weights and workspace are placed that the KV cache takes;
  /// the rest is headroom for libraries (cuBLAS, the CUDA context's growth) and fragmentation.
  double kv_fraction = 0.9;
  /// The plan fails unless at least this many blocks fit (e.g. one sequence of the longest context).
  int min_blocks = 1;
  /// Cap on the blocks (0 = as many as fit).
  int max_blocks = 0;
};

struct memory_plan {
  int kv_blocks = 0;
  std::size_t weight_bytes = 0;     ///< all stages on this backend
  std::size_t workspace_bytes = 0;  ///< all stages on this backend
  std::size_t kv_bytes = 0;         ///< kv_blocks × bytes per block, all stages
  std::size_t free_bytes = 0;       ///< free when planned
  std::size_t total_bytes = 0;
  /// One line for logs: "kv 1234 blocks (5.1 GiB) after weights 2.5 GiB, workspace 0.3 GiB, of 139.8 GiB free".
  std::string describe() const;
};

/// Plans the KV cache of `ranges` (the stages that share this backend) before anything is loaded:
/// every stage gets the same number of blocks (one block table addresses a sequence on all of
/// them). `options.kv_blocks` is ignored; the rest of `options` sizes the workspace.
result<memory_plan> plan_memory(kernels::backend& backend, const model_config& config,
                                const std::vector<stage_range>& ranges, const executor_options& options,
                                const memory_plan_options& plan_options = {});

}  // namespace conveyor::engine
