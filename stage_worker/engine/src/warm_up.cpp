#include "conveyor/engine/warm_up.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>

namespace conveyor::engine {

namespace {
/// A step of `seqs` sequences of `tokens` new tokens each from position 0, sequence i in blocks
/// [i * per, (i + 1) * per): every key a step's attention reads is one the step itself wrote (a GPU's
/// KV pool is not zeroed, and stale bits may be NaN). One token a sequence is a decode step's shape
/// (recorded like one; its context is in the first bucket). Greedy draws; no logits back.
step_plan make_plan(int seqs, int tokens, int block_size) {
  step_plan plan;
  const int per = (tokens + block_size - 1) / block_size;
  for (int i = 0; i < seqs; ++i) {
    sequence_step s;  // start_pos 0
    s.seq_id = i;
    s.tokens.assign(static_cast<std::size_t>(tokens), 0);
    for (int b = 0; b < per; ++b) s.block_table.push_back(i * per + b);
    plan.seqs.push_back(std::move(s));
  }
  return plan;
}
}  // namespace

std::string warm_up_report::describe() const {
  std::string s = "warm-up: " + std::to_string(steps) + " steps in ";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f s", seconds);
  s += buf;
  if (!skipped.empty()) {
    s += " (skipped decode batches";
    for (std::size_t i = 0; i < skipped.size(); ++i) s += (i == 0 ? " " : ",") + std::to_string(skipped[i]);
    s += ": the KV pool holds fewer blocks)";
  }
  return s;
}

result<warm_up_report> warm_up(tp_stage& stage, const warm_up_options& o) {
  const stage_executor& ex = stage.rank0();
  const executor_options& eo = ex.options();
  const stage_range range = ex.range();
  for (int b : o.decode_batches) {
    if (b < 1 || b > eo.max_seqs || b > eo.max_step_tokens) {
      return make_error(errc::invalid_argument,
                        "warm-up decode batch " + std::to_string(b) + " is outside 1.." +
                            std::to_string(std::min(eo.max_seqs, eo.max_step_tokens)) +
                            " (the stage's max sequences and step tokens)");
    }
  }
  if (o.prefill_tokens < 0) {
    return make_error(errc::invalid_argument, "warm-up prefill tokens must be 0 or more, not " +
                                                  std::to_string(o.prefill_tokens));
  }
  const auto t0 = std::chrono::steady_clock::now();
  warm_up_report report;
  // Zero activations for a stage without the embedding, enough for the largest step.
  const int most = std::max(o.prefill_tokens, o.decode_batches.empty() ? 0 : *std::max_element(
                                                                               o.decode_batches.begin(),
                                                                               o.decode_batches.end()));
  std::vector<std::byte> zeros;
  if (!range.has_embedding) {
    zeros.assign(static_cast<std::size_t>(most) * ex.config().hidden_size * kernels::dtype_size(stage.act_dtype()),
                 std::byte{0});
  }
  const void* in = range.has_embedding ? nullptr : zeros.data();
  const int capacity = eo.kv_blocks * eo.kv_block_size;
  const int prefill = std::min({o.prefill_tokens, eo.max_step_tokens, capacity});
  if (prefill > 0) {
    CONVEYOR_TRY(stage.run_raw(make_plan(1, prefill, eo.kv_block_size), in, nullptr));
    ++report.steps;
  }
  for (int b : o.decode_batches) {
    if (b > eo.kv_blocks) {  // one block a sequence
      report.skipped.push_back(b);
      continue;
    }
    CONVEYOR_TRY(stage.run_raw(make_plan(b, 1, eo.kv_block_size), in, nullptr));
    ++report.steps;
  }
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

}  // namespace conveyor::engine
