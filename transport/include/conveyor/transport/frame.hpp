#pragma once
// The plain (engine-independent) form of a frame header. The transport never includes the engine:
// these structs mirror engine::step_plan field for field, and the stage actor converts between them.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "conveyor/kernels/dtype.hpp"

namespace conveyor::transport {

/// What a frame's payload is.
enum class frame_kind : std::uint8_t {
  activations,  ///< hidden states [tokens, hidden] for the next stage
  tokens,       ///< sampled token ids (i32), one per sequence, from the last stage
  logits,       ///< logit rows from the last stage
  control,      ///< no tensor: a plan-only message
};

/// Mirrors engine::logits_mode.
enum class logits_mode : std::uint8_t { none, last, all };

/// Mirrors kernels::sample_params.
struct sampling_params {
  float temperature = 0.0f;
  std::int32_t top_k = 0;
  float top_p = 1.0f;
  std::uint64_t seed = 0;
  std::uint64_t step = 0;
  bool operator==(const sampling_params&) const = default;
};

/// Mirrors engine::sequence_step: one sequence's share of a batch step.
struct sequence_plan {
  std::int64_t seq_id = 0;
  std::vector<std::int32_t> tokens;       ///< new token ids of this step
  std::int32_t start_pos = 0;             ///< position of tokens[0]
  std::vector<std::int32_t> block_table;  ///< KV blocks covering [0, start_pos + tokens.size())
  logits_mode logits = logits_mode::none;
  bool sample = true;
  sampling_params sampling;
  std::int32_t sample_rows = 1;  ///< speculative verification: rows drawn (engine::sequence_step)
  bool operator==(const sequence_plan&) const = default;
};

/// Type and shape of a frame's payload.
struct tensor_desc {
  kernels::dtype type = kernels::dtype::f32;
  std::vector<std::int64_t> shape;  ///< outermost first; empty = no payload
  bool operator==(const tensor_desc&) const = default;
};

/// Everything a stage needs besides the tensor bytes.
struct frame_header {
  frame_kind kind = frame_kind::activations;
  std::uint64_t microbatch_id = 0;
  std::uint64_t step = 0;
  std::vector<sequence_plan> seqs;  ///< the batch plan, in the tensor's row order
  tensor_desc tensor;
  bool operator==(const frame_header&) const = default;
};

/// Where a payload lives. `cuda` payloads need a UCX that reports CUDA memory (Debian's is host-only).
enum class memory_type : std::uint8_t { host, cuda };

}  // namespace conveyor::transport
