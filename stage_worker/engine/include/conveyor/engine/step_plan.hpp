#pragma once
// What one step of one stage computes: a batch of sequences, each with its new tokens and positions.
// Prefill (many new tokens) and decode (one) mix freely in a batch. The plan travels with the
// activations from stage to stage, so it holds everything any stage needs.
#include <cstdint>
#include <vector>

#include "conveyor/kernels/backend.hpp"

namespace conveyor::engine {

enum class logits_mode : std::uint8_t {
  none,  ///< only the sampled token is needed
  last,  ///< logits of the last new position
  all,   ///< logits of every new position (tests, scoring)
  sampled,  ///< logits of the `sample_rows` positions that are sampled (speculative verification;
            ///< in-process drivers only, frames do not carry it)
};

struct sequence_step {
  std::int64_t seq_id = 0;
  std::vector<std::int32_t> tokens;        ///< new token ids (their count is the step's length)
  std::int32_t start_pos = 0;              ///< position of tokens[0]; the cache holds [0, start_pos)
  std::vector<std::int32_t> block_table;   ///< covers [0, start_pos + tokens.size())
  logits_mode logits = logits_mode::none;
  bool sample = true;                      ///< the last stage draws the next token
  /// With `sample`, the last stage draws a token at each of the last `sample_rows` positions, not
  /// only the last one: a speculative verification pass (the new tokens are the last accepted token
  /// plus k draft tokens) learns in one step what the model would have drawn after each of them.
  /// Row i of the step draws with sampling.step - (tokens.size() - 1 - i), i.e. `sampling.step` is
  /// the step of the last row, as for a plain step. Not combined with logits_mode::all.
  int sample_rows = 1;
  kernels::sample_params sampling;
};

struct step_plan {
  std::vector<sequence_step> seqs;
  int num_tokens() const {
    int n = 0;
    for (const auto& s : seqs) n += static_cast<int>(s.tokens.size());
    return n;
  }
};

/// What a stage produces for one step.
struct step_output {
  std::vector<float> hidden;  ///< [num_tokens, hidden] from a stage without the head
  std::vector<float> logits;  ///< last stage: rows of each sequence that asked, in plan order
  std::vector<int> logits_offset;      ///< first row of sequence i in `logits` (-1 if none)
  std::vector<std::int32_t> tokens;    ///< last stage: sampled token per sequence (-1 if not sampled)
  /// Last stage: the tokens drawn at every sampled row (sample_rows per sampled sequence, by
  /// position; the last one is `tokens[i]`), sequence i's first at row_tokens_offset[i] (-1 if none).
  std::vector<std::int32_t> row_tokens;
  std::vector<int> row_tokens_offset;
};

}  // namespace conveyor::engine
