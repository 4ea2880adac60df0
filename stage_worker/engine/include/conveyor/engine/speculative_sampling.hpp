#pragma once
// The acceptance rules of speculative decoding, as pure functions of the target's and the draft's
// distributions (unit-tested on their own, used by speculative_decoder).
#include <cstdint>
#include <span>
#include <vector>

#include "conveyor/engine/step_plan.hpp"
#include "conveyor/kernels/backend.hpp"

namespace conveyor::engine {

/// The distribution kernels::sample_row draws from (temperature, top-k, top-p in HF's order),
/// as probabilities over the whole vocabulary (zero outside the kept tokens). Greedy params give
/// a one-hot distribution on the argmax.
void warped_probs(const float* logits, int vocab, const kernels::sample_params& params, std::vector<double>& out);

/// Outcome of verifying k draft tokens: the first `accepted` drafts are kept, then `next` (the
/// target's correction, or its own next token when every draft was kept) follows them.
struct verify_outcome {
  int accepted = 0;
  std::int32_t next = -1;
};

/// Greedy (or exact-match) verification: `target_rows` are the tokens the target drew after each
/// of the last accepted token and the k drafts (k + 1 of them). Keeps the longest prefix of drafts
/// equal to the target's own choices, so the output is exactly the target's.
verify_outcome verify_exact(std::span<const std::int32_t> drafts, std::span<const std::int32_t> target_rows);

/// Standard speculative rejection sampling (Leviathan et al. 2023, Chen et al. 2023). `p` holds k + 1
/// rows of the target's warped distribution (after the last accepted token and after each draft),
/// `q` k rows of the draft's (the distributions the drafts were drawn from). Draft i is kept with
/// probability min(1, p_i(x) / q_i(x)); at the first rejection the correction is drawn from
/// norm(max(0, p_i - q_i)); when all are kept the next token is drawn from p_k. The output is then
/// distributed as the target's. Random numbers come from kernels::sample_uniform, keyed by `seed` and
/// the position of the token decided (`first_step` is the position of drafts[0]), so a seed fixes
/// the result.
verify_outcome verify_rejection(std::span<const std::int32_t> drafts, std::span<const std::vector<double>> p,
                                std::span<const std::vector<double>> q, std::uint64_t seed,
                                std::uint64_t first_step);

/// The last stage's tokens of a step, flat: for each plan sequence, its sample_rows drawn tokens
/// when it samples, else one -1. With one row per sequence this is step_output::tokens, so a
/// driver that never speculates sees the format it always had.
std::vector<std::int32_t> flat_sampled_tokens(const step_plan& plan, const step_output& out);

/// Seed of the draft model's draws for a request seed: a stream independent of the acceptance tests.
std::uint64_t draft_seed(std::uint64_t seed);

}  // namespace conveyor::engine
