#include "conveyor/engine/local_pipeline.hpp"

#include <algorithm>
#include <chrono>
#include <optional>
#include <thread>

namespace conveyor::engine {

result<std::unique_ptr<local_pipeline>> local_pipeline::create(kernels::backend& backend, const std::string& model_dir,
                                                               int stages, const executor_options& options) {
  return create(std::vector<kernels::backend*>{&backend}, model_dir, stages, options, {});
}

result<std::unique_ptr<local_pipeline>> local_pipeline::create(const std::vector<kernels::backend*>& rank_backends,
                                                               const std::string& model_dir, int stages,
                                                               const executor_options& options,
                                                               const tp_group_factory& make_group) {
  const int tp = static_cast<int>(rank_backends.size());
  if (tp < 1) return make_error(errc::invalid_argument, "a pipeline needs at least one backend");
  if (tp > 1 && !make_group) return make_error(errc::invalid_argument, "tensor parallelism needs a collective factory");
  CONVEYOR_TRY_ASSIGN(config, load_model_config(model_dir));
  if (auto layout = make_tp_layout(config, 0, tp); !layout) return layout.err();
  CONVEYOR_TRY_ASSIGN(ranges, split_even(config, stages));
  CONVEYOR_TRY_ASSIGN(ckpt, checkpoint::open(model_dir));
  std::unique_ptr<local_pipeline> p(new local_pipeline(config, options));
  for (const auto& r : ranges) {
    std::vector<std::unique_ptr<kernels::collective>> group;
    if (tp > 1) {
      CONVEYOR_TRY_ASSIGN(made, make_group(tp));
      group = std::move(made);
    }
    std::vector<std::unique_ptr<stage_executor>> ranks;
    for (int rank = 0; rank < tp; ++rank) {
      CONVEYOR_TRY_ASSIGN(ex, stage_executor::create(*rank_backends[rank], ckpt, config, r, options,
                                                     tp > 1 ? group[rank].get() : nullptr));
      ranks.push_back(std::move(ex));
    }
    p->stages_.push_back(std::move(ranks[0]));
    if (tp > 1) {
      p->other_ranks_.emplace_back(std::make_move_iterator(ranks.begin() + 1), std::make_move_iterator(ranks.end()));
      p->groups_.push_back(std::move(group));
    }
  }
  return p;
}

result<step_output> local_pipeline::run_stage(std::size_t s, const step_plan& plan, const std::vector<float>& hidden) {
  if (other_ranks_.empty()) return stages_[s]->run(plan, hidden);
  // Every rank runs the same step; the all-reduces inside keep their activations identical, so
  // rank 0's output is the stage's. TODO(perf): a persistent thread per rank instead of one per step.
  auto& others = other_ranks_[s];
  std::vector<std::optional<result<step_output>>> outs(others.size());
  std::vector<std::thread> threads;
  for (std::size_t r = 0; r < others.size(); ++r) {
    threads.emplace_back([&, r] { outs[r].emplace(others[r]->run(plan, hidden)); });
  }
  auto out = stages_[s]->run(plan, hidden);
  for (auto& t : threads) t.join();
  for (auto& o : outs) {
    if (!o->ok()) return o->err();
  }
  return out;
}

result<step_output> local_pipeline::step(const step_plan& plan) {
  std::vector<float> hidden;
  for (std::size_t s = 0; s < stages_.size(); ++s) {
    CONVEYOR_TRY_ASSIGN(out, run_stage(s, plan, hidden));
    if (stages_[s]->range().has_head) return out;
    hidden = std::move(out.hidden);
  }
  return make_error(errc::internal, "pipeline has no last stage");
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
  for (;;) {
    step_plan plan;
    std::vector<std::size_t> who;
    int budget = options_.max_step_tokens;
    for (std::size_t i = 0; i < seqs.size() && budget > 0 && static_cast<int>(plan.seqs.size()) < options_.max_seqs; ++i) {
      running& s = seqs[i];
      if (s.done) continue;
      const int pending = static_cast<int>(s.tokens.size()) - s.cached;
      const int take = std::min(pending, budget);
      if (auto st = blocks_.reserve(s.id, s.cached + take); !st) {
        release_all();
        return st.err();
      }
      sequence_step ss;
      ss.seq_id = s.id;
      ss.tokens.assign(s.tokens.begin() + s.cached, s.tokens.begin() + s.cached + take);
      ss.start_pos = s.cached;
      ss.block_table = blocks_.table(s.id);
      ss.sample = (s.cached + take == static_cast<int>(s.tokens.size()));
      ss.sampling = requests[i].sampling;
      ss.sampling.step = s.tokens.size();
      plan.seqs.push_back(std::move(ss));
      who.push_back(i);
      budget -= take;
    }
    if (plan.seqs.empty()) break;
    const auto t0 = std::chrono::steady_clock::now();
    auto out = step(plan);
    step_seconds_.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (!out) {
      release_all();
      return out.err();
    }
    for (std::size_t k = 0; k < who.size(); ++k) {
      running& s = seqs[who[k]];
      s.cached += static_cast<int>(plan.seqs[k].tokens.size());
      if (!plan.seqs[k].sample) continue;
      const std::int32_t tok = out->tokens[k];
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
  }
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    results[i].tokens.assign(seqs[i].tokens.begin() + seqs[i].prompt_len, seqs[i].tokens.end());
    if (results[i].finish_reason.empty()) results[i].finish_reason = "length";
  }
  release_all();
  return results;
}

}  // namespace conveyor::engine
