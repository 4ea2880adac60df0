#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu_ops.hpp"

namespace conveyor::kernels::cpu {

void kv_write(const float* qkv, int n, const attn_shape& shape, const std::int32_t* slots,
              float* k_cache, float* v_cache) {
  const int hd = shape.head_dim;
  const std::size_t kv_width = static_cast<std::size_t>(shape.num_kv_heads) * hd;
  const std::size_t width = static_cast<std::size_t>(shape.num_heads) * hd + 2 * kv_width;
  for (int t = 0; t < n; ++t) {
    const float* row = qkv + t * width;
    const std::size_t slot = static_cast<std::size_t>(slots[t]);
    std::memcpy(k_cache + slot * kv_width, row + shape.num_heads * hd, kv_width * 4);
    std::memcpy(v_cache + slot * kv_width, row + shape.num_heads * hd + kv_width, kv_width * 4);
  }
}

void attention(const float* qkv, const attn_shape& shape, const attention_batch& batch,
               const kv_layout& layout, const float* k_cache, const float* v_cache, float* out) {
  const int hd = shape.head_dim;
  const int group = shape.num_heads / shape.num_kv_heads;
  const std::size_t kv_width = static_cast<std::size_t>(shape.num_kv_heads) * hd;
  const std::size_t width = static_cast<std::size_t>(shape.num_heads) * hd + 2 * kv_width;
  const std::size_t out_width = static_cast<std::size_t>(shape.num_heads) * hd;
  std::vector<float> scores(static_cast<std::size_t>(batch.max_ctx_len));
  std::vector<float> acc(hd);
  for (int s = 0; s < batch.num_seqs; ++s) {
    const int q0 = batch.q_start[s];
    const int q1 = batch.q_start[s + 1];
    const int ctx = batch.ctx_len[s];
    const std::int32_t* table = batch.block_table + static_cast<std::size_t>(s) * batch.max_blocks_per_seq;
    for (int i = q0; i < q1; ++i) {
      const int pos = ctx - (q1 - q0) + (i - q0);
      const int lo = shape.sliding_window > 0 ? std::max(0, pos - shape.sliding_window + 1) : 0;
      for (int h = 0; h < shape.num_heads; ++h) {
        const float* q = qkv + static_cast<std::size_t>(i) * width + static_cast<std::size_t>(h) * hd;
        const std::size_t kv_off = static_cast<std::size_t>(h / group) * hd;
        float max_score = -INFINITY;
        for (int j = lo; j <= pos; ++j) {
          const std::size_t slot = static_cast<std::size_t>(table[j / layout.block_size]) * layout.block_size +
                                   j % layout.block_size;
          const float* k = k_cache + slot * kv_width + kv_off;
          float dot = 0.0f;
          for (int d = 0; d < hd; ++d) dot += q[d] * k[d];
          dot *= shape.scale;
          scores[j - lo] = dot;
          max_score = std::max(max_score, dot);
        }
        double denom = 0.0;
        for (int j = lo; j <= pos; ++j) {
          scores[j - lo] = std::exp(scores[j - lo] - max_score);
          denom += scores[j - lo];
        }
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int j = lo; j <= pos; ++j) {
          const std::size_t slot = static_cast<std::size_t>(table[j / layout.block_size]) * layout.block_size +
                                   j % layout.block_size;
          const float* v = v_cache + slot * kv_width + kv_off;
          const float p = scores[j - lo];
          for (int d = 0; d < hd; ++d) acc[d] += p * v[d];
        }
        float* o = out + static_cast<std::size_t>(i) * out_width + static_cast<std::size_t>(h) * hd;
        const float inv = static_cast<float>(1.0 / denom);
        for (int d = 0; d < hd; ++d) o[d] = acc[d] * inv;
      }
    }
  }
}

}  // namespace conveyor::kernels::cpu
