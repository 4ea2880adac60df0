#include <cblas.h>

#include <algorithm>

#include "conveyor/kernels/quant.hpp"
#include "cpu_ops.hpp"

namespace conveyor::kernels::cpu {

void linear_quant(const float* x, int n, const void* q, dtype type, const float* scales, int rows, int cols,
                  const float* bias, float* out, float* scratch, std::size_t tile_floats) {
  if (n == 0) return;
  // Tiles of whole rows: out[:, r0 .. r0 + tile) = x · W[r0 .. r0 + tile)ᵀ, written in place (ldc = rows).
  const int tile = static_cast<int>(std::max<std::size_t>(1, tile_floats / static_cast<std::size_t>(cols)));
  for (int r0 = 0; r0 < rows; r0 += tile) {
    const int m = std::min(tile, rows - r0);
    dequantize_rows(q, type, scales, r0, m, cols, scratch);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, m, cols, 1.0f, x, cols, scratch, cols, 0.0f, out + r0,
                rows);
  }
  if (bias != nullptr) {
    for (int r = 0; r < n; ++r) {
      float* o = out + static_cast<std::size_t>(r) * rows;
      for (int j = 0; j < rows; ++j) o[j] += bias[j];
    }
  }
}

}  // namespace conveyor::kernels::cpu
