#include "conveyor/scheduler/batch_scheduler.hpp"

#include <algorithm>
#include <cassert>
#include <string>

namespace conveyor::scheduler {

namespace {
double seconds(batch_scheduler::clock::duration d) { return std::chrono::duration<double>(d).count(); }
}  // namespace

batch_scheduler::batch_scheduler(const scheduler_options& options)
    : options_(options),
      blocks_(options.kv_blocks, options.kv_block_size),
      members_(options.chunks),
      step_seqs_(options.chunks),
      in_flight_(options.chunks, false) {
  assert(options.chunks >= 1);
}

result<std::uint64_t> batch_scheduler::add(service::generate_request r, std::shared_ptr<service::token_sink> sink) {
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
  const int need = blocks_.blocks_for(std::min<int>(options_.max_context, static_cast<int>(r.prompt.size()) + r.max_new_tokens));
  if (need > blocks_.num_blocks()) {
    return bad("the request needs " + std::to_string(need) + " KV blocks; the cache has " +
               std::to_string(blocks_.num_blocks()) + " (lower max_new_tokens)");
  }
  sequence s;
  s.id = next_id_++;
  s.tokens = r.prompt;
  s.prompt_len = static_cast<int>(r.prompt.size());
  s.request = std::move(r);
  s.sink = std::move(sink);
  s.submitted = clock::now();
  const auto id = s.id;
  seqs_.emplace(id, std::move(s));
  waiting_.push_back(id);
  return id;
}

void batch_scheduler::cancel(std::uint64_t id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return;
  sequence& s = it->second;
  s.cancelled = true;
  bool busy = false;
  if (s.microbatch >= 0 && in_flight_[s.microbatch]) {
    for (const auto& e : step_seqs_[s.microbatch]) busy = busy || e.id == id;
  }
  if (!busy) retire(id, summary_of(s, "cancelled"));
}

void batch_scheduler::admit(int m) {
  // Conservative reservation: a sequence gets blocks for its whole budget when admitted, so a running
  // sequence never runs out. TODO(perf): reserve per step and preempt under pressure (issue 6).
  while (!waiting_.empty() && static_cast<int>(members_[m].size()) < options_.max_seqs_per_step) {
    sequence& s = seqs_.at(waiting_.front());
    const int budget = std::min(options_.max_context, s.prompt_len + s.request.max_new_tokens);
    if (!blocks_.reserve(static_cast<std::int64_t>(s.id), budget).ok()) break;  // wait for blocks
    s.microbatch = m;
    s.scheduled = clock::now();
    members_[m].push_back(s.id);
    waiting_.pop_front();
  }
}

std::optional<engine::step_plan> batch_scheduler::next_step(int m) {
  if (in_flight_[m]) return std::nullopt;
  admit(m);
  engine::step_plan plan;
  int budget = options_.max_step_tokens;
  for (auto id : members_[m]) {
    if (budget <= 0) break;
    sequence& s = seqs_.at(id);
    const int pending = static_cast<int>(s.tokens.size()) - s.cached;
    const int take = std::min(pending, budget);
    engine::sequence_step step;
    step.seq_id = static_cast<std::int64_t>(id);
    step.tokens.assign(s.tokens.begin() + s.cached, s.tokens.begin() + s.cached + take);
    step.start_pos = s.cached;
    step.block_table = blocks_.table(static_cast<std::int64_t>(id));
    step.sample = s.cached + take == static_cast<int>(s.tokens.size());
    step.sampling = s.request.sampling;
    step.sampling.step = s.tokens.size();
    plan.seqs.push_back(std::move(step));
    step_seqs_[m].push_back({id, take});
    budget -= take;
  }
  if (plan.seqs.empty()) return std::nullopt;
  in_flight_[m] = true;
  return plan;
}

void batch_scheduler::complete(int m, const std::vector<std::int32_t>& tokens) {
  assert(in_flight_[m]);
  const auto entries = std::move(step_seqs_[m]);
  step_seqs_[m].clear();
  in_flight_[m] = false;
  for (std::size_t k = 0; k < entries.size(); ++k) {
    auto it = seqs_.find(entries[k].id);
    if (it == seqs_.end()) continue;
    sequence& s = it->second;
    s.cached += entries[k].tokens;
    const bool sampled = k < tokens.size() && tokens[k] >= 0;
    if (s.cancelled) {
      retire(s.id, summary_of(s, "cancelled"));
      continue;
    }
    if (!sampled) continue;
    const std::int32_t tok = tokens[k];
    s.tokens.push_back(tok);
    ++tokens_generated_;
    if (!s.has_first_token) {
      s.has_first_token = true;
      s.first_token = clock::now();
    }
    s.sink->on_tokens(std::span<const std::int32_t>(&tok, 1));
    const auto& r = s.request;
    const bool eos = !r.ignore_eos && std::find(options_.eos_ids.begin(), options_.eos_ids.end(), tok) != options_.eos_ids.end();
    const bool stop = std::find(r.stop_ids.begin(), r.stop_ids.end(), tok) != r.stop_ids.end();
    const int generated = static_cast<int>(s.tokens.size()) - s.prompt_len;
    if (eos || stop) {
      retire(s.id, summary_of(s, "stop"));
    } else if (generated >= r.max_new_tokens || static_cast<int>(s.tokens.size()) >= options_.max_context) {
      retire(s.id, summary_of(s, "length"));
    }
  }
}

void batch_scheduler::fail_step(int m, const error& why) {
  const auto entries = std::move(step_seqs_[m]);
  step_seqs_[m].clear();
  in_flight_[m] = false;
  for (const auto& e : entries) retire(e.id, why);
}

void batch_scheduler::fail_all(const error& why) {
  std::vector<std::uint64_t> ids;
  for (const auto& [id, s] : seqs_) ids.push_back(id);
  for (auto id : ids) retire(id, why);
  for (int m = 0; m < options_.chunks; ++m) {
    step_seqs_[m].clear();
    in_flight_[m] = false;
  }
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
  sequence s = std::move(it->second);
  seqs_.erase(it);
  blocks_.release(static_cast<std::int64_t>(id));
  if (s.microbatch >= 0) {
    auto& mem = members_[s.microbatch];
    mem.erase(std::remove(mem.begin(), mem.end(), id), mem.end());
  } else {
    waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), id), waiting_.end());
  }
  if (!outcome.ok()) {
    ++failed_;
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
  c.tokens_generated = tokens_generated_;
  c.kv_blocks_free = blocks_.free_blocks();
  return c;
}

}  // namespace conveyor::scheduler
