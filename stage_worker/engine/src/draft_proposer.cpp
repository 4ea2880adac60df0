#include "conveyor/engine/draft_proposer.hpp"

#include <algorithm>

#include "pipeline_feed.hpp"

namespace conveyor::engine {

void draft_proposer::forget(std::int64_t seq) {
  draft_->blocks().release(seq);
  fed_.erase(seq);
}

void draft_proposer::forget_all() {
  for (const auto& [seq, tokens] : fed_) draft_->blocks().release(seq);
  fed_.clear();
}

std::vector<std::vector<std::int32_t>> draft_proposer::propose(const std::vector<draft_query>& queries) {
  std::vector<std::vector<std::int32_t>> out(queries.size());
  std::vector<std::vector<std::int32_t>> work(queries.size());
  std::vector<int> cached(queries.size(), 0);
  int rounds = 0;
  // Positions the draft can hold: a longer sequence gets no drafts (rather than failing the pass).
  const auto& o = draft_->options();
  const long long limit = std::min<long long>(static_cast<long long>(o.kv_blocks) * o.kv_block_size,
                                              std::max(draft_->config().max_position_embeddings, o.kv_block_size));
  std::vector<int> k(queries.size(), 0);
  for (std::size_t i = 0; i < queries.size(); ++i) {
    const auto& q = queries[i];
    if (static_cast<long long>(q.history.size()) + q.k > limit) continue;
    k[i] = q.k;
    auto& fed = fed_[q.seq];
    // Roll back to the common prefix of what the draft has seen and the verified history.
    const auto diverge = std::mismatch(fed.begin(), fed.end(), q.history.begin(), q.history.end()).first;
    fed.erase(diverge, fed.end());
    cached[i] = static_cast<int>(fed.size());
    if (cached[i] == static_cast<int>(q.history.size())) --cached[i];  // the last token's row draws
    draft_->blocks().truncate(q.seq, cached[i]);
    work[i].assign(q.history.begin(), q.history.end());
    rounds = std::max(rounds, k[i]);
  }
  for (int j = 0; j < rounds; ++j) {
    std::vector<feed> feeds;
    std::vector<std::size_t> of;
    for (std::size_t i = 0; i < queries.size(); ++i) {
      if (j >= k[i]) continue;
      feed f;
      f.seq = queries[i].seq;
      f.tokens = &work[i];
      f.cached = &cached[i];
      f.params = queries[i].sampling;
      feeds.push_back(std::move(f));
      of.push_back(i);
    }
    if (auto st = advance(*draft_, feeds, &counters_.steps, &counters_.seconds); !st) {
      // The draft KV is full (or the draft failed): start over next time, propose nothing now.
      ++counters_.out_of_memory;
      forget_all();
      return std::vector<std::vector<std::int32_t>>(queries.size());
    }
    for (std::size_t n = 0; n < feeds.size(); ++n) work[of[n]].push_back(feeds[n].rows[0]);
  }
  for (std::size_t i = 0; i < queries.size(); ++i) {
    if (k[i] == 0) continue;
    const std::size_t h = queries[i].history.size();
    out[i].assign(work[i].begin() + h, work[i].end());
    fed_[queries[i].seq].assign(work[i].begin(), work[i].begin() + cached[i]);
  }
  return out;
}

}  // namespace conveyor::engine
