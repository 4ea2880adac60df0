#pragma once
// How one rank of a tensor-parallel group slices a layer (Megatron-style): q/k/v and gate/up are
// split by output rows (heads, ffn units), o_proj and down_proj by input columns, and their partial
// results are summed with an all-reduce. KV heads are split when there are at least as many as
// ranks, and replicated otherwise. Any degree that divides the heads works from the same HF
// checkpoint: each rank reads only its slice at load time.
#include <cstdint>

#include "conveyor/base/result.hpp"
#include "conveyor/engine/model_config.hpp"

namespace conveyor::engine {

struct tp_layout {
  int rank = 0;
  int size = 1;
  int heads = 0;           ///< query heads of this rank
  int head_begin = 0;      ///< first global query head
  int kv_heads = 0;        ///< KV heads of this rank
  int kv_head_begin = 0;   ///< first global KV head
  int ffn_begin = 0;       ///< first global ffn unit
  int ffn = 0;             ///< ffn units of this rank
};

/// The slice of `rank` in a group of `size`; an error says which degrees the model allows.
result<tp_layout> make_tp_layout(const model_config& config, int rank, int size);

}  // namespace conveyor::engine
