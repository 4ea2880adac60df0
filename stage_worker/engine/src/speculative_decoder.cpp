#include "conveyor/engine/speculative_decoder.hpp"

#include <algorithm>

#include "conveyor/engine/speculative_sampling.hpp"
#include "conveyor/kernels/sampling.hpp"
#include "pipeline_feed.hpp"

namespace conveyor::engine {

namespace {

bool sampled(const kernels::sample_params& p) { return p.temperature > 0.0f && p.top_k != 1; }

}  // namespace

result<std::unique_ptr<speculative_decoder>> speculative_decoder::create(local_pipeline& target, local_pipeline& draft,
                                                                         const speculative_options& options) {
  if (target.config().vocab_size != draft.config().vocab_size) {
    return make_error(errc::invalid_argument, "the draft model's vocabulary (" +
                                                  std::to_string(draft.config().vocab_size) +
                                                  " tokens) differs from the target's (" +
                                                  std::to_string(target.config().vocab_size) + ")");
  }
  if (options.k < 1 || options.k + 1 > target.options().max_step_tokens) {
    return make_error(errc::invalid_argument, "speculative k must be in [1, " +
                                                  std::to_string(target.options().max_step_tokens - 1) + "], got " +
                                                  std::to_string(options.k));
  }
  return std::unique_ptr<speculative_decoder>(new speculative_decoder(target, draft, options));
}

result<std::vector<generation_result>> speculative_decoder::generate(const std::vector<generation_request>& requests) {
  struct running {
    std::int64_t id;
    std::vector<std::int32_t> tokens;  // prompt, then generated
    std::size_t prompt_len;
    int target_cached = 0;
    int draft_cached = 0;
    bool done = false;
  };
  stats_ = {};
  std::vector<running> seqs;
  std::vector<generation_result> results(requests.size());
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const auto& r = requests[i];
    if (r.prompt.empty()) return make_error(errc::invalid_argument, "request " + std::to_string(i) + " has an empty prompt");
    if (r.max_new_tokens < 0) return make_error(errc::invalid_argument, "max_new_tokens must be >= 0");
    seqs.push_back(running{next_seq_id_++, r.prompt, r.prompt.size(), 0, 0, r.max_new_tokens == 0});
    if (seqs.back().done) results[i].finish_reason = "length";
  }
  auto release = [&](const running& s) {
    target_.blocks().release(s.id);
    draft_.blocks().release(s.id);
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
    std::vector<std::vector<std::vector<double>>> q(active.size());
    int rounds = 0;
    for (std::size_t a = 0; a < active.size(); ++a) {
      const running& s = seqs[active[a]];
      const int remaining = requests[active[a]].max_new_tokens - static_cast<int>(s.tokens.size() - s.prompt_len);
      kk[a] = std::min(options_.k, remaining - 1);
      work[a] = s.tokens;
      rounds = std::max(rounds, kk[a]);
    }
    std::vector<std::pair<float, std::int32_t>> scratch;
    for (int j = 0; j < rounds; ++j) {
      std::vector<feed> feeds;
      std::vector<std::size_t> of;
      for (std::size_t a = 0; a < active.size(); ++a) {
        if (j >= kk[a]) continue;
        running& s = seqs[active[a]];
        const auto& sp = requests[active[a]].sampling;
        feed f;
        f.seq = s.id;
        f.tokens = &work[a];
        f.cached = &s.draft_cached;
        f.params = sp;
        // Rejection sampling needs the draft's draws independent of the acceptance tests; exact
        // matching is likelier when the draft draws with the target's own random numbers.
        f.params.seed = options_.rejection_sampling ? draft_seed(sp.seed) : sp.seed;
        f.want_logits = options_.rejection_sampling && sampled(sp);
        feeds.push_back(std::move(f));
        of.push_back(a);
      }
      if (auto st = advance(draft_, feeds, &stats_.draft_steps, &stats_.draft_seconds); !st) return fail(st.err());
      for (std::size_t i = 0; i < feeds.size(); ++i) {
        const std::size_t a = of[i];
        if (feeds[i].want_logits) {
          q[a].emplace_back();
          warped_probs(feeds[i].logits.data(), draft_.config().vocab_size, feeds[i].params, q[a].back());
          // Rejection sampling needs the draft drawn from exactly q: draw it here from the same
          // logits (the device's draw could fall differently at a top-k/top-p boundary tie).
          kernels::sample_params p = feeds[i].params;
          p.step = work[a].size();
          work[a].push_back(kernels::sample_row(feeds[i].logits.data(), draft_.config().vocab_size, p, scratch));
        } else {
          work[a].push_back(feeds[i].rows[0]);
        }
      }
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
      // Roll back the KV of rejected drafts: positions past the kept ones are stale in both models.
      const int valid = static_cast<int>(len) + v.accepted;
      s.target_cached = std::min(s.target_cached, valid);
      s.draft_cached = std::min(s.draft_cached, valid);
      target_.blocks().truncate(s.id, s.target_cached);
      draft_.blocks().truncate(s.id, s.draft_cached);
    }
  }
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    results[i].tokens.assign(seqs[i].tokens.begin() + seqs[i].prompt_len, seqs[i].tokens.end());
    if (results[i].finish_reason.empty()) results[i].finish_reason = "length";
  }
  return results;
}

}  // namespace conveyor::engine
