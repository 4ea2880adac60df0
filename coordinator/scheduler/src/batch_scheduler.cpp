// The lifecycle of a request in the scheduler: validation and admission control, cancel and
// deadlines, applying a step's tokens, retiring. Step planning is in step_planner.cpp.
#include "conveyor/scheduler/batch_scheduler.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdio>
#include <string>

#include "conveyor/engine/speculative_sampling.hpp"

namespace conveyor::scheduler {

namespace {
double seconds(batch_scheduler::clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string fmt_s(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", s);
  return buf;
}
}  // namespace

batch_scheduler::batch_scheduler(const scheduler_options& options)
    : options_(options),
      pool_(options.kv_blocks, options.kv_block_size, options.policy.prefix_caching),
      members_(options.chunks),
      step_seqs_(options.chunks),
      in_flight_(options.chunks, false),
      ahead_seqs_(options.chunks) {
  assert(options.chunks >= 1);
}

bool batch_scheduler::set_kv_blocks(int blocks) {
  if (!seqs_.empty() || blocks < 0) return false;
  pool_ = kv_block_pool(blocks, options_.kv_block_size, options_.policy.prefix_caching);
  options_.kv_blocks = blocks;
  return true;
}

std::optional<std::string> batch_scheduler::overload_reason(const service::generate_request& r) const {
  const auto& p = options_.policy;
  const auto queued = static_cast<std::int64_t>(waiting_.size());
  if (p.job_queue_size > 0 && queued >= p.job_queue_size) {
    return std::to_string(queued) + " requests are already waiting to start (serving.job_queue_size = " +
           std::to_string(p.job_queue_size) + ")";
  }
  const auto prompt = static_cast<std::int64_t>(r.prompt.size());
  // An empty queue takes any prompt: the cap bounds the backlog, not the size of one request.
  if (p.max_queued_tokens > 0 && queued > 0 && waiting_tokens_ + prompt > p.max_queued_tokens) {
    return std::to_string(waiting_tokens_) + " prompt tokens are already waiting to start; " + std::to_string(prompt) +
           " more would pass serving.max_queued_tokens = " + std::to_string(p.max_queued_tokens);
  }
  if (!p.use_job_ticket) return std::nullopt;
  // A job ticket is a promise that the request starts at the next step: a free sequence slot (in a
  // batch that admits now) and KV blocks for its prompt after those of everyone already waiting.
  if (preempted_now_ > 0) {
    return "the KV cache is under pressure (" + std::to_string(preempted_now_) +
           " running sequences are waiting for blocks; serving.use_job_ticket = true)";
  }
  std::int64_t slots = 0;
  for (const auto& mem : members_) {
    const auto free_slots = options_.max_seqs_per_step - static_cast<std::int64_t>(mem.size());
    const bool admits = options_.policy.batching == service::batching_mode::continuous || mem.empty();
    if (admits) slots += free_slots;
  }
  if (slots <= queued) {
    return "every batch slot is taken (" + std::to_string(seqs_.size() - waiting_.size()) + " running, " +
           std::to_string(queued) + " about to start; serving.use_job_ticket = true)";
  }
  int blocks_needed = pool_.blocks_for(static_cast<int>(prompt) + 1);
  for (auto id : waiting_) blocks_needed += pool_.blocks_for(seqs_.at(id).prompt_len + 1);
  if (blocks_needed > pool_.free_blocks()) {
    return "the KV cache has " + std::to_string(pool_.free_blocks()) + " free blocks and the waiting prompts need " +
           std::to_string(blocks_needed) + " (serving.use_job_ticket = true)";
  }
  return std::nullopt;
}

result<std::uint64_t> batch_scheduler::add(service::generate_request r, std::shared_ptr<service::token_sink> sink) {
  auto id = admit(std::move(r), std::move(sink));
  if (!id) ++errors_[id.err().code];
  return id;
}

result<std::uint64_t> batch_scheduler::admit(service::generate_request r, std::shared_ptr<service::token_sink> sink) {
  auto bad = [](std::string what) { return make_error(errc::invalid_argument, std::move(what)); };
  if (r.prompt.empty()) return bad("the prompt is empty");
  if (r.max_new_tokens < 1) return bad("max_new_tokens must be at least 1, got " + std::to_string(r.max_new_tokens));
  for (auto id : r.prompt) {
    if (id < 0 || id >= options_.vocab_size) {
      return bad("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                 std::to_string(options_.vocab_size) + ")");
    }
  }
  if (static_cast<int>(r.prompt.size()) >= options_.max_context) {
    return bad("the prompt has " + std::to_string(r.prompt.size()) + " tokens; the context limit is " +
               std::to_string(options_.max_context));
  }
  if (!(r.sampling.temperature >= 0.0f) || !(r.sampling.top_p > 0.0f && r.sampling.top_p <= 1.0f) ||
      r.sampling.top_k < 0) {
    return bad("sampling needs temperature >= 0, top_k >= 0 and 0 < top_p <= 1");
  }
  if (!(r.deadline_s >= 0.0 && std::isfinite(r.deadline_s))) return bad("deadline_s must be a finite number >= 0");
  // A sequence alone must fit: preemption can free every other block, never more than the pool.
  const int need = pool_.blocks_for(std::min<int>(options_.max_context, static_cast<int>(r.prompt.size()) + r.max_new_tokens));
  if (need > pool_.num_blocks()) {
    return bad("the request needs " + std::to_string(need) + " KV blocks; the cache has " +
               std::to_string(pool_.num_blocks()) + " (lower max_new_tokens)");
  }
  if (auto why = overload_reason(r)) {
    ++rejected_;
    return make_error(errc::overloaded, "overloaded: " + *why + "; retry after about 1 s");
  }
  sequence s;
  s.id = next_id_++;
  s.tokens = r.prompt;
  s.prompt_len = static_cast<int>(r.prompt.size());
  s.submitted = clock::now();
  // The request's own deadline, never past the server's response_timeout_s.
  double limit = options_.policy.response_timeout_s;
  if (r.deadline_s > 0.0) limit = limit > 0.0 ? std::min(limit, r.deadline_s) : r.deadline_s;
  if (limit > 0.0) s.deadline = s.submitted + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(limit));
  s.request = std::move(r);
  s.sink = std::move(sink);
  const auto id = s.id;
  waiting_tokens_ += s.prompt_len;
  seqs_.emplace(id, std::move(s));
  waiting_.push_back(id);
  flush_ = false;
  return id;
}

void batch_scheduler::cancel(std::uint64_t id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return;
  sequence& s = it->second;
  if (s.in_step) {
    if (s.fate == doom::none) s.fate = doom::cancelled;
    return;
  }
  retire(id, summary_of(s, "cancelled"));
}

error batch_scheduler::deadline_error(const sequence& s, clock::time_point now) const {
  const double limit = seconds(s.deadline - s.submitted);
  const int generated = static_cast<int>(s.tokens.size()) - s.prompt_len;
  return make_error(errc::deadline_exceeded,
                    "deadline exceeded: the request was cancelled after " + fmt_s(seconds(now - s.submitted)) +
                        " s, past its " + fmt_s(limit) + " s deadline (deadline_s, at most serving.response_timeout_s), " +
                        (s.microbatch < 0 ? std::string("before it started") : std::to_string(generated) + " of " +
                                                                                   std::to_string(s.request.max_new_tokens) +
                                                                                   " tokens generated"));
}

void batch_scheduler::tick(clock::time_point now) {
  std::vector<std::uint64_t> due;
  for (auto& [id, s] : seqs_) {
    if (s.deadline > now || s.fate != doom::none) continue;
    if (s.in_step) {
      s.fate = doom::expired;  // its blocks are being written: retired when the step completes
    } else {
      due.push_back(id);
    }
  }
  for (auto id : due) {
    ++expired_;
    retire(id, deadline_error(seqs_.at(id), now));
  }
}

std::optional<batch_scheduler::clock::time_point> batch_scheduler::next_wakeup() const {
  std::optional<clock::time_point> at;
  auto consider = [&](clock::time_point t) {
    if (!at || t < *at) at = t;
  };
  for (const auto& [id, s] : seqs_) {
    if (s.deadline != clock::time_point::max() && s.fate == doom::none) consider(s.deadline);
  }
  if (options_.policy.batching == service::batching_mode::dynamic && !waiting_.empty()) {
    for (int m = 0; m < options_.chunks; ++m) {
      if (members_[m].empty() && !in_flight_[m]) {
        consider(seqs_.at(waiting_.front()).submitted + std::chrono::milliseconds(options_.policy.max_batch_delay_ms));
      }
    }
  }
  return at;
}

std::chrono::milliseconds batch_scheduler::tick_period() const {
  if (options_.policy.batching == service::batching_mode::dynamic) {
    return std::chrono::milliseconds(std::clamp(options_.policy.max_batch_delay_ms, 1, 100));
  }
  return std::chrono::milliseconds(100);  // deadlines: a tenth of a second late at most
}

void batch_scheduler::complete(int m, const std::vector<std::int32_t>& tokens) {
  assert(in_flight_[m]);
  const auto entries = std::move(step_seqs_[m]);
  step_seqs_[m].clear();
  in_flight_[m] = false;
  if (ahead(m)) {  // the queued step is in flight now; its sequences stay in a step
    step_seqs_[m] = std::move(ahead_seqs_[m]);
    ahead_seqs_[m].clear();
    in_flight_[m] = true;
  }
  std::size_t next_row = 0;  // tokens holds sample_rows values for a sequence with drafts, else one
  for (std::size_t k = 0; k < entries.size(); ++k) {
    const auto& drafts = entries[k].drafts;
    const std::size_t rows = drafts.size() + 1;
    const std::size_t row0 = next_row;
    next_row += rows;
    const bool sampled = row0 + rows <= tokens.size() && tokens[row0 + rows - 1] >= 0;
    auto it = seqs_.find(entries[k].id);
    if (it == seqs_.end()) continue;
    sequence& s = it->second;
    // A sequence of a queued step stays in a step: its blocks are still being written, so whatever
    // ends it here retires it when that step completes (its token from there is dropped).
    const bool behind = s.in_ahead;
    s.in_ahead = false;
    s.in_step = behind;
    // Keep the drafts equal to what the target drew after each position, then the target's token.
    engine::verify_outcome v;
    if (sampled) {
      v = engine::verify_exact(drafts, std::span<const std::int32_t>(tokens.data() + row0, rows));
    }
    // The KV of rejected drafts is stale: the next step overwrites it (every stage addresses the
    // sequence's KV through this block table and the plan's positions alone).
    s.cached += entries[k].tokens - static_cast<int>(drafts.size()) + v.accepted;
    publish_full_blocks(s);
    if (s.fate != doom::none) {
      if (!behind) retire_doomed(s);
      continue;
    }
    if (!sampled) continue;
    std::vector<std::int32_t> emit(drafts.begin(), drafts.begin() + v.accepted);
    emit.push_back(v.next);
    if (!drafts.empty()) {
      ++spec_steps_;
      spec_proposed_ += static_cast<std::int64_t>(drafts.size());
      spec_accepted_ += v.accepted;
    }
    const auto& r = s.request;
    const char* finish = nullptr;
    std::size_t n = 0;
    while (n < emit.size() && finish == nullptr) {
      const std::int32_t tok = emit[n++];
      s.tokens.push_back(tok);
      const bool eos = !r.ignore_eos && std::find(options_.eos_ids.begin(), options_.eos_ids.end(), tok) != options_.eos_ids.end();
      const bool stop = std::find(r.stop_ids.begin(), r.stop_ids.end(), tok) != r.stop_ids.end();
      const int generated = static_cast<int>(s.tokens.size()) - s.prompt_len;
      if (eos || stop) {
        finish = "stop";
      } else if (generated >= r.max_new_tokens || static_cast<int>(s.tokens.size()) >= options_.max_context) {
        finish = "length";
      }
    }
    tokens_generated_ += static_cast<std::int64_t>(n);
    if (!drafts.empty()) spec_emitted_ += static_cast<std::int64_t>(n);
    if (!s.has_first_token) {
      s.has_first_token = true;
      s.first_token = clock::now();
    }
    s.sink->on_tokens(std::span<const std::int32_t>(emit.data(), n));
    if (!drafts.empty()) publish_full_blocks(s);  // blocks the kept drafts completed
    if (finish != nullptr) {
      if (behind) {
        s.fate = doom::finished;
        s.finish_reason = finish;
      } else {
        retire(s.id, summary_of(s, finish));
      }
      continue;
    }
    // Blocks taken for rejected drafts go back (those past the next position to write).
    while (static_cast<int>(s.blocks.size()) > std::max(pool_.blocks_for(static_cast<int>(s.tokens.size())), s.published)) {
      pool_.release(s.blocks.back());
      s.blocks.pop_back();
    }
  }
}

void batch_scheduler::fail_step(int m, const error& why) {
  auto entries = std::move(step_seqs_[m]);
  step_seqs_[m].clear();
  in_flight_[m] = false;
  // The step queued behind it never runs either (its sequences are the same ones).
  for (auto& e : ahead_seqs_[m]) entries.push_back(std::move(e));
  ahead_seqs_[m].clear();
  for (const auto& e : entries) {
    if (auto it = seqs_.find(e.id); it != seqs_.end()) {
      it->second.in_step = false;
      it->second.in_ahead = false;
    }
    retire(e.id, why);
  }
}

void batch_scheduler::forget_steps() {
  for (int m = 0; m < options_.chunks; ++m) {
    step_seqs_[m].clear();
    in_flight_[m] = false;
    ahead_seqs_[m].clear();
  }
  for (auto& [id, s] : seqs_) {
    s.in_step = false;
    s.in_ahead = false;
  }
}

void batch_scheduler::retire_doomed(const sequence& s) {
  switch (s.fate) {
    case doom::cancelled:
      retire(s.id, summary_of(s, "cancelled"));
      return;
    case doom::expired:
      ++expired_;
      retire(s.id, deadline_error(s, clock::now()));
      return;
    case doom::finished:
      retire(s.id, summary_of(s, s.finish_reason));
      return;
    case doom::none:
      assert(false && "retire_doomed of a sequence with no fate");
      return;
  }
}

void batch_scheduler::fail_all(const error& why) {
  forget_steps();
  std::vector<std::uint64_t> ids;
  for (const auto& [id, s] : seqs_) ids.push_back(id);
  for (auto id : ids) retire(id, why);
}

void batch_scheduler::reprefill_all() {
  forget_steps();
  std::vector<std::uint64_t> doomed;
  for (auto& [id, s] : seqs_) {
    if (s.fate != doom::none) {
      doomed.push_back(id);
      continue;
    }
    if (s.microbatch < 0 || s.preempted) continue;  // holds no blocks
    drop_blocks(s);
    s.preempted = true;
    ++preempted_now_;
  }
  pool_.forget_cached();
  for (auto id : doomed) retire_doomed(seqs_.at(id));
}

service::generate_summary batch_scheduler::summary_of(const sequence& s, const char* reason) const {
  service::generate_summary sum;
  sum.prompt_tokens = s.prompt_len;
  sum.completion_tokens = static_cast<int>(s.tokens.size()) - s.prompt_len;
  sum.finish_reason = reason;
  const auto now = clock::now();
  sum.queue_s = s.microbatch >= 0 ? seconds(s.scheduled - s.submitted) : seconds(now - s.submitted);
  sum.first_token_s = s.has_first_token ? seconds(s.first_token - s.submitted) : 0.0;
  sum.total_s = seconds(now - s.submitted);
  return sum;
}

void batch_scheduler::retire(std::uint64_t id, result<service::generate_summary> outcome) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return;
  assert(!it->second.in_step);
  sequence s = std::move(it->second);
  seqs_.erase(it);
  drop_blocks(s);
  if (options_.draft != nullptr) options_.draft->forget(static_cast<std::int64_t>(id));
  if (s.preempted) --preempted_now_;
  if (s.microbatch >= 0) {
    auto& mem = members_[s.microbatch];
    mem.erase(std::remove(mem.begin(), mem.end(), id), mem.end());
  } else {
    waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), id), waiting_.end());
    waiting_tokens_ -= s.prompt_len;
  }
  if (!outcome.ok()) {
    ++failed_;
    ++errors_[outcome.err().code];
  } else if (outcome->finish_reason == "cancelled") {
    ++cancelled_;
  } else {
    ++finished_;
  }
  s.sink->on_done(std::move(outcome));
}

