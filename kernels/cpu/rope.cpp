#include <cmath>

#include "cpu_ops.hpp"

namespace conveyor::kernels::cpu {

namespace {
// HF's apply_rotary_pos_emb: x * cos + rotate_half(x) * sin, with cos/sin = cat(freqs, freqs).
void rotate_head(float* x, int half, const float* cos_t, const float* sin_t) {
  for (int i = 0; i < half; ++i) {
    const float a = x[i];
    const float b = x[i + half];
    x[i] = a * cos_t[i] - b * sin_t[i];
    x[i + half] = b * cos_t[i] + a * sin_t[i];
  }
}
}  // namespace

void rope(float* qkv, int n, const attn_shape& shape, const std::int32_t* positions,
          const float* inv_freq, float attention_scaling) {
  const int hd = shape.head_dim;
  const int half = hd / 2;
  const int width = (shape.num_heads + 2 * shape.num_kv_heads) * hd;
  float cos_t[1024];
  float sin_t[1024];
  for (int t = 0; t < n; ++t) {
    const float pos = static_cast<float>(positions[t]);
    for (int i = 0; i < half; ++i) {
      // The angle is rounded to float32 as torch does (inv_freq @ position_ids in float32).
      const float angle = pos * inv_freq[i];
      cos_t[i] = static_cast<float>(std::cos(static_cast<double>(angle))) * attention_scaling;
      sin_t[i] = static_cast<float>(std::sin(static_cast<double>(angle))) * attention_scaling;
    }
    float* row = qkv + static_cast<std::size_t>(t) * width;
    for (int h = 0; h < shape.num_heads + shape.num_kv_heads; ++h) {
      rotate_head(row + static_cast<std::size_t>(h) * hd, half, cos_t, sin_t);
    }
  }
}

}  // namespace conveyor::kernels::cpu
