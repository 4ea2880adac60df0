#include "conveyor/engine/local_pipeline.hpp"

#include <algorithm>
#include <chrono>
#include <optional>

namespace conveyor::engine {

result<std::unique_ptr<local_pipeline>> local_pipeline::create(kernels::backend& backend, const std::string& model_dir,
                                                               int stages, const executor_options& options,
                                                               int keep_layers) {
  return create(std::vector<kernels::backend*>{&backend}, model_dir, stages, options, {}, keep_layers);
}

result<std::unique_ptr<local_pipeline>> local_pipeline::create(const std::vector<kernels::backend*>& rank_backends,
                                                               const std::string& model_dir, int stages,
                                                               const executor_options& options,
                                                               const tp_group_factory& make_group, int keep_layers) {
  CONVEYOR_TRY_ASSIGN(config, load_model_config(model_dir));
  if (keep_layers < 0 || keep_layers > config.num_layers) {
    return make_error(errc::invalid_argument, "cannot keep the first " + std::to_string(keep_layers) + " layers of " +
                                                  model_dir + ": it has " + std::to_string(config.num_layers));
  }
  if (keep_layers > 0) {
    config.num_layers = keep_layers;
    config.sliding_window.resize(keep_layers);
  }
  CONVEYOR_TRY_ASSIGN(ranges, split_even(config, stages));
  CONVEYOR_TRY_ASSIGN(ckpt, checkpoint::open(model_dir));
  std::unique_ptr<local_pipeline> p(new local_pipeline(config, options));
  for (const auto& r : ranges) {
    CONVEYOR_TRY_ASSIGN(stage, tp_stage::create(rank_backends, ckpt, config, r, options, make_group));
    p->stages_.push_back(std::move(stage));
  }
  return p;
}

result<step_output> local_pipeline::step(const step_plan& plan) {
  std::vector<float> hidden;
  for (std::size_t s = 0; s < stages_.size(); ++s) {
    CONVEYOR_TRY_ASSIGN(out, stages_[s]->run(plan, hidden));
    if (stages_[s]->rank0().range().has_head) return out;
    hidden = std::move(out.hidden);
  }
  return make_error(errc::internal, "pipeline has no last stage");
}

status local_pipeline::begin_step(const step_plan& plan, bool chain) {
  if (!can_queue_steps()) {
    return make_error(errc::unsupported, "queued steps need a pipeline of one stage (this one has " +
                                             std::to_string(stages_.size()) + " stages)");
  }
  return stages_[0]->begin(plan, chain);
}

result<step_output> local_pipeline::end_step() {
  if (!can_queue_steps()) return make_error(errc::unsupported, "queued steps need a pipeline of one stage");
  return stages_[0]->end();
}

result<std::vector<generation_result>> local_pipeline::generate(const std::vector<generation_request>& requests) {
  struct running {
    std::int64_t id;
    std::vector<std::int32_t> tokens;  // prompt, then generated
    std::size_t prompt_len;
    int cached = 0;  // tokens whose KV is in the cache
    bool done = false;
  };
  std::vector<running> seqs;
  std::vector<generation_result> results(requests.size());
  step_seconds_.clear();
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const auto& r = requests[i];
    if (r.prompt.empty()) return make_error(errc::invalid_argument, "request " + std::to_string(i) + " has an empty prompt");
    if (r.max_new_tokens < 0) return make_error(errc::invalid_argument, "max_new_tokens must be >= 0");
    seqs.push_back(running{next_seq_id_++, r.prompt, r.prompt.size(), 0, r.max_new_tokens == 0});
  }
  auto release_all = [&] {
    for (const auto& s : seqs) blocks_.release(s.id);
  };
  // Appends the tokens of a finished step (plan `p` over sequences `who`) and marks the sequences
  // that stop with them.
  auto take = [&](const step_plan& p, const std::vector<std::size_t>& who, const step_output& out) {
    for (std::size_t k = 0; k < who.size(); ++k) {
      running& s = seqs[who[k]];
      if (s.done) continue;  // stopped at the step before: this step's token for it is dropped
      s.cached += static_cast<int>(p.seqs[k].tokens.size());
      if (!p.seqs[k].sample) continue;
      const std::int32_t tok = out.tokens[k];
      s.tokens.push_back(tok);
      const auto& req = requests[who[k]];
      const bool eos = req.stop_at_eos && std::find(config_.eos_token_ids.begin(), config_.eos_token_ids.end(), tok) !=
                                              config_.eos_token_ids.end();
      if (eos || s.tokens.size() - s.prompt_len >= static_cast<std::size_t>(req.max_new_tokens)) {
        s.done = true;
        results[who[k]].finish_reason = eos ? "stop" : "length";
        blocks_.release(s.id);
      }
    }
  };
  // The step after `p` when it can be chained to p's draw: p is a decode step of every running
  // sequence, and none of them reaches its length limit with p's token. Its ids are placeholders
  // (the chain replaces them); its KV blocks are reserved here.
  auto successor = [&](const step_plan& p, const std::vector<std::size_t>& who) -> result<std::optional<step_plan>> {
    std::size_t running_now = 0;
    for (const auto& s : seqs) running_now += s.done ? 0 : 1;
    if (who.size() != running_now) return std::optional<step_plan>{};
    for (std::size_t k = 0; k < who.size(); ++k) {
      const running& s = seqs[who[k]];
      if (p.seqs[k].tokens.size() != 1 || !p.seqs[k].sample ||
          s.tokens.size() + 1 - s.prompt_len >= static_cast<std::size_t>(requests[who[k]].max_new_tokens)) {
        return std::optional<step_plan>{};
      }
    }
    step_plan next;
    for (std::size_t k = 0; k < who.size(); ++k) {
      const sequence_step& prev = p.seqs[k];
      CONVEYOR_TRY(blocks_.reserve(prev.seq_id, prev.start_pos + 2));
      sequence_step ss = prev;
      ss.tokens = {prev.tokens[0]};  // any valid id: replaced by the chain
      ss.start_pos = prev.start_pos + 1;
      ss.block_table = blocks_.table(prev.seq_id);
      ss.sampling.step = prev.sampling.step + 1;
      next.seqs.push_back(std::move(ss));
    }
    return std::optional<step_plan>{std::move(next)};
  };
  const bool overlap = can_queue_steps();
  auto last = std::chrono::steady_clock::now();
  auto timed = [&] {
    const auto now = std::chrono::steady_clock::now();
    step_seconds_.push_back(std::chrono::duration<double>(now - last).count());
    last = now;
  };
  auto fail = [&](const error& e) {
    if (overlap) {
      while (stages_[0]->queued() > 0) (void)end_step();
    }
    release_all();
    return e;
  };
  for (;;) {
    step_plan plan;
    std::vector<std::size_t> who;
    int budget = options_.max_step_tokens;
    for (std::size_t i = 0; i < seqs.size() && budget > 0 && static_cast<int>(plan.seqs.size()) < options_.max_seqs; ++i) {
      running& s = seqs[i];
      if (s.done) continue;
      const int pending = static_cast<int>(s.tokens.size()) - s.cached;
      const int take_n = std::min(pending, budget);
      if (auto st = blocks_.reserve(s.id, s.cached + take_n); !st) return fail(st.err());
      sequence_step ss;
      ss.seq_id = s.id;
      ss.tokens.assign(s.tokens.begin() + s.cached, s.tokens.begin() + s.cached + take_n);
      ss.start_pos = s.cached;
      ss.block_table = blocks_.table(s.id);
      ss.sample = (s.cached + take_n == static_cast<int>(s.tokens.size()));
      ss.sampling = requests[i].sampling;
      ss.sampling.step = s.tokens.size();
      plan.seqs.push_back(std::move(ss));
      who.push_back(i);
      budget -= take_n;
    }
    if (plan.seqs.empty()) break;
    last = std::chrono::steady_clock::now();
    if (!overlap) {
      auto out = step(plan);
      timed();
      if (!out) return fail(out.err());
      take(plan, who, *out);
      continue;
    }
    if (auto st = begin_step(plan, false); !st) return fail(st.err());
    // While the queued step has a chainable successor, queue it before waiting for the step.
    for (;;) {
      auto next = successor(plan, who);
      if (!next) return fail(next.err());
      if (*next) {
        if (auto st = begin_step(**next, true); !st) return fail(st.err());
      }
      auto out = end_step();
      timed();
      if (!out) return fail(out.err());
      take(plan, who, *out);
      if (!*next) break;
      plan = std::move(**next);
      bool stopped = false;
      for (std::size_t k : who) stopped = stopped || seqs[k].done;
      if (stopped) {  // the queued step still runs; take what it drew for the others, then replan
        auto rest = end_step();
        timed();
        if (!rest) return fail(rest.err());
        take(plan, who, *rest);
        break;
      }
    }
  }
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    results[i].tokens.assign(seqs[i].tokens.begin() + seqs[i].prompt_len, seqs[i].tokens.end());
    if (results[i].finish_reason.empty()) results[i].finish_reason = "length";
  }
  release_all();
  return results;
}

}  // namespace conveyor::engine
