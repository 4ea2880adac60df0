#include "conveyor/engine/speculative_sampling.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <numeric>

#include "conveyor/kernels/sampling.hpp"

namespace conveyor::engine {

namespace {
// Independent uniform streams per purpose: sample_uniform hashes the seed, so xoring a constant in
// gives an unrelated sequence.
constexpr std::uint64_t accept_stream = 0x243f6a8885a308d3ull;
constexpr std::uint64_t residual_stream = 0x13198a2e03707344ull;
constexpr std::uint64_t draft_stream = 0xa4093822299f31d0ull;

/// Inverse-CDF draw from unnormalised weights (total > 0).
std::int32_t draw(const std::vector<double>& w, double total, double u) {
  const double target = u * total;
  double cum = 0.0;
  std::int32_t last_positive = 0;
  for (std::size_t i = 0; i < w.size(); ++i) {
    if (w[i] <= 0.0) continue;
    cum += w[i];
    last_positive = static_cast<std::int32_t>(i);
    if (target < cum) return last_positive;
  }
  return last_positive;  // rounding: the last token with weight
}
}  // namespace

std::vector<std::int32_t> flat_sampled_tokens(const step_plan& plan, const step_output& out) {
  std::vector<std::int32_t> flat;
  for (std::size_t i = 0; i < plan.seqs.size(); ++i) {
    const auto& s = plan.seqs[i];
    if (!s.sample || i >= out.row_tokens_offset.size() || out.row_tokens_offset[i] < 0) {
      flat.push_back(-1);
      continue;
    }
    const auto first = out.row_tokens.begin() + out.row_tokens_offset[i];
    flat.insert(flat.end(), first, first + s.sample_rows);
  }
  return flat;
}

std::uint64_t draft_seed(std::uint64_t seed) { return seed ^ draft_stream; }

void warped_probs(const float* logits, int vocab, const kernels::sample_params& params, std::vector<double>& out) {
  out.assign(vocab, 0.0);
  if (params.temperature <= 0.0f || params.top_k == 1) {
    out[kernels::argmax(logits, vocab)] = 1.0;
    return;
  }
  // kernels::sample_row's own warping, so the distribution is the one plain decoding draws from.
  std::vector<std::pair<float, std::int32_t>> order;
  std::vector<double> probs;
  double total = 0.0;
  const std::size_t keep = kernels::warp_logits(logits, vocab, params, order, probs, total, false);
  for (std::size_t i = 0; i < keep; ++i) out[order[i].second] = probs[i] / total;
}

verify_outcome verify_exact(std::span<const std::int32_t> drafts, std::span<const std::int32_t> target_rows) {
  assert(target_rows.size() == drafts.size() + 1);
  verify_outcome o;
  while (o.accepted < static_cast<int>(drafts.size()) && drafts[o.accepted] == target_rows[o.accepted]) ++o.accepted;
  o.next = target_rows[o.accepted];
  return o;
}

verify_outcome verify_rejection(std::span<const std::int32_t> drafts, std::span<const std::vector<double>> p,
                                std::span<const std::vector<double>> q, std::uint64_t seed,
                                std::uint64_t first_step) {
  assert(p.size() == drafts.size() + 1 && q.size() == drafts.size());
  verify_outcome o;
  for (std::size_t i = 0; i < drafts.size(); ++i) {
    const std::uint64_t step = first_step + i;
    const std::int32_t x = drafts[i];
    const double px = p[i][x], qx = q[i][x];
    // Accept with probability min(1, p/q): u < p/q, written without the division.
    if (kernels::sample_uniform(seed ^ accept_stream, step) * qx < px) {
      ++o.accepted;
      continue;
    }
    std::vector<double> residual(p[i].size());
    double total = 0.0;
    for (std::size_t t = 0; t < residual.size(); ++t) {
      residual[t] = std::max(0.0, p[i][t] - q[i][t]);
      total += residual[t];
    }
    // total == 0 would mean p == q, where nothing is ever rejected; rounding can still get here.
    o.next = total > 0.0 ? draw(residual, total, kernels::sample_uniform(seed ^ residual_stream, step))
                         : draw(p[i], 1.0, kernels::sample_uniform(seed ^ residual_stream, step));
    return o;
  }
  const std::uint64_t step = first_step + drafts.size();
  o.next = draw(p[drafts.size()], std::accumulate(p[drafts.size()].begin(), p[drafts.size()].end(), 0.0),
                kernels::sample_uniform(seed ^ residual_stream, step));
  return o;
}

}  // namespace conveyor::engine
