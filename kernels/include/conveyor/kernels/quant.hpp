#pragma once
// Weight-only quantization, done on the host when a checkpoint is loaded: int8 (symmetric, one
// float32 scale per output row) and FP8 E4M3 (OCP "e4m3fn": bias 7, max 448, no infinities, also
// one scale per row). Both backends read the very same bytes, so a CPU/GPU parity test compares
// arithmetic only. Host-only header.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "conveyor/kernels/dtype.hpp"

namespace conveyor::kernels {

/// How a stage stores its linear layers' weights.
enum class weight_quant : std::uint8_t {
  none,  ///< the backend's weight dtype (bf16 on CUDA, f32 on CPU)
  int8,  ///< i8, per-output-channel scale = max|row| / 127
  fp8,   ///< f8e4m3, per-output-channel scale = max|row| / 448
};

constexpr std::string_view weight_quant_name(weight_quant q) {
  switch (q) {
    case weight_quant::none: return "none";
    case weight_quant::int8: return "int8";
    case weight_quant::fp8: return "fp8";
  }
  return "?";
}

/// The element dtype of a quantized matrix (none: no quantized dtype, returns f32).
constexpr dtype weight_quant_dtype(weight_quant q) {
  return q == weight_quant::int8 ? dtype::i8 : q == weight_quant::fp8 ? dtype::f8e4m3 : dtype::f32;
}

/// Bytes a rows × cols matrix takes quantized: one byte per element + a float32 scale per row.
constexpr std::size_t quantized_matrix_bytes(std::size_t rows, std::size_t cols) { return rows * cols + rows * 4; }

/// Largest finite E4M3 value.
constexpr float e4m3_max = 448.0f;

/// Round to nearest even, saturating at ±448 (as torch's float8_e4m3fn cast with saturation);
/// NaN becomes the NaN code 0x7f.
std::uint8_t f32_to_e4m3(float f);
/// Exact: every E4M3 value is a float (subnormals are m · 2^-9).
float e4m3_to_f32(std::uint8_t b);

/// Quantizes a row-major rows × cols float32 matrix into `q` (rows × cols bytes of
/// weight_quant_dtype(kind)) and `scales` (rows floats). `row_absmax`, when given, is max|w| of each
/// full row: a column slice of a matrix (a row-parallel tensor-parallel shard) then gets the scales
/// of the whole rows, so every rank stores exactly the bytes an unsliced load would.
void quantize_rows(const float* w, std::int64_t rows, std::int64_t cols, weight_quant kind,
                   const float* row_absmax, void* q, float* scales);

/// Element (r, c) of a quantized matrix as float32: q[r, c] * scales[r].
void dequantize_rows(const void* q, dtype type, const float* scales, std::int64_t row_begin,
                     std::int64_t rows, std::int64_t cols, float* out);

}  // namespace conveyor::kernels
