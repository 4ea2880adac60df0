#pragma once
// A pipeline stage is a contiguous layer range; the whole model is the one-stage case.
#include <vector>

#include "conveyor/base/result.hpp"
#include "conveyor/engine/model_config.hpp"

namespace conveyor::engine {

struct stage_range {
  int first_layer = 0;  ///< inclusive
  int last_layer = 0;   ///< exclusive
  bool has_embedding = false;  ///< the first stage embeds token ids
  bool has_head = false;       ///< the last stage applies the final norm and LM head
  int num_layers() const { return last_layer - first_layer; }
};

stage_range whole_model(const model_config& config);

/// Splits the layers into `stages` ranges as evenly as possible (earlier stages get the extra layer).
result<std::vector<stage_range>> split_even(const model_config& config, int stages);

/// Uses an explicit split: `layers_per_stage` must be positive and sum to the layer count.
result<std::vector<stage_range>> split_explicit(const model_config& config,
                                                const std::vector<int>& layers_per_stage);

}  // namespace conveyor::engine
