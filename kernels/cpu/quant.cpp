#include "conveyor/kernels/quant.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace conveyor::kernels {

std::uint8_t f32_to_e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  std::uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const std::uint8_t sign = (bits >> 31) ? 0x80 : 0x00;
  const std::uint32_t u = bits & 0x7fffffffu;
  const float a = std::fabs(f);
  if (a >= e4m3_max) return sign | 0x7e;
  constexpr float min_normal = 0.015625f;  // 2^-6
  if (a < min_normal) {
    // Subnormal step 2^-9; a rounded-up 8 is the smallest normal (0x08), which the bits spell too.
    return sign | static_cast<std::uint8_t>(std::nearbyint(a * 512.0f));
  }
  // Round the 23-bit mantissa to 3 bits, ties to even; a carry moves into the exponent by itself.
  const std::uint32_t r = u + 0x7ffffu + ((u >> 20) & 1u);
  const int biased = static_cast<int>(r >> 23) - 127 + 7;
  const int m = static_cast<int>((r >> 20) & 7u);
  if (biased > 15 || (biased == 15 && m == 7)) return sign | 0x7e;
  return sign | static_cast<std::uint8_t>((biased << 3) | m);
}

float e4m3_to_f32(std::uint8_t b) {
  const int e = (b >> 3) & 0xf, m = b & 0x7;
  if (e == 15 && m == 7) return std::numeric_limits<float>::quiet_NaN();
  const float mag = e == 0 ? std::ldexp(static_cast<float>(m), -9) : std::ldexp(1.0f + m / 8.0f, e - 7);
  return (b & 0x80) ? -mag : mag;
}

void quantize_rows(const float* w, std::int64_t rows, std::int64_t cols, weight_quant kind,
                   const float* row_absmax, void* q, float* scales) {
  const float top = kind == weight_quant::int8 ? 127.0f : e4m3_max;
  auto* out = static_cast<std::uint8_t*>(q);
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = w + r * cols;
    float absmax = 0.0f;
    if (row_absmax != nullptr) {
      absmax = row_absmax[r];
    } else {
      for (std::int64_t c = 0; c < cols; ++c) absmax = std::max(absmax, std::fabs(row[c]));
    }
    // An all-zero row keeps scale 1 and zero codes (a zero scale would divide by zero here).
    const float scale = absmax > 0.0f && std::isfinite(absmax) ? absmax / top : 1.0f;
    scales[r] = scale;
    std::uint8_t* o = out + r * cols;
    if (kind == weight_quant::int8) {
      for (std::int64_t c = 0; c < cols; ++c) {
        const float v = std::clamp(std::nearbyint(row[c] / scale), -127.0f, 127.0f);
        o[c] = static_cast<std::uint8_t>(static_cast<std::int8_t>(v));
      }
    } else {
      for (std::int64_t c = 0; c < cols; ++c) o[c] = f32_to_e4m3(row[c] / scale);
    }
  }
}

void dequantize_rows(const void* q, dtype type, const float* scales, std::int64_t row_begin, std::int64_t rows,
                     std::int64_t cols, float* out) {
  const auto* in = static_cast<const std::uint8_t*>(q);
  // A 256-entry table per type: the FP8 decode is the slow part otherwise.
  static const auto fp8_table = [] {
    struct t { float v[256]; } table{};
    for (int i = 0; i < 256; ++i) table.v[i] = e4m3_to_f32(static_cast<std::uint8_t>(i));
    return table;
  }();
  for (std::int64_t r = row_begin; r < row_begin + rows; ++r) {
    const std::uint8_t* src = in + r * cols;
    float* dst = out + (r - row_begin) * cols;
    const float s = scales[r];
    if (type == dtype::i8) {
      for (std::int64_t c = 0; c < cols; ++c) dst[c] = static_cast<float>(static_cast<std::int8_t>(src[c])) * s;
    } else {
      for (std::int64_t c = 0; c < cols; ++c) dst[c] = fp8_table.v[src[c]] * s;
    }
  }
}

}  // namespace conveyor::kernels
