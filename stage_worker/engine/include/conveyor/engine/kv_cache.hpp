#pragma once
// Paged KV cache. The pools (device memory, one K and one V pool per layer of a stage) live with the
// stage; the block bookkeeping lives with whoever schedules sequences. Every stage of a pipeline has
// the same number of blocks, so one block table addresses a sequence's KV on all of them.
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "conveyor/base/result.hpp"
#include "conveyor/engine/device_buffer.hpp"
#include "conveyor/kernels/backend.hpp"

namespace conveyor::engine {

/// Free list of block ids and per-sequence block tables.
class kv_block_manager {
 public:
  kv_block_manager(int num_blocks, int block_size);

  int block_size() const { return block_size_; }
  int num_blocks() const { return num_blocks_; }
  int free_blocks() const { return static_cast<int>(free_.size()); }
  /// Blocks needed to hold `tokens` tokens.
  int blocks_for(int tokens) const { return (tokens + block_size_ - 1) / block_size_; }

  /// Grows sequence `seq`'s table to cover `tokens` tokens; out_of_memory leaves it unchanged.
  status reserve(std::int64_t seq, int tokens);
  /// Rolls sequence `seq` back to its first `tokens` tokens (speculative decoding drops the KV of
  /// rejected draft tokens): blocks past them return to the free list. The KV inside a kept block
  /// needs no clearing: attention reads only [0, context) and the next step overwrites the rest.
  void truncate(std::int64_t seq, int tokens);
  /// Returns the sequence's blocks to the free list (no-op for an unknown sequence).
  void release(std::int64_t seq);
  const std::vector<std::int32_t>& table(std::int64_t seq) const;
  bool has(std::int64_t seq) const { return tables_.count(seq) != 0; }

 private:
  int num_blocks_;
  int block_size_;
  std::vector<std::int32_t> free_;
  std::unordered_map<std::int64_t, std::vector<std::int32_t>> tables_;
};

/// The K and V pools of a stage's layers in backend memory.
class kv_pools {
 public:
  /// Bytes needed per block across `num_layers` layers (K and V).
  static std::size_t bytes_per_block(const kernels::backend& b, int num_layers, int block_size,
                                     int num_kv_heads, int head_dim);
  static result<kv_pools> create(kernels::backend& b, int num_layers, int num_blocks, int block_size,
                                 int num_kv_heads, int head_dim);

  void* k(int layer) const { return k_[layer].get(); }
  void* v(int layer) const { return v_[layer].get(); }
  kernels::kv_layout layout() const { return layout_; }
  std::size_t bytes() const { return bytes_; }

 private:
  std::vector<device_buffer> k_, v_;
  kernels::kv_layout layout_;
  std::size_t bytes_ = 0;
};

}  // namespace conveyor::engine
