// Planning a microbatch's next step: which sequences run, how many tokens each carries, and the KV
// blocks they need: admission by batching mode, per-step block growth, preemption of the newest
// sequences under KV pressure, and prefix-cache hits that skip prefill.
#include <algorithm>
#include <cassert>

#include "conveyor/scheduler/batch_scheduler.hpp"

namespace conveyor::scheduler {

bool batch_scheduler::admission_open(int m, clock::time_point now) const {
  if (waiting_.empty()) return false;
  // Sequences that gave their blocks back come first: a newcomer would only take blocks they need.
  if (preempted_now_ > 0) return false;
  const auto& p = options_.policy;
  switch (p.batching) {
    case service::batching_mode::continuous:
      return true;
    case service::batching_mode::dynamic: {
      if (!members_[m].empty()) return false;  // the running batch goes to the end first
      const bool full = static_cast<int>(waiting_.size()) >= options_.max_seqs_per_step;
      const auto waited = now - seqs_.at(waiting_.front()).submitted;
      return full || flush_ || waited >= std::chrono::milliseconds(p.max_batch_delay_ms);
    }
    case service::batching_mode::fixed:
      if (!members_[m].empty()) return false;
      return flush_ || static_cast<int>(waiting_.size()) >= options_.max_seqs_per_step;
  }
  return false;
}

void batch_scheduler::drop_blocks(sequence& s) {
  for (auto b : s.blocks) pool_.release(b);
  s.blocks.clear();
  s.published = 0;
  s.chain = 0;
  s.cached = 0;
}

void batch_scheduler::preempt(sequence& s) {
  assert(!s.in_step && !s.preempted && s.microbatch >= 0);
  // The token history stays: re-prefilling it gives the same KV, and the next token is drawn with
  // the same sampling step, so results do not change. Its published blocks stay cached (and
  // evictable), so a re-prefill often finds most of them.
  drop_blocks(s);
  s.preempted = true;
  ++preempted_now_;
  ++preemptions_;
}

bool batch_scheduler::preempt_newer_than(std::uint64_t id) {
  // The newest sequence that holds blocks and is not being written by a step in flight.
  for (auto it = seqs_.rbegin(); it != seqs_.rend() && it->first > id; ++it) {
    sequence& v = it->second;
    if (v.microbatch < 0 || v.preempted || v.in_step || v.blocks.empty()) continue;
    preempt(v);
    return true;
  }
  return false;
}

bool batch_scheduler::grow(sequence& s, int tokens, bool may_preempt) {
  const int need = pool_.blocks_for(tokens);
  while (static_cast<int>(s.blocks.size()) < need) {
    auto b = pool_.allocate();
    if (!b) {
      if (may_preempt && preempt_newer_than(s.id)) continue;
      return false;
    }
    s.blocks.push_back(*b);
  }
  return true;
}

bool batch_scheduler::enter(sequence& s, bool may_preempt) {
  assert(s.blocks.empty() && s.cached == 0);
  const int bs = pool_.block_size();
  const int total = static_cast<int>(s.tokens.size());
  // Full blocks of the history found in the prefix cache need no prefill. At least the last token
  // is always computed, since its logits give the next token.
  if (pool_.caching()) {
    for (int j = 0; (j + 1) * bs <= total - 1; ++j) {
      std::span<const std::int32_t> block(s.tokens.data() + j * bs, bs);
      const auto h = kv_block_pool::chain_hash(s.chain, block);
      auto hit = pool_.lookup(h, block);
      if (!hit) break;
      s.blocks.push_back(*hit);
      s.chain = h;
      s.published = j + 1;
      s.cached = (j + 1) * bs;
    }
  }
  // The whole history's blocks at once: a sequence that starts should not stall halfway through
  // its prefill (per-step growth then covers the generated tokens).
  const int missing = pool_.blocks_for(total) - static_cast<int>(s.blocks.size());
  if (!may_preempt && missing > pool_.free_blocks()) {
    drop_blocks(s);
    return false;
  }
  if (!grow(s, total, may_preempt)) {
    drop_blocks(s);
    return false;
  }
  return true;
}

void batch_scheduler::publish_full_blocks(sequence& s) {
  if (!pool_.caching()) return;
  const int bs = pool_.block_size();
  // Accepted draft tokens are in the KV before they join s.tokens (complete() appends them after).
  const int known = std::min(s.cached, static_cast<int>(s.tokens.size()));
  const int full = std::min(known / bs, static_cast<int>(s.blocks.size()));
  for (int j = s.published; j < full; ++j) {
    std::span<const std::int32_t> block(s.tokens.data() + j * bs, bs);
    s.chain = kv_block_pool::chain_hash(s.chain, block);
    pool_.publish(s.blocks[j], s.chain, block);
    s.published = j + 1;
  }
}

bool batch_scheduler::plan_sequence(int m, sequence& s, int& budget, engine::step_plan& plan) {
  const int pending = static_cast<int>(s.tokens.size()) - s.cached;
  const int take = std::min(pending, budget);
  if (take <= 0) return false;
  if (!grow(s, s.cached + take, true)) return false;  // older sequences hold every block: wait
  engine::sequence_step step;
  step.seq_id = static_cast<std::int64_t>(s.id);
  step.tokens.assign(s.tokens.begin() + s.cached, s.tokens.begin() + s.cached + take);
  step.start_pos = s.cached;
  step.block_table = s.blocks;
  step.sample = s.cached + take == static_cast<int>(s.tokens.size());
  step.sampling = s.request.sampling;
  step.sampling.step = s.tokens.size();
  plan.seqs.push_back(std::move(step));
  step_seqs_[m].push_back({s.id, take, {}});
  s.in_step = true;
  budget -= take;
  return true;
}

void batch_scheduler::add_drafts(int m, int& budget, engine::step_plan& plan) {
  if (options_.draft == nullptr || options_.spec_k <= 0) return;
  std::vector<engine::draft_query> queries;
  std::vector<std::size_t> at;
  for (std::size_t i = 0; i < plan.seqs.size() && budget > 0; ++i) {
    const engine::sequence_step& step = plan.seqs[i];
    if (!step.sample || step.tokens.size() != 1) continue;  // prefill chunks carry no drafts
    sequence& s = seqs_.at(step_seqs_[m][i].id);
    const int len = static_cast<int>(s.tokens.size());
    // A step emits up to k + 1 tokens: stay within max_new_tokens and the context.
    int k = std::min({options_.spec_k, s.request.max_new_tokens - (len - s.prompt_len) - 1,
                      options_.max_context - len - 1, budget});
    if (k <= 0) continue;
    // Blocks for the drafts only where free: drafts never preempt anyone.
    grow(s, len + k, false);
    k = std::min(k, static_cast<int>(s.blocks.size()) * pool_.block_size() - len);
    if (k <= 0) continue;
    queries.push_back({static_cast<std::int64_t>(s.id), s.tokens, s.request.sampling, k});
    at.push_back(i);
    budget -= k;
  }
  if (queries.empty()) return;
  const auto proposals = options_.draft->propose(queries);
  for (std::size_t q = 0; q < queries.size(); ++q) {
    const auto& d = proposals[q].tokens;
    if (d.empty()) continue;
    engine::sequence_step& step = plan.seqs[at[q]];
    step_entry& entry = step_seqs_[m][at[q]];
    const sequence& s = seqs_.at(entry.id);
    step.tokens.insert(step.tokens.end(), d.begin(), d.end());
    step.sample_rows = 1 + static_cast<int>(d.size());
    step.sampling.step = s.tokens.size() + d.size();  // the last row's draw; row i draws position len + i
    step.block_table = s.blocks;
    entry.tokens += static_cast<int>(d.size());
    entry.drafts = d;
  }
}

std::optional<engine::step_plan> batch_scheduler::next_step(int m, clock::time_point now) {
  tick(now);
  if (in_flight_[m]) return std::nullopt;
  engine::step_plan plan;
  int budget = options_.max_step_tokens;
  // Oldest first: they get tokens and blocks before newer ones, and may preempt newer ones.
  auto& mem = members_[m];
  std::sort(mem.begin(), mem.end());
  const auto members = mem;
  for (auto id : members) {
    if (budget <= 0) break;
    sequence& s = seqs_.at(id);
    if (s.preempted) {
      if (!enter(s, true)) continue;
      s.preempted = false;
      --preempted_now_;
    }
    plan_sequence(m, s, budget, plan);
  }
  if (admission_open(m, now)) {
    // Continuous batching admits what this step can start; the other modes admit the whole batch
    // at once (its prompts are prefilled over the next steps) and close it until it has finished.
    const bool whole_batch = options_.policy.batching != service::batching_mode::continuous;
    while (!waiting_.empty() && (budget > 0 || whole_batch) &&
           static_cast<int>(mem.size()) < options_.max_seqs_per_step) {
      sequence& s = seqs_.at(waiting_.front());
      if (!enter(s, false)) break;  // wait for blocks, in arrival order
      waiting_.pop_front();
      waiting_tokens_ -= s.prompt_len;
      s.microbatch = m;
      s.scheduled = now;
      mem.push_back(s.id);
      plan_sequence(m, s, budget, plan);
    }
  }
  add_drafts(m, budget, plan);
  if (plan.seqs.empty()) return std::nullopt;
  in_flight_[m] = true;
  return plan;
}

std::optional<engine::step_plan> batch_scheduler::next_step_ahead(int m, clock::time_point now) {
  if (!in_flight_[m] || ahead(m)) return std::nullopt;
  if (options_.draft != nullptr && options_.spec_k > 0) return std::nullopt;  // drafts need the tokens
  const auto& entries = step_seqs_[m];
  // Everyone of the microbatch is in the step (no member waits to re-prefill), and nobody could join:
  // no admission, no free slot, or the oldest waiting prompt lacks the free blocks enter() needs
  // (counted without prefix-cache hits: where those would have let it in, it joins a step later).
  if (entries.empty() || entries.size() != members_[m].size()) return std::nullopt;
  if (static_cast<int>(members_[m].size()) < options_.max_seqs_per_step && admission_open(m, now) &&
      pool_.blocks_for(static_cast<int>(seqs_.at(waiting_.front()).tokens.size())) <= pool_.free_blocks()) {
    return std::nullopt;
  }
  for (const auto& e : entries) {
    const sequence& s = seqs_.at(e.id);
    const int after = s.cached + e.tokens;  // KV after the step in flight
    if (!e.drafts.empty() || s.fate != doom::none || s.preempted || after != static_cast<int>(s.tokens.size())) {
      return std::nullopt;  // doomed, or its step does not draw (a prefill chunk)
    }
    // The step in flight draws token tokens.size(): it ends there by length, or the queued step
    // would write past the context.
    const int len = static_cast<int>(s.tokens.size()) + 1;
    if (len - s.prompt_len >= s.request.max_new_tokens || len >= options_.max_context) return std::nullopt;
  }
  for (const auto& e : entries) {  // blocks for one more position each, taken from free ones only
    sequence& s = seqs_.at(e.id);
    if (!grow(s, s.cached + e.tokens + 1, false)) return std::nullopt;
  }
  engine::step_plan plan;
  auto& ahead = ahead_seqs_[m];
  for (const auto& e : entries) {
    sequence& s = seqs_.at(e.id);
    engine::sequence_step step;
    step.seq_id = static_cast<std::int64_t>(s.id);
    step.tokens = {0};  // the stage writes the step in flight's draw here
    step.start_pos = s.cached + e.tokens;
    step.block_table = s.blocks;
    step.sample = true;
    step.sampling = s.request.sampling;
    step.sampling.step = s.tokens.size() + 1;  // as plan_sequence numbers it once that draw is appended
    plan.seqs.push_back(std::move(step));
    ahead.push_back({s.id, 1, {}});
    s.in_ahead = true;
  }
  ++steps_ahead_;
  return plan;
}

}  // namespace conveyor::scheduler
