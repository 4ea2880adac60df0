#pragma once
// Deterministic payloads and headers, so both processes can check bytes without sending references.
#include <cstdint>
#include <cstring>
#include <vector>

#include "conveyor/transport/frame.hpp"

namespace conveyor::transport::test {

/// Fills `n` bytes with a pattern that depends on `seed` and position (catches reordering and shifts).
inline void fill_pattern(std::byte* p, std::size_t n, std::uint64_t seed) {
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(p + i, &x, 8);
  }
  for (; i < n; ++i) p[i] = static_cast<std::byte>(seed + i);
}

inline std::vector<std::byte> pattern(std::size_t n, std::uint64_t seed) {
  std::vector<std::byte> v(n);
  fill_pattern(v.data(), n, seed);
  return v;
}

/// A logits frame of `bytes` (a multiple of 4) with a one-sequence plan; `blocks` grows the header.
inline frame_header test_header(std::uint64_t microbatch, std::size_t bytes, std::size_t blocks = 4) {
  frame_header h;
  h.kind = frame_kind::logits;
  h.microbatch_id = microbatch;
  h.step = microbatch * 3;
  sequence_plan s;
  s.seq_id = static_cast<std::int64_t>(microbatch) + 100;
  s.tokens = {1, 2, 3};
  s.start_pos = 5;
  for (std::size_t b = 0; b < blocks; ++b) s.block_table.push_back(static_cast<std::int32_t>(b));
  s.logits = logits_mode::last;
  s.sampling.temperature = 0.7f;
  s.sampling.top_k = 40;
  s.sampling.seed = microbatch;
  h.seqs.push_back(s);
  h.tensor.type = kernels::dtype::i32;
  h.tensor.shape = {static_cast<std::int64_t>(bytes / 4)};
  return h;
}

}  // namespace conveyor::transport::test
