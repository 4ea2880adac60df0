#include "conveyor/engine/tensor_parallel.hpp"

#include <string>

namespace conveyor::engine {

result<tp_layout> make_tp_layout(const model_config& c, int rank, int size) {
  if (size < 1 || rank < 0 || rank >= size) {
    return make_error(errc::invalid_argument, "tensor-parallel rank " + std::to_string(rank) + " of " + std::to_string(size));
  }
  const bool kv_split = c.num_kv_heads % size == 0;
  const bool kv_replicated = size % c.num_kv_heads == 0;
  if (c.num_heads % size != 0 || (!kv_split && !kv_replicated) || c.intermediate_size < size) {
    std::string allowed;
    for (int t = 1; t <= c.num_heads; ++t) {
      if (c.num_heads % t == 0 && (c.num_kv_heads % t == 0 || t % c.num_kv_heads == 0)) {
        allowed += (allowed.empty() ? "" : ", ") + std::to_string(t);
      }
    }
    return make_error(errc::invalid_argument, "tensor-parallel degree " + std::to_string(size) + " must divide the " +
                                                  std::to_string(c.num_heads) + " attention heads and divide or be a multiple of the " +
                                                  std::to_string(c.num_kv_heads) + " KV heads (allowed: " + allowed + ")");
  }
  tp_layout t;
  t.rank = rank;
  t.size = size;
  t.heads = c.num_heads / size;
  t.head_begin = rank * t.heads;
  if (kv_split) {
    t.kv_heads = c.num_kv_heads / size;
    t.kv_head_begin = rank * t.kv_heads;
  } else {
    // Fewer KV heads than ranks: each rank keeps the one KV head its query heads read.
    t.kv_heads = 1;
    t.kv_head_begin = rank / (size / c.num_kv_heads);
  }
  const std::int64_t f = c.intermediate_size;
  t.ffn_begin = static_cast<int>(f * rank / size);
  t.ffn = static_cast<int>(f * (rank + 1) / size) - t.ffn_begin;
  return t;
}

}  // namespace conveyor::engine
