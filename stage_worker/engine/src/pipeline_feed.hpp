#pragma once
// Internal to the engine: bringing sequences' KV in a local pipeline up to a token list and drawing
// at its last rows, in chunks of the pipeline's step budget (speculative decoding's draft and
// verification passes).
#include <cstdint>
#include <vector>

#include "conveyor/engine/local_pipeline.hpp"

namespace conveyor::engine {

/// One sequence's work in a pipeline: bring its KV up to `tokens` and draw at the last rows.
struct feed {
  std::int64_t seq = 0;
  const std::vector<std::int32_t>* tokens = nullptr;  ///< committed tokens + proposals so far
  int* cached = nullptr;                              ///< positions of `tokens` in this pipeline's KV
  int sample_rows = 1;
  kernels::sample_params params;  ///< step is set here: the last row draws position tokens.size()
  bool want_logits = false;
  std::vector<std::int32_t> rows;  ///< drawn tokens, sample_rows of them
  std::vector<float> logits;       ///< [sample_rows, vocab] when want_logits
};

/// Runs steps of `pipe` until every feed's tokens are in its KV, in chunks of the pipeline's step
/// budget (the first round carries the prompt); only a feed's last chunk samples.
status advance(local_pipeline& pipe, std::vector<feed>& feeds, std::int64_t* steps, double* seconds);

}  // namespace conveyor::engine
