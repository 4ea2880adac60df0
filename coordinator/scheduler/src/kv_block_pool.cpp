#include "conveyor/scheduler/kv_block_pool.hpp"

#include <algorithm>
#include <cassert>

namespace conveyor::scheduler {

kv_block_pool::kv_block_pool(int num_blocks, int block_size, bool caching)
    : num_blocks_(num_blocks), block_size_(block_size), caching_(caching), meta_(num_blocks) {
  assert(num_blocks >= 0 && block_size > 0);
  free_.reserve(num_blocks);
  // Hand out low ids first (pop from the back), as the engine's block manager does.
  for (int i = num_blocks - 1; i >= 0; --i) free_.push_back(i);
}

std::optional<std::int32_t> kv_block_pool::allocate() {
  std::int32_t b;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else if (!lru_.empty()) {
    b = lru_.front();
    lru_.pop_front();
    auto& m = meta_[b];
    by_hash_.erase(m.hash);
    m.published = false;
    m.tokens.clear();
    ++counters_.evicted_blocks;
  } else {
    return std::nullopt;
  }
  meta_[b].holds = 1;
  return b;
}

void kv_block_pool::release(std::int32_t block) {
  auto& m = meta_.at(block);
  assert(m.holds > 0);
  if (--m.holds > 0) return;
  if (m.published) {
    m.lru_pos = lru_.insert(lru_.end(), block);
  } else {
    free_.push_back(block);
  }
}

std::uint64_t kv_block_pool::chain_hash(std::uint64_t parent, std::span<const std::int32_t> tokens) {
  // splitmix64 finaliser over each token folded into the parent's hash: cheap, well mixed, and
  // lookups compare the tokens anyway, so a collision costs a miss, never a wrong answer.
  auto mix = [](std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  std::uint64_t h = mix(parent + 0x9e3779b97f4a7c15ull);
  for (auto t : tokens) h = mix(h ^ static_cast<std::uint32_t>(t));
  return h;
}

std::optional<std::int32_t> kv_block_pool::lookup(std::uint64_t hash, std::span<const std::int32_t> tokens) {
  if (!caching_) return std::nullopt;
  ++counters_.queried_blocks;
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return std::nullopt;
  auto& m = meta_[it->second];
  if (!std::equal(m.tokens.begin(), m.tokens.end(), tokens.begin(), tokens.end())) return std::nullopt;
  if (m.holds++ == 0) lru_.erase(m.lru_pos);
  ++counters_.hit_blocks;
  return it->second;
}

void kv_block_pool::publish(std::int32_t block, std::uint64_t hash, std::span<const std::int32_t> tokens) {
  if (!caching_) return;
  auto& m = meta_.at(block);
  assert(m.holds > 0 && static_cast<int>(tokens.size()) == block_size_);
  if (m.published || by_hash_.count(hash) != 0) return;
  m.published = true;
  m.hash = hash;
  m.tokens.assign(tokens.begin(), tokens.end());
  by_hash_.emplace(hash, block);
}

void kv_block_pool::forget_cached() {
  for (auto& m : meta_) {
    m.published = false;
    m.tokens.clear();
  }
  for (auto b : lru_) free_.push_back(b);
  lru_.clear();
  by_hash_.clear();
}

}  // namespace conveyor::scheduler
