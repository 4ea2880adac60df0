#pragma once
// The memory a placement needs on each GPU (or, on the CPU, in each worker process): the weights of
// its stages' layers, sized from the checkpoint's tensors as the engine loads them (matrices in the
// serving dtype and sliced by tensor-parallel rank, vectors in float32), plus the KV cache for the
// configured context and batch. The step workspace is not included; the report says so.
#include <cstdint>
#include <string>
#include <vector>

#include "conveyor/base/result.hpp"
#include "conveyor/config/deployment.hpp"
#include "conveyor/engine/model_config.hpp"
#include "conveyor/placement/placement.hpp"

namespace conveyor::placement {

/// A tensor of the checkpoint: its name and shape (all the estimate needs).
struct tensor_shape {
  std::string name;
  std::vector<std::int64_t> shape;
};

/// The tensors of an HF model directory, from the safetensors headers (no weights are read).
result<std::vector<tensor_shape>> read_tensor_shapes(const std::string& model_dir);

/// One stage on one of its ranks (the largest rank: rank 0 also holds the row-parallel biases).
struct stage_memory {
  std::uint64_t weight_bytes = 0;
  std::uint64_t kv_bytes = 0;
};

/// One device: a GPU of a host, or (cpu) the process of one stage.
struct device_memory {
  int host = 0;
  int gpu = -1;             ///< -1 on cpu
  std::vector<int> stages;  ///< stages with a rank on it (several when GPUs are shared)
  std::uint64_t weight_bytes = 0;
  std::uint64_t kv_bytes = 0;
  double capacity_gib = 0;  ///< placement.hosts[].gpu_memory_gib; 0 = unknown
  std::uint64_t total() const { return weight_bytes + kv_bytes; }
};

struct memory_estimate {
  std::vector<stage_memory> stages;   ///< per stage, per rank
  std::vector<device_memory> devices; ///< host order, then GPU order
  std::int64_t kv_tokens = 0;         ///< KV slots per stage
  std::string kv_basis;               ///< how kv_tokens was chosen, for the report
};

/// Estimates the memory of `plan`. `tensors` come from read_tensor_shapes (or a test).
memory_estimate estimate_memory(const placement_plan& plan, const config::deployment& d,
                                const engine::model_config& model, const std::vector<tensor_shape>& tensors);

/// Fails, naming every device that is over its capacity, with what it needs and what to change.
status check_fit(const memory_estimate& m, const placement_plan& plan);

/// "1.25 GiB", "12.0 MiB".
std::string format_bytes(std::uint64_t bytes);

}  // namespace conveyor::placement
