#pragma once
// A stage's first steps, run at load before any request: what the first requests of each shape would
// otherwise pay on a GPU (kernel modules loaded on first use, cuBLASLt's timed GEMM choices for the
// shape, the decode step's CUDA graph recorded) is paid here. The steps write throwaway KV entries
// into the first blocks of the pool, which no sequence owns yet, and read only those they wrote.
#include <string>
#include <vector>

#include "conveyor/base/result.hpp"
#include "conveyor/engine/tp_stage.hpp"

namespace conveyor::engine {

struct warm_up_options {
  /// One prefill step of this many tokens first (0: none), capped by the step workspace and the pool.
  int prefill_tokens = 16;
  /// Then a decode step (one new token per sequence) for each of these sequence counts. Each must be
  /// at least 1 and at most the stage's max_seqs and max_step_tokens (an error names it otherwise);
  /// a count the KV pool cannot hold (one block per sequence) is skipped and reported.
  std::vector<int> decode_batches;
};

struct warm_up_report {
  int steps = 0;
  double seconds = 0.0;
  std::vector<int> skipped;  ///< decode batches the KV pool was too small for
  /// One line for a log: "warm-up: 8 steps in 0.412 s (prefill 16 tokens; decode batches 1,2,4)".
  std::string describe() const;
};

/// Runs the warm-up steps on every rank of `stage` (the stage's own options bound them).
result<warm_up_report> warm_up(tp_stage& stage, const warm_up_options& o);

}  // namespace conveyor::engine
