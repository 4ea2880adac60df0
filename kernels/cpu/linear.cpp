#include <cblas.h>

#include "cpu_ops.hpp"

namespace conveyor::kernels::cpu {

void linear(const float* x, int n, const float* w, int rows, int cols, const float* bias,
            float* out) {
  if (n == 0) return;
  // out[n, rows] = x[n, cols] · w[rows, cols]ᵀ
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, rows, cols, 1.0f, x, cols, w, cols, 0.0f,
              out, rows);
  if (bias != nullptr) {
    for (int r = 0; r < n; ++r) {
      float* o = out + static_cast<std::size_t>(r) * rows;
      for (int j = 0; j < rows; ++j) o[j] += bias[j];
    }
  }
}

}  // namespace conveyor::kernels::cpu
