#pragma once
// The weights one stage owns, uploaded to its backend. q/k/v are fused into one matrix and gate/up
// into another at load, so a layer runs two fewer matrix products per step.
#include <functional>
#include <memory>
#include <vector>

#include "conveyor/base/result.hpp"
#include "conveyor/engine/checkpoint.hpp"
#include "conveyor/engine/device_buffer.hpp"
#include "conveyor/engine/model_config.hpp"
#include "conveyor/engine/stage.hpp"
#include "conveyor/engine/tensor_parallel.hpp"
#include "conveyor/kernels/backend.hpp"
#include "conveyor/kernels/quant.hpp"

namespace conveyor::engine {

struct layer_weights {
  kernels::weight input_norm;
  kernels::weight qkv, qkv_bias;  ///< [(heads + 2 kv_heads) * head_dim, hidden]
  kernels::weight o, o_bias;
  kernels::weight post_norm;
  kernels::weight gate_up, gate_up_bias;  ///< [2 * ffn, hidden]: gate rows, then up rows
  kernels::weight down, down_bias;
};

/// Which matrices a stage stores quantized (kernels/quant.hpp), quantized on the host at load from
/// the checkpoint's f32 / bf16 / f16 values, after tensor-parallel slicing.
struct weight_quant_options {
  kernels::weight_quant kind = kernels::weight_quant::none;  ///< q/k/v/o and gate/up/down
  /// The LM head too (a tied head then gets its own quantized copy; the embedding table is never
  /// quantized: it is read a row per token, so it costs no bandwidth).
  bool lm_head = false;
};

/// Parses "none" | "int8" | "fp8" (the TOML value and the CLI flag); the error names what is allowed.
result<kernels::weight_quant> parse_weight_quant(const std::string& text);

class stage_weights {
 public:
  /// Reads only the tensors of `range` from the checkpoint, and of those only the slice of tensor-
  /// parallel rank `tp` (whole tensors when tp.size == 1); names the tensor on any mismatch.
  static result<std::unique_ptr<stage_weights>> load(kernels::backend& backend, checkpoint& ckpt,
                                                     const model_config& config, stage_range range,
                                                     const tp_layout& tp,
                                                     const weight_quant_options& quant = {},
                                                     const std::function<void()>& on_layer_loaded = {});

  kernels::weight embedding;   ///< set on the first stage
  kernels::weight final_norm;  ///< set on the last stage
  kernels::weight lm_head;     ///< set on the last stage (the embedding when tied)
  std::vector<layer_weights> layers;  ///< layers[i] is model layer range.first_layer + i
  std::size_t bytes = 0;              ///< backend memory held

 private:
  explicit stage_weights(kernels::backend& b) : backend_(&b) {}
  kernels::backend* backend_;
  std::vector<device_buffer> owned_;
  friend class weight_loader;
};

}  // namespace conveyor::engine
