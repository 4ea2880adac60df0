#include "conveyor/engine/local_pipeline.hpp"

#include <algorithm>
#include <chrono>

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