bool batch_scheduler::has_work() const { return !seqs_.empty(); }

scheduler_counters batch_scheduler::counters() const {
  scheduler_counters c;
  c.waiting = static_cast<std::int64_t>(waiting_.size());
  c.running = static_cast<std::int64_t>(seqs_.size()) - c.waiting;
  c.finished = finished_;
  c.failed = failed_;
  c.cancelled = cancelled_;
  c.rejected = rejected_;
  c.expired = expired_;
  c.preempted = preemptions_;
  c.tokens_generated = tokens_generated_;
  c.kv_blocks_free = pool_.free_blocks();
  c.kv_blocks_cached = pool_.cached_blocks();
  c.prefix = pool_.counters();
  c.spec_steps = spec_steps_;
  c.spec_proposed = spec_proposed_;
  c.spec_accepted = spec_accepted_;
  c.spec_emitted = spec_emitted_;
  c.steps_ahead = steps_ahead_;
  return c;
}

void batch_scheduler::report(service::stats_report& r) const {
  const auto c = counters();
  r.requests_running = c.running;
  r.requests_waiting = c.waiting;
  r.requests_finished = c.finished + c.cancelled;
  r.requests_failed = c.failed;
  r.requests_rejected = c.rejected;
  r.requests_expired = c.expired;
  r.preemptions = c.preempted;
  r.tokens_generated = c.tokens_generated;
  r.kv_blocks_total = pool_.num_blocks();
  r.kv_blocks_free = c.kv_blocks_free;
  r.kv_blocks_cached = c.kv_blocks_cached;
  r.prefix_cache_queried_tokens = c.prefix.queried_blocks * pool_.block_size();
  r.prefix_cache_hit_tokens = c.prefix.hit_blocks * pool_.block_size();
  for (const auto& [code, n] : errors_) r.errors_by_kind[std::string(service::errc_name(code))] += n;
  r.microbatches = options_.chunks;
  r.microbatches_in_flight = static_cast<int>(std::count(in_flight_.begin(), in_flight_.end(), true));
  r.spec_steps = c.spec_steps;
  r.spec_draft_tokens = c.spec_proposed;
  r.spec_accepted_tokens = c.spec_accepted;
  r.spec_emitted_tokens = c.spec_emitted;
  r.steps_queued_ahead = c.steps_ahead;
}

}  // namespace conveyor::scheduler
