#include "conveyor/engine/speculative_decoder.hpp"

#include <algorithm>
#include <cassert>

#include "conveyor/engine/draft_proposer.hpp"
#include "conveyor/engine/speculative_sampling.hpp"
#include "conveyor/kernels/sampling.hpp"
#include "pipeline_feed.hpp"

namespace conveyor::engine {

namespace {

bool sampled(const kernels::sample_params& p) { return p.temperature > 0.0f && p.top_k != 1; }

status check_k(const local_pipeline& target, int k) {
  if (k >= 1 && k + 1 <= target.options().max_step_tokens) return ok_status();
  return make_error(errc::invalid_argument, "speculative k must be in [1, " +
                                                std::to_string(target.options().max_step_tokens - 1) + "], got " +
                                                std::to_string(k));
}

}  // namespace

result<std::unique_ptr<speculative_decoder>> speculative_decoder::create(local_pipeline& target, local_pipeline& draft,
                                                                         const speculative_options& options) {
  auto proposer = std::make_unique<draft_proposer>(draft);
  CONVEYOR_TRY(proposer->check_vocabulary(target.config().vocab_size));
  CONVEYOR_TRY(check_k(target, options.k));
  token_proposer& p = *proposer;
  return std::unique_ptr<speculative_decoder>(new speculative_decoder(target, std::move(proposer), p, options));
}

result<std::unique_ptr<speculative_decoder>> speculative_decoder::create(local_pipeline& target, token_proposer& proposer,
                                                                         const speculative_options& options) {
  CONVEYOR_TRY(proposer.check_vocabulary(target.config().vocab_size));
  CONVEYOR_TRY(check_k(target, options.k));
  return std::unique_ptr<speculative_decoder>(new speculative_decoder(target, nullptr, proposer, options));
}

result<std::vector<generation_result>> speculative_decoder::generate(const std::vector<generation_request>& requests) {
  struct running {
    std::int64_t id;
    std::vector<std::int32_t> tokens;  // prompt, then generated
    std::size_t prompt_len;
    int target_cached = 0;
    bool done = false;
  };
  stats_ = {};
  std::vector<running> seqs;
  std::vector<generation_result> results(requests.size());
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const auto& r = requests[i];
    if (r.prompt.empty()) return make_error(errc::invalid_argument, "request " + std::to_string(i) + " has an empty prompt");
    if (r.max_new_tokens < 0) return make_error(errc::invalid_argument, "max_new_tokens must be >= 0");
    seqs.push_back(running{next_seq_id_++, r.prompt, r.prompt.size(), 0, r.max_new_tokens == 0});
    if (seqs.back().done) results[i].finish_reason = "length";
  }
  auto release = [&](const running& s) {
    target_.blocks().release(s.id);
    proposer_.forget(s.id);
  };
  auto fail = [&](error e) -> result<std::vector<generation_result>> {
    for (const auto& s : seqs) release(s);
    return e;
  };
  const auto& eos = target_.config().eos_token_ids;
  // The prompt goes through the target alone first, as in plain decoding, and the token it draws is
  // the first one out. Merged into the first verification pass instead, a prompt longer than the
  // row-invariant kernels cover would be computed by a GEMM k rows bigger than plain decoding's,
  // which may round its KV differently in bf16; this way the prompt's KV and first token come from
  // the very steps plain decoding runs. Counted as a round of no proposals
  // (what plain decoding gains per step).
  {
    std::vector<feed> feeds;
    std::vector<std::size_t> of;
    for (std::size_t i = 0; i < seqs.size(); ++i) {
      if (seqs[i].done) continue;
      feed f;
      f.seq = seqs[i].id;
      f.tokens = &seqs[i].tokens;
      f.cached = &seqs[i].target_cached;
      f.params = requests[i].sampling;
      feeds.push_back(std::move(f));
      of.push_back(i);
    }
    if (auto st = advance(target_, feeds, &stats_.target_steps, &stats_.target_seconds); !st) return fail(st.err());
    for (std::size_t j = 0; j < feeds.size(); ++j) {
      running& s = seqs[of[j]];
      const std::int32_t tok = feeds[j].rows[0];
      s.tokens.push_back(tok);
      ++stats_.emitted;
      ++stats_.rounds;
      const bool is_eos = requests[of[j]].stop_at_eos && std::find(eos.begin(), eos.end(), tok) != eos.end();
      if (is_eos || s.tokens.size() - s.prompt_len >= static_cast<std::size_t>(requests[of[j]].max_new_tokens)) {
        s.done = true;
        results[of[j]].finish_reason = is_eos ? "stop" : "length";
        release(s);
      }
    }
  }
  for (;;) {
    std::vector<std::size_t> active;
    for (std::size_t i = 0; i < seqs.size(); ++i)
      if (!seqs[i].done) active.push_back(i);
    if (active.empty()) break;

    // Draft k tokens per sequence (fewer near max_new_tokens: the target adds one of its own).
    std::vector<int> kk(active.size());
    std::vector<std::vector<std::int32_t>> work(active.size());  // tokens + proposals
    std::vector<draft_query> queries(active.size());
    for (std::size_t a = 0; a < active.size(); ++a) {
      const running& s = seqs[active[a]];
      const int remaining = requests[active[a]].max_new_tokens - static_cast<int>(s.tokens.size() - s.prompt_len);
      queries[a] = {s.id, s.tokens, requests[active[a]].sampling, std::min(options_.k, remaining - 1),
                    options_.rejection_sampling};
    }
    const draft_counters before = proposer_.counters();
    std::vector<proposal> proposals = proposer_.propose(queries);
    stats_.draft_steps += proposer_.counters().steps - before.steps;
    stats_.draft_seconds += proposer_.counters().seconds - before.seconds;
    std::vector<std::vector<std::vector<double>>> q(active.size());
    for (std::size_t a = 0; a < active.size(); ++a) {
      const auto& d = proposals[a].tokens;
      assert(static_cast<int>(d.size()) <= std::max(queries[a].k, 0) && "a proposer returned more than k tokens");
      assert((proposals[a].q.empty() || proposals[a].q.size() == d.size()) && "one q row per proposed token");
      kk[a] = static_cast<int>(d.size());
      work[a] = seqs[active[a]].tokens;
      work[a].insert(work[a].end(), d.begin(), d.end());
      q[a] = std::move(proposals[a].q);
    }

    // Verify every proposal in one target pass per sequence.
    std::vector<feed> feeds;
    for (std::size_t a = 0; a < active.size(); ++a) {
      running& s = seqs[active[a]];
      const auto& sp = requests[active[a]].sampling;
      feed f;
      f.seq = s.id;
      f.tokens = &work[a];
      f.cached = &s.target_cached;
      f.sample_rows = kk[a] + 1;
      f.params = sp;
      f.want_logits = options_.rejection_sampling && sampled(sp) && kk[a] > 0;
      feeds.push_back(std::move(f));
    }
    if (auto st = advance(target_, feeds, &stats_.target_steps, &stats_.target_seconds); !st) return fail(st.err());

    const int vocab = target_.config().vocab_size;
    for (std::size_t a = 0; a < active.size(); ++a) {
      running& s = seqs[active[a]];
      const auto& req = requests[active[a]];
      const std::size_t len = s.tokens.size();
      const std::span<const std::int32_t> drafts(work[a].data() + len, kk[a]);
      verify_outcome v;
      if (feeds[a].want_logits) {
        std::vector<std::vector<double>> p(kk[a] + 1);
        for (int r = 0; r <= kk[a]; ++r) {
          kernels::sample_params sp = req.sampling;
          warped_probs(feeds[a].logits.data() + static_cast<std::size_t>(r) * vocab, vocab, sp, p[r]);
        }
        if (q[a].empty()) {
          // The proposer chose its tokens outright: each one's distribution is one-hot on it.
          for (std::int32_t d : drafts) {
            q[a].emplace_back(static_cast<std::size_t>(vocab), 0.0);
            q[a].back()[d] = 1.0;
          }
        }
        v = verify_rejection(drafts, p, q[a], req.sampling.seed, len);
      } else {
        v = verify_exact(drafts, feeds[a].rows);
      }
      stats_.proposed += kk[a];
      stats_.accepted += v.accepted;
      ++stats_.rounds;
      // Emit the kept drafts and the target's token, stopping at EOS or the length limit.
      std::vector<std::int32_t> emit(drafts.begin(), drafts.begin() + v.accepted);
      emit.push_back(v.next);
      for (std::int32_t tok : emit) {
        s.tokens.push_back(tok);
        ++stats_.emitted;
        const bool is_eos = req.stop_at_eos && std::find(eos.begin(), eos.end(), tok) != eos.end();
        if (is_eos || s.tokens.size() - s.prompt_len >= static_cast<std::size_t>(req.max_new_tokens)) {
          s.done = true;
          results[active[a]].finish_reason = is_eos ? "stop" : "length";
          break;
        }
      }
      if (s.done) {
        release(s);
        continue;
      }
      // Roll back the KV of rejected drafts: positions past the kept ones are stale (the proposer rolls back its own).
      const int valid = static_cast<int>(len) + v.accepted;
      s.target_cached = std::min(s.target_cached, valid);
      target_.blocks().truncate(s.id, s.target_cached);
    }
  }
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    results[i].tokens.assign(seqs[i].tokens.begin() + seqs[i].prompt_len, seqs[i].tokens.end());
    if (results[i].finish_reason.empty()) results[i].finish_reason = "length";
  }
  return results;
}

}  // namespace conveyor::engine
