#include <cmath>

#include "cpu_ops.hpp"

namespace conveyor::kernels::cpu {

void silu_mul(const float* gate_up, int n, int ffn, float* out) {
  for (int r = 0; r < n; ++r) {
    const float* g = gate_up + static_cast<std::size_t>(r) * 2 * ffn;
    const float* u = g + ffn;
    float* o = out + static_cast<std::size_t>(r) * ffn;
    for (int i = 0; i < ffn; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  }
}

}  // namespace conveyor::kernels::cpu
