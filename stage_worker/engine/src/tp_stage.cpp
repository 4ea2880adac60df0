#include "conveyor/engine/tp_stage.hpp"

#include <optional>
#include <thread>

namespace conveyor::engine {

result<std::unique_ptr<tp_stage>> tp_stage::create(const std::vector<kernels::backend*>& rank_backends,
                                                   checkpoint& ckpt, const model_config& config, stage_range range,
                                                   const executor_options& options, const tp_group_factory& make_group) {
  const int tp = static_cast<int>(rank_backends.size());
  if (tp < 1) return make_error(errc::invalid_argument, "a stage needs at least one backend");
  if (tp > 1 && !make_group) return make_error(errc::invalid_argument, "tensor parallelism needs a collective factory");
  if (auto layout = make_tp_layout(config, 0, tp); !layout) return layout.err();
  std::unique_ptr<tp_stage> s(new tp_stage());
  if (tp > 1) {
    CONVEYOR_TRY_ASSIGN(group, make_group(tp));
    s->group_ = std::move(group);
  }
  for (int r = 0; r < tp; ++r) {
    CONVEYOR_TRY_ASSIGN(ex, stage_executor::create(*rank_backends[r], ckpt, config, range, options,
                                                   tp > 1 ? s->group_[r].get() : nullptr));
    s->ranks_.push_back(std::move(ex));
  }
  s->act_dtype_ = rank_backends[0]->caps().act_dtype;
  return s;
}

template <class F>
result<step_output> tp_stage::on_every_rank(F run_rank) {
  if (ranks_.size() == 1) return run_rank(0);
  // A thread per rank and step. Persistent rank threads woken by a condition variable measured
  // slower on a 2-core host (tp_step_bench, tp 2: 845-864 µs a step against 679-698; with 2000
  // yields before blocking 741-762 against 652-669; bench/NOTES.md, session 31): a woken thread
  // tends to land on its waker's core. To measure again on a GPU host's cores.
  std::vector<std::optional<result<step_output>>> others(ranks_.size() - 1);
  std::vector<std::thread> threads;
  for (std::size_t r = 1; r < ranks_.size(); ++r) {
    threads.emplace_back([&, r] { others[r - 1].emplace(run_rank(r)); });
  }
  auto out = run_rank(0);
  for (auto& t : threads) t.join();
  if (!out) return out;
  for (auto& o : others) {
    if (!o->ok()) return o->err();
  }
  return out;
}

result<step_output> tp_stage::run(const step_plan& plan, std::span<const float> hidden) {
  return on_every_rank([&](std::size_t r) { return ranks_[r]->run(plan, hidden); });
}

result<step_output> tp_stage::run_raw(const step_plan& plan, const void* hidden_in, void* hidden_out) {
  return on_every_rank([&](std::size_t r) { return ranks_[r]->run_raw(plan, hidden_in, r == 0 ? hidden_out : nullptr); });
}

status tp_stage::begin(const step_plan& plan, bool chain) {
  auto r = on_every_rank([&](std::size_t k) -> result<step_output> {
    CONVEYOR_TRY(ranks_[k]->begin(plan, chain));
    return step_output{};
  });
  if (!r) return r.err();
  return ok_status();
}

result<step_output> tp_stage::end() {
  return on_every_rank([&](std::size_t k) { return ranks_[k]->end(); });
}

std::size_t tp_stage::weight_bytes() const {
  std::size_t n = 0;
  for (const auto& r : ranks_) n += r->weight_bytes();
  return n;
}

}  // namespace conveyor::engine
