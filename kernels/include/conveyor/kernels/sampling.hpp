#pragma once
// Host reference of token sampling, shared by the CPU backend and as the twin of device sampling.
#include <cstdint>
#include <vector>

#include "conveyor/kernels/backend.hpp"

namespace conveyor::kernels {

/// Counter-based uniform in [0, 1): depends only on (seed, step), so a sequence draws the same
/// numbers whatever batch, stage split or backend it runs in.
double sample_uniform(std::uint64_t seed, std::uint64_t step);

/// Index of the first maximum (torch.argmax's tie rule).
std::int32_t argmax(const float* logits, int vocab);

/// The distribution sampling draws from (temperature > 0, top_k != 1): temperature, then top-k, then
/// top-p (HF's warper order). Leaves the kept tokens (scratch[0 .. keep)) with their unnormalised
/// probabilities (probs[0 .. keep), relative to the largest logit) and their sum in `total`; returns
/// keep. `ordered`: the kept tokens most likely first (ties: lower id) even when nothing is cut;
/// otherwise only the most likely one is sure to be first then.
std::size_t warp_logits(const float* logits, int vocab, const sample_params& params,
                        std::vector<std::pair<float, std::int32_t>>& scratch, std::vector<double>& probs,
                        double& total, bool ordered);

/// Temperature, then top-k, then top-p (HF's warper order), then inverse-CDF draw.
/// `scratch` avoids an allocation per call.
std::int32_t sample_row(const float* logits, int vocab, const sample_params& params,
                        std::vector<std::pair<float, std::int32_t>>& scratch);

}  // namespace conveyor::kernels
