#include "conveyor/kernels/sampling.hpp"

#include <algorithm>
#include <cmath>

namespace conveyor::kernels {

namespace {
std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
}  // namespace

double sample_uniform(std::uint64_t seed, std::uint64_t step) {
  const std::uint64_t bits = splitmix64(splitmix64(seed) ^ (step * 0xd1b54a32d192ed03ull));
  return static_cast<double>(bits >> 11) * 0x1.0p-53;  // 53 random mantissa bits
}

std::int32_t argmax(const float* logits, int vocab) {
  int best = 0;
  for (int i = 1; i < vocab; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return best;
}

std::size_t warp_logits(const float* logits, int vocab, const sample_params& params,
                        std::vector<std::pair<float, std::int32_t>>& scratch, std::vector<double>& probs,
                        double& total, bool ordered) {
  scratch.resize(vocab);
  for (int i = 0; i < vocab; ++i) scratch[i] = {logits[i] / params.temperature, i};
  // Descending by logit; ties by lower index so the order (and the draw) is deterministic.
  auto by_logit = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  std::size_t keep = scratch.size();
  if (params.top_k > 0 && static_cast<std::size_t>(params.top_k) < keep) {
    keep = params.top_k;
    std::partial_sort(scratch.begin(), scratch.begin() + keep, scratch.end(), by_logit);
  } else if (ordered || params.top_p < 1.0f) {
    std::sort(scratch.begin(), scratch.end(), by_logit);
  } else {
    // No cut and no draw walking the order: only the maximum must come first.
    std::iter_swap(scratch.begin(), std::min_element(scratch.begin(), scratch.end(), by_logit));
  }
  const double max_logit = scratch[0].first;
  total = 0.0;
  probs.resize(keep);
  for (std::size_t i = 0; i < keep; ++i) {
    probs[i] = std::exp(static_cast<double>(scratch[i].first) - max_logit);
    total += probs[i];
  }
  if (params.top_p < 1.0f) {
    // Keep the smallest prefix whose probability reaches top_p (at least one token).
    double cum = 0.0;
    std::size_t cut = keep;
    for (std::size_t i = 0; i < keep; ++i) {
      cum += probs[i] / total;
      if (cum >= params.top_p) { cut = i + 1; break; }
    }
    keep = cut;
    total = 0.0;
    for (std::size_t i = 0; i < keep; ++i) total += probs[i];
  }
  return keep;
}

std::int32_t sample_row(const float* logits, int vocab, const sample_params& params,
                        std::vector<std::pair<float, std::int32_t>>& scratch) {
  if (params.temperature <= 0.0f || params.top_k == 1) return argmax(logits, vocab);
  std::vector<double> probs;
  double total = 0.0;
  const std::size_t keep = warp_logits(logits, vocab, params, scratch, probs, total, true);
  const double u = sample_uniform(params.seed, params.step) * total;
  double cum = 0.0;
  for (std::size_t i = 0; i < keep; ++i) {
    cum += probs[i];
    if (u < cum) return scratch[i].second;
  }
  return scratch[keep - 1].second;
}

}  // namespace conveyor::kernels
