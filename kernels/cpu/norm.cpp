#include <cmath>

#include "cpu_ops.hpp"

namespace conveyor::kernels::cpu {

namespace {
// HF's LlamaRMSNorm: x * rsqrt(mean(x²) + eps) in float32, then times the weight.
// The sum of squares is accumulated in double so the result does not depend on summation order.
void norm_row(const float* x, int width, const float* w, float eps, float* out) {
  double ss = 0.0;
  for (int i = 0; i < width; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = 1.0f / std::sqrt(static_cast<float>(ss / width) + eps);
  for (int i = 0; i < width; ++i) out[i] = w[i] * (x[i] * inv);
}
}  // namespace

void rmsnorm(const float* x, int n, int width, const float* w, float eps, float* out) {
  for (int r = 0; r < n; ++r) norm_row(x + static_cast<std::size_t>(r) * width, width, w, eps,
                                       out + static_cast<std::size_t>(r) * width);
}

void add_rmsnorm(float* residual, const float* x, int n, int width, const float* w, float eps,
                 float* out) {
  for (int r = 0; r < n; ++r) {
    float* res = residual + static_cast<std::size_t>(r) * width;
    const float* xr = x + static_cast<std::size_t>(r) * width;
    for (int i = 0; i < width; ++i) res[i] += xr[i];
    norm_row(res, width, w, eps, out + static_cast<std::size_t>(r) * width);
  }
}

}  // namespace conveyor::kernels::cpu
