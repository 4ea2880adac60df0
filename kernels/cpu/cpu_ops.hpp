#pragma once
// Float32 reference kernels of the CPU backend. Every CUDA op is checked against these.
#include <cstddef>
#include <cstdint>

#include "conveyor/kernels/backend.hpp"

namespace conveyor::kernels::cpu {

void rmsnorm(const float* x, int n, int width, const float* w, float eps, float* out);
void add_rmsnorm(float* residual, const float* x, int n, int width, const float* w, float eps,
                 float* out);
void linear(const float* x, int n, const float* w, int rows, int cols, const float* bias, float* out);
/// linear with an i8 / f8e4m3 weight and per-row scales: row tiles are dequantized into `scratch`
/// (tile_floats floats) and multiplied with OpenBLAS, so the result is that of the dequantized matrix.
void linear_quant(const float* x, int n, const void* q, dtype type, const float* scales, int rows, int cols,
                  const float* bias, float* out, float* scratch, std::size_t tile_floats);
void rope(float* qkv, int n, const attn_shape& shape, const std::int32_t* positions,
          const float* inv_freq, float attention_scaling);
void kv_write(const float* qkv, int n, const attn_shape& shape, const std::int32_t* slots,
              float* k_cache, float* v_cache);
void attention(const float* qkv, const attn_shape& shape, const attention_batch& batch,
               const kv_layout& layout, const float* k_cache, const float* v_cache, float* out);
void silu_mul(const float* gate_up, int n, int ffn, float* out);

}  // namespace conveyor::kernels::cpu
