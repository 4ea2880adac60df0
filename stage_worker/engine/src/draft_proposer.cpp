#include "conveyor/engine/draft_proposer.hpp"

#include <algorithm>

#include "conveyor/engine/speculative_sampling.hpp"
#include "conveyor/kernels/sampling.hpp"
#include "pipeline_feed.hpp"

namespace conveyor::engine {

namespace {

bool sampled(const kernels::sample_params& p) { return p.temperature > 0.0f && p.top_k != 1; }

}  // namespace

void draft_proposer::forget(std::int64_t seq) {
  draft_.blocks().release(seq);
  fed_.erase(seq);
}

void draft_proposer::forget_all() {
  for (const auto& [seq, tokens] : fed_) draft_.blocks().release(seq);
  fed_.clear();
}

status draft_proposer::check_vocabulary(int vocab_size) const {
  if (draft_.config().vocab_size == vocab_size) return ok_status();
  return make_error(errc::invalid_argument, "the draft model's vocabulary (" + std::to_string(draft_.config().vocab_size) +
                                                " tokens) differs from the target's (" + std::to_string(vocab_size) + ")");
}

std::vector<proposal> draft_proposer::propose(const std::vector<draft_query>& queries) {
  std::vector<proposal> out(queries.size());
  std::vector<std::vector<std::int32_t>> work(queries.size());
  std::vector<int> cached(queries.size(), 0);
  int rounds = 0;
  // Positions the draft can hold: a longer sequence gets no drafts (rather than failing the pass).
  const auto& o = draft_.options();
  const long long limit = std::min<long long>(static_cast<long long>(o.kv_blocks) * o.kv_block_size,
                                              std::max(draft_.config().max_position_embeddings, o.kv_block_size));
  std::vector<int> k(queries.size(), 0);
  for (std::size_t i = 0; i < queries.size(); ++i) {
    const auto& q = queries[i];
    if (q.k <= 0 || static_cast<long long>(q.history.size()) + q.k > limit) continue;
    k[i] = q.k;
    auto& fed = fed_[q.seq];
    // Roll back to the common prefix of what the draft has seen and the verified history.
    const auto diverge = std::mismatch(fed.begin(), fed.end(), q.history.begin(), q.history.end()).first;
    fed.erase(diverge, fed.end());
    cached[i] = static_cast<int>(fed.size());
    if (cached[i] == static_cast<int>(q.history.size())) --cached[i];  // the last token's row draws
    draft_.blocks().truncate(q.seq, cached[i]);
    work[i].assign(q.history.begin(), q.history.end());
    rounds = std::max(rounds, k[i]);
  }
  std::vector<std::pair<float, std::int32_t>> scratch;
  for (int j = 0; j < rounds; ++j) {
    std::vector<feed> feeds;
    std::vector<std::size_t> of;
    for (std::size_t i = 0; i < queries.size(); ++i) {
      if (j >= k[i]) continue;
      const auto& sp = queries[i].sampling;
      feed f;
      f.seq = queries[i].seq;
      f.tokens = &work[i];
      f.cached = &cached[i];
      f.params = sp;
      // Rejection sampling needs the draft's draws independent of the acceptance tests; exact
      // matching is likelier when the draft draws with the target's own random numbers.
      f.want_logits = queries[i].rejection_sampling && sampled(sp);
      if (f.want_logits) f.params.seed = draft_seed(sp.seed);
      feeds.push_back(std::move(f));
      of.push_back(i);
    }
    if (auto st = advance(draft_, feeds, &counters_.steps, &counters_.seconds); !st) {
      // The draft KV is full (or the draft failed): start over next time, propose nothing now.
      ++counters_.out_of_memory;
      forget_all();
      return std::vector<proposal>(queries.size());
    }
    for (std::size_t n = 0; n < feeds.size(); ++n) {
      const std::size_t i = of[n];
      if (!feeds[n].want_logits) {
        work[i].push_back(feeds[n].rows[0]);
        continue;
      }
      const int vocab = draft_.config().vocab_size;
      out[i].q.emplace_back();
      warped_probs(feeds[n].logits.data(), vocab, feeds[n].params, out[i].q.back());
      // Rejection sampling needs the draft drawn from exactly q: draw it here from the same logits
      // (the device's draw could fall differently at a top-k/top-p boundary tie).
      kernels::sample_params p = feeds[n].params;
      p.step = work[i].size();
      work[i].push_back(kernels::sample_row(feeds[n].logits.data(), vocab, p, scratch));
    }
  }
  for (std::size_t i = 0; i < queries.size(); ++i) {
    if (k[i] == 0) continue;
    const std::size_t h = queries[i].history.size();
    out[i].tokens.assign(work[i].begin() + h, work[i].end());
    fed_[queries[i].seq].assign(work[i].begin(), work[i].begin() + cached[i]);
  }
  return out;
}

}  // namespace conveyor::engine
