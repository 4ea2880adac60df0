#pragma once
// `time_cuda_ops gemv-stamps` (gemv_stamps.cpp): the batch-1 layer's GEMV chain, stamped block by block.
#include <string>
#include <vector>

namespace conveyor::testing {

struct gemv_stamps_options {
  std::string label = "default";
  int ring_kb = 96;       ///< gemv_args::tma_ring_bytes of every launch (the engine's default: 96)
  int down_ring_kb = 0;   ///< down_proj's ring instead (0: ring_kb)
  int pre_wait_stages = 0;   ///< gemv_args::pre_wait_stages of the launches in pre_mask
  std::string pre_mask;      ///< which launches: q (qkv), o (o_proj), g (gate_up), d (down)
  std::string late_mask;     ///< launches with gemv_args::late_trigger
  int norm_early = 1;        ///< gemv_args::norm_early of every launch
  int first_layer = 8;    ///< the first layer whose launches are printed
  int layers_shown = 1;
};

/// Variants as `time_cuda_ops gemv-stamps` takes them: comma-separated
/// LABEL:RING_KB:DOWN_RING_KB:PRE_WAIT_STAGES:PRE_MASK:LATE_MASK:NORM_EARLY, trailing fields optional
/// (masks: letters of q o g d).
std::vector<gemv_stamps_options> parse_gemv_stamps_variants(const std::string& spec);

/// Builds 16 layers of the 1B's GEMV weights (2 GB), runs the chain as a CUDA graph and prints the
/// stamps' table (gemv_stamps.cpp says what it holds).
void gemv_stamps_table(const gemv_stamps_options& opt);

}  // namespace conveyor::testing
