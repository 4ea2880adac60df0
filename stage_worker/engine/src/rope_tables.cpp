// Rotary inverse frequencies as HF's ROPE_INIT_FUNCTIONS compute them (default, linear, llama3, yarn).
#include <algorithm>
#include <cmath>
#include <numbers>

#include "conveyor/engine/model_config.hpp"

namespace conveyor::engine {

namespace {

std::vector<double> base_inv_freq(double theta, int dim) {
  std::vector<double> inv(dim / 2);
  for (int i = 0; i < dim / 2; ++i) {
    // torch: 1 / base ** (arange(0, dim, 2).float() / dim), exponent rounded to float32.
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
    inv[i] = 1.0 / std::pow(theta, static_cast<double>(exponent));
  }
  return inv;
}

void apply_llama3(const rope_config& r, std::vector<double>& inv) {
  const double old_ctx = r.original_max_position_embeddings;
  const double low_wavelen = old_ctx / r.low_freq_factor;
  const double high_wavelen = old_ctx / r.high_freq_factor;
  for (double& f : inv) {
    const double wavelen = 2.0 * std::numbers::pi / f;
    double scaled = wavelen > low_wavelen ? f / r.factor : f;
    const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
    if (medium) {
      const double smooth = (old_ctx / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
      scaled = (1.0 - smooth) * scaled / r.factor + smooth * scaled;
    }
    f = scaled;
  }
}

double yarn_mscale(double scale, double mscale) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

float apply_yarn(const model_config& c, std::vector<double>& inv) {
  const rope_config& r = c.rope;
  const int dim = c.head_dim;
  double factor = r.factor;
  double original = c.max_position_embeddings;
  if (r.original_max_position_embeddings > 0) {
    original = r.original_max_position_embeddings;
    // HF derives the factor from the two context lengths when both are given.
    factor = static_cast<double>(c.max_position_embeddings) / original;
  }
  double attention = r.attention_factor;
  if (attention <= 0.0) {
    attention = (r.mscale > 0.0 && r.mscale_all_dim > 0.0)
                    ? yarn_mscale(factor, r.mscale) / yarn_mscale(factor, r.mscale_all_dim)
                    : yarn_mscale(factor, 1.0);
  }
  auto correction_dim = [&](double rotations) {
    return (dim * std::log(original / (rotations * 2.0 * std::numbers::pi))) / (2.0 * std::log(r.theta));
  };
  double low = correction_dim(r.beta_fast);
  double high = correction_dim(r.beta_slow);
  if (r.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  for (int i = 0; i < dim / 2; ++i) {
    const double ramp = std::clamp((static_cast<float>(i) - low) / (high - low), 0.0, 1.0);
    const double extrapolation = 1.0 - ramp;
    const double interp = inv[i] / factor;
    inv[i] = interp * (1.0 - extrapolation) + inv[i] * extrapolation;
  }
  return static_cast<float>(attention);
}

}  // namespace

rope_tables compute_rope_tables(const model_config& c) {
  std::vector<double> inv = base_inv_freq(c.rope.theta, c.head_dim);
  rope_tables t;
  if (c.rope.type == "linear") {
    for (double& f : inv) f /= c.rope.factor;
  } else if (c.rope.type == "llama3") {
    apply_llama3(c.rope, inv);
  } else if (c.rope.type == "yarn") {
    t.attention_scaling = apply_yarn(c, inv);
  }
  t.inv_freq.assign(inv.begin(), inv.end());
  return t;
}

}  // namespace conveyor::engine
