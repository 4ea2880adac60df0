#include "conveyor/engine/kv_cache.hpp"

#include <algorithm>
#include <cassert>
#include <string>

namespace conveyor::engine {

kv_block_manager::kv_block_manager(int num_blocks, int block_size)
    : num_blocks_(num_blocks), block_size_(block_size) {
  assert(num_blocks >= 0 && block_size > 0);
  free_.reserve(num_blocks);
  // Hand out low ids first (pop from the back).
  for (int i = num_blocks - 1; i >= 0; --i) free_.push_back(i);
}

status kv_block_manager::reserve(std::int64_t seq, int tokens) {
  auto& table = tables_[seq];
  const int need = blocks_for(tokens) - static_cast<int>(table.size());
  if (need <= 0) return ok_status();
  if (need > free_blocks()) {
    if (table.empty()) tables_.erase(seq);
    return make_error(errc::out_of_memory, "KV cache full: sequence " + std::to_string(seq) + " needs " +
                                               std::to_string(need) + " more blocks, " +
                                               std::to_string(free_blocks()) + " free");
  }
  for (int i = 0; i < need; ++i) {
    table.push_back(free_.back());
    free_.pop_back();
  }
  return ok_status();
}

void kv_block_manager::truncate(std::int64_t seq, int tokens) {
  auto it = tables_.find(seq);
  if (it == tables_.end()) return;
  const std::size_t keep = static_cast<std::size_t>(blocks_for(std::max(tokens, 0)));
  auto& table = it->second;
  while (table.size() > keep) {
    free_.push_back(table.back());
    table.pop_back();
  }
}

void kv_block_manager::release(std::int64_t seq) {
  auto it = tables_.find(seq);
  if (it == tables_.end()) return;
  for (auto b : it->second) free_.push_back(b);
  tables_.erase(it);
}

const std::vector<std::int32_t>& kv_block_manager::table(std::int64_t seq) const {
  static const std::vector<std::int32_t> empty;
  auto it = tables_.find(seq);
  return it == tables_.end() ? empty : it->second;
}

std::size_t kv_pools::bytes_per_block(const kernels::backend& b, int num_layers, int block_size,
                                      int num_kv_heads, int head_dim) {
  return 2ull * num_layers * block_size * num_kv_heads * head_dim * kernels::dtype_size(b.caps().kv_dtype);
}

result<kv_pools> kv_pools::create(kernels::backend& b, int num_layers, int num_blocks, int block_size,
                                  int num_kv_heads, int head_dim) {
  kv_pools p;
  p.layout_ = kernels::kv_layout{num_blocks, block_size};
  const std::size_t per_layer = static_cast<std::size_t>(num_blocks) * block_size * num_kv_heads * head_dim *
                                kernels::dtype_size(b.caps().kv_dtype);
  for (int l = 0; l < num_layers; ++l) {
    p.k_.emplace_back(b, per_layer);
    p.v_.emplace_back(b, per_layer);
    if (!p.k_.back().valid() || !p.v_.back().valid()) {
      return make_error(errc::out_of_memory, "out of " + b.caps().name + " memory for the KV cache (" +
                                                 std::to_string(num_blocks) + " blocks × " +
                                                 std::to_string(num_layers) + " layers)");
    }
    p.bytes_ += 2 * per_layer;
  }
  return p;
}

}  // namespace conveyor::engine
