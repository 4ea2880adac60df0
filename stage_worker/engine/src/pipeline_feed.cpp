#include "pipeline_feed.hpp"

#include <algorithm>
#include <chrono>

namespace conveyor::engine {

status advance(local_pipeline& pipe, std::vector<feed>& feeds, std::int64_t* steps, double* seconds) {
  const executor_options& o = pipe.options();
  const int vocab = pipe.config().vocab_size;
  for (;;) {
    step_plan plan;
    std::vector<feed*> who;
    int budget = o.max_step_tokens;
    for (feed& f : feeds) {
      if (budget <= 0 || static_cast<int>(plan.seqs.size()) >= o.max_seqs) break;
      const int size = static_cast<int>(f.tokens->size());
      const int pending = size - *f.cached;
      if (pending <= 0) continue;
      // The last chunk must hold every sampled row.
      const int take = pending <= budget ? pending : std::min(budget, pending - f.sample_rows);
      if (take <= 0) continue;
      CONVEYOR_TRY(pipe.blocks().reserve(f.seq, *f.cached + take));
      sequence_step s;
      s.seq_id = f.seq;
      s.tokens.assign(f.tokens->begin() + *f.cached, f.tokens->begin() + *f.cached + take);
      s.start_pos = *f.cached;
      s.block_table = pipe.blocks().table(f.seq);
      s.sample = *f.cached + take == size;
      if (s.sample) {
        s.sample_rows = f.sample_rows;
        s.sampling = f.params;
        s.sampling.step = static_cast<std::uint64_t>(size);
        s.logits = f.want_logits ? logits_mode::sampled : logits_mode::none;
      }
      plan.seqs.push_back(std::move(s));
      who.push_back(&f);
      budget -= take;
    }
    if (plan.seqs.empty()) return ok_status();
    const auto t0 = std::chrono::steady_clock::now();
    CONVEYOR_TRY_ASSIGN(out, pipe.step(plan));
    *seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++*steps;
    for (std::size_t i = 0; i < who.size(); ++i) {
      feed& f = *who[i];
      const auto& s = plan.seqs[i];
      *f.cached += static_cast<int>(s.tokens.size());
      if (!s.sample) continue;
      const auto r0 = out.row_tokens.begin() + out.row_tokens_offset[i];
      f.rows.assign(r0, r0 + f.sample_rows);
      if (f.want_logits) {
        const auto l0 = out.logits.begin() + static_cast<std::size_t>(out.logits_offset[i]) * vocab;
        f.logits.assign(l0, l0 + static_cast<std::size_t>(f.sample_rows) * vocab);
      }
    }
  }
}

}  // namespace conveyor::engine
