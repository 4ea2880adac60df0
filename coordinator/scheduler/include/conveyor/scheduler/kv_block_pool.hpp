#pragma once
// The scheduler's view of the stages' KV blocks: reference-counted blocks plus a prefix cache. A full
// block is named by the hash of its tokens chained with the hash of everything before it, so two
// sequences with the same first k·block_size tokens can share those k blocks (the stages never
// rewrite a full block: positions only grow). Blocks nobody holds stay cached until a new block is
// needed, then the least recently used one is evicted.
#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace conveyor::scheduler {

/// Counters of the prefix cache, for stats and tests.
struct prefix_cache_counters {
  std::int64_t queried_blocks = 0;  ///< full prompt blocks looked up
  std::int64_t hit_blocks = 0;      ///< of those, found cached (their prefill was skipped)
  std::int64_t evicted_blocks = 0;  ///< cached blocks given to new data
};

class kv_block_pool {
 public:
  /// `caching` off: blocks are never published, lookups always miss.
  kv_block_pool(int num_blocks, int block_size, bool caching);

  int num_blocks() const { return num_blocks_; }
  int block_size() const { return block_size_; }
  int blocks_for(int tokens) const { return (tokens + block_size_ - 1) / block_size_; }
  /// Blocks a new sequence could get now: never used, or cached but held by nobody.
  int free_blocks() const { return static_cast<int>(free_.size() + lru_.size()); }
  /// Blocks that hold a published prefix (held or not).
  int cached_blocks() const { return static_cast<int>(by_hash_.size()); }
  bool caching() const { return caching_; }
  const prefix_cache_counters& counters() const { return counters_; }

  /// A block for new data, held once; evicts the least recently used cached block when no plain
  /// free block is left. nullopt when every block is held.
  std::optional<std::int32_t> allocate();
  /// Drops one hold; a cached block nobody holds becomes evictable, any other block free.
  void release(std::int32_t block);

  /// The hash naming a full block of `tokens` that follows a prefix hashed `parent` (0 for none).
  static std::uint64_t chain_hash(std::uint64_t parent, std::span<const std::int32_t> tokens);
  /// The cached block named `hash` holding `tokens`, held once more; nullopt on a miss.
  std::optional<std::int32_t> lookup(std::uint64_t hash, std::span<const std::int32_t> tokens);
  /// Names a held, full block whose KV is on every stage, so later prompts can share it. No-op when
  /// another block already has this name (two sequences computed the same prefix at once).
  void publish(std::int32_t block, std::uint64_t hash, std::span<const std::int32_t> tokens);
  /// Forgets every published prefix (a restarted stage lost the KV they name): cached blocks nobody
  /// holds become free, held ones free when released.
  void forget_cached();

 private:
  struct block_meta {
    int holds = 0;
    bool published = false;
    std::uint64_t hash = 0;
    std::vector<std::int32_t> tokens;  ///< checked on lookup, so a hash collision is only a miss
    std::list<std::int32_t>::iterator lru_pos;
  };

  int num_blocks_;
  int block_size_;
  bool caching_;
  std::vector<block_meta> meta_;
  std::vector<std::int32_t> free_;  ///< never used or unpublished: no data worth keeping
  std::list<std::int32_t> lru_;     ///< published, held by nobody: front = least recently used
  std::unordered_map<std::uint64_t, std::int32_t> by_hash_;
  prefix_cache_counters counters_;
};

}  // namespace conveyor::scheduler
