#pragma once
// Launchers of the quantized-weight kernels (quant_linear.cu): i8 / f8e4m3 matrices with a float32
// scale per row, as kernels/include/conveyor/kernels/quant.hpp lays them out.
#include <cuda_runtime.h>

#include <cstdint>

#include "conveyor/kernels/dtype.hpp"

namespace conveyor::kernels::cuda {

/// Tokens the fused small-batch kernel takes; more go through dequantize + cuBLAS.
constexpr int quant_gemv_max_n = 16;
/// Shapes (and pointer alignments) the fused kernel takes: bf16 activations, cols % 16 == 0.
bool quant_gemv_supported(int n, int rows, int cols, const void* x, const void* q, const void* out);
/// out[n, rows] (bf16) = (x[n, cols] (bf16) · qᵀ) * scales[row] + bias[row] (bias may be nullptr),
/// dequantizing in registers: the weights cross HBM as one byte each.
void launch_quant_gemv(dtype qtype, const void* x, int n, const void* q, const float* scales, const float* bias,
                       int rows, int cols, void* out, cudaStream_t s);
/// Rows [row_begin, row_begin + rows) of q, times their scales, into dst [rows, cols] of type `t`
/// (bf16 or f32), for the cuBLAS path.
void launch_dequantize_rows(dtype t, dtype qtype, const void* q, const float* scales, int row_begin, int rows,
                            int cols, void* dst, cudaStream_t s);

}  // namespace conveyor::kernels::cuda
