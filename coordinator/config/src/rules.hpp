#pragma once
// The ranges a value may take, shared by the TOML reader and the command-line overrides so that a
// key and its flag accept exactly the same values and say so in the same words.
#include <cstdint>
#include <limits>
#include <string>

namespace conveyor::config::detail {

/// An inclusive integer range; `max` = int64 max means "no upper bound".
struct int_rule {
  std::int64_t min;
  std::int64_t max;
};

/// A range of reals; `min_exclusive` for "> 0" style bounds (a zero timeout would fire at once).
struct real_rule {
  double min;
  bool min_exclusive;
  double max;
};

/// "must be an integer from 1 to 1024" / "must be an integer >= 0".
std::string allowed(const int_rule& r);
/// "must be a number > 0 and <= 86400".
std::string allowed(const real_rule& r);

inline bool accepts(const int_rule& r, std::int64_t v) { return v >= r.min && v <= r.max; }
inline bool accepts(const real_rule& r, double v) {
  return (r.min_exclusive ? v > r.min : v >= r.min) && v <= r.max;
}

namespace rules {
inline constexpr std::int64_t unbounded = std::numeric_limits<std::int64_t>::max();
// Upper bounds are sanity limits far above any real cluster: they catch typos (an extra zero),
// and keep every value inside `int`.
inline constexpr int_rule stages{1, 1024};
inline constexpr int_rule tp{1, 64};
inline constexpr int_rule chunks{1, 1024};
inline constexpr int_rule layer_count{1, 100000};
inline constexpr int_rule draft_layers{0, 100000};  // 0 = the whole draft model
inline constexpr int_rule spec_k{0, 64};            // 0 = no speculative decoding
inline constexpr int_rule ngram_n{1, 64};           // ngram_proposer::max_ngram
inline constexpr int_rule host_gpus{0, 1024};
inline constexpr int_rule gpus_per_worker{1, 1024};
inline constexpr int_rule device_id{0, 1023};
inline constexpr int_rule port{0, 65535};
inline constexpr int_rule max_frame_bytes{4096, std::int64_t{1} << 40};
inline constexpr int_rule max_stage_restarts{0, 1000};
inline constexpr int_rule max_batch_size{1, 1 << 20};
inline constexpr int_rule max_batch_delay_ms{0, 3600 * 1000};
inline constexpr int_rule max_batch_tokens{1, 1 << 30};
inline constexpr int_rule job_queue_size{0, 1 << 30};
inline constexpr int_rule max_queued_tokens{0, std::int64_t{1} << 50};
inline constexpr int_rule workers{1, 1024};
inline constexpr int_rule kv_block_size{1, 4096};
inline constexpr int_rule kv_blocks{1, 1 << 30};
inline constexpr int_rule max_context{1, 1 << 30};
inline constexpr real_rule seconds{0.0, true, 7 * 24 * 3600.0};
inline constexpr real_rule fraction{0.0, true, 1.0};
inline constexpr real_rule gpu_memory_gib{0.0, false, 1 << 20};
}  // namespace rules

}  // namespace conveyor::config::detail
