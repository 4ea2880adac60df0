// Tensor parallelism across OS processes: each rank is its own process holding one executor (its
// shard of the HF checkpoint), joined by the shared-memory collective. Every rank must reproduce the
// fixture's goldens (logits within 1e-4, the 24 greedy tokens), as the thread group does
// (tests/engine/test_tensor_parallel).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "conveyor/engine/checkpoint.hpp"
#include "conveyor/engine/executor.hpp"
#include "conveyor/engine/model_config.hpp"
#include "conveyor/engine/stage.hpp"
#include "conveyor/engine/tensor_parallel.hpp"
#include "conveyor/kernels/cpu_backend.hpp"
#include "conveyor/transport/shm_collective.hpp"
#include "../engine/golden.hpp"

namespace conveyor {
namespace {

/// One rank's whole run; returns 0 when every prompt matched, else a code naming the check.
int run_rank(const testing::golden_fixture& golden, std::span<const std::byte> group_id, int tp, int rank) {
  auto say = [&](const std::string& m) { std::fprintf(stderr, "%s rank %d: %s\n", golden.name.c_str(), rank, m.c_str()); };
  auto cfg = engine::load_model_config(golden.dir);
  auto ckpt = engine::checkpoint::open(golden.dir);
  if (!cfg || !ckpt) return 10;
  transport::shm_group_options go;
  go.timeout = std::chrono::seconds(60);
  auto group = transport::join_shm_group(group_id, tp, rank, go);
  if (!group) {
    say(group.err().message);
    return 11;
  }
  auto backend = kernels::make_cpu_backend({1});
  engine::executor_options o;
  o.kv_blocks = 64;
  o.max_step_tokens = 512;
  o.max_seqs = 8;
  auto ex = engine::stage_executor::create(*backend, *ckpt, *cfg, engine::whole_model(*cfg), o, group->get());
  if (!ex) {
    say(ex.err().message);
    return 12;
  }
  const int vocab = cfg->vocab_size;
  for (std::size_t i = 0; i < golden.prompts.size(); ++i) {
    const auto& p = golden.prompts[i];
    const int len = static_cast<int>(p.input_ids.size());
    const int total = len + static_cast<int>(p.greedy.size());
    engine::sequence_step s;
    s.seq_id = 1;
    for (int b = 0; b * o.kv_block_size < total; ++b) s.block_table.push_back(b);
    s.tokens = p.input_ids;
    s.logits = engine::logits_mode::all;
    engine::step_plan plan;
    plan.seqs.push_back(s);
    auto out = (*ex)->run(plan, {});
    if (!out || out->logits.size() != p.logits.size()) return 13;
    float worst = 0.0f;
    for (std::size_t k = 0; k < p.logits.size(); ++k) worst = std::max(worst, std::fabs(out->logits[k] - p.logits[k]));
    if (worst > 1e-4f) {
      say("prompt " + std::to_string(i) + ": logits off by " + std::to_string(worst));
      return 14;
    }
    // Greedy decode through the KV cache: the first token from the prefill's last row.
    std::vector<std::int32_t> tokens;
    const float* last = out->logits.data() + static_cast<std::size_t>(len - 1) * vocab;
    tokens.push_back(static_cast<std::int32_t>(std::max_element(last, last + vocab) - last));
    plan.seqs[0].logits = engine::logits_mode::none;
    while (tokens.size() < p.greedy.size()) {
      plan.seqs[0].start_pos = len + static_cast<int>(tokens.size()) - 1;
      plan.seqs[0].tokens = {tokens.back()};
      auto step = (*ex)->run(plan, {});
      if (!step || step->tokens.size() != 1) return 15;
      tokens.push_back(step->tokens[0]);
    }
    if (tokens != p.greedy) {
      say("prompt " + std::to_string(i) + ": greedy tokens differ from the golden");
      return 16;
    }
  }
  return 0;
}

struct tp_case {
  std::string fixture;
  int tp;
};

std::vector<tp_case> cases() {
  std::vector<tp_case> out;
  for (const auto& f : testing::fixture_names()) {
    auto cfg = engine::load_model_config(testing::fixture_dir(f));
    if (!cfg) continue;
    for (int tp : {2, 4}) {
      // TP=4 on the fixture with fewer KV heads than ranks only (kv replication), to keep CI short.
      if (tp == 4 && cfg->num_kv_heads >= 4) continue;
      if (engine::make_tp_layout(*cfg, 0, tp).ok()) out.push_back({f, tp});
    }
  }
  return out;
}

class tp_processes : public ::testing::TestWithParam<tp_case> {};

TEST_P(tp_processes, every_rank_process_reproduces_the_goldens) {
  const auto& c = GetParam();
  const auto golden = testing::load_golden(c.fixture);
  auto id = transport::make_shm_group_id();
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids;
  for (int r = 0; r < c.tp; ++r) {
    pid_t pid = ::fork();
    if (pid == 0) {
      ::alarm(120);
      int code = run_rank(golden, id, c.tp, r);
      std::fflush(stderr);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  for (int r = 0; r < c.tp; ++r) {
    int st = 0;
    ::waitpid(pids[r], &st, 0);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0)
        << "rank " << r << " exit " << (WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st)) << " (see stderr)";
  }
}

INSTANTIATE_TEST_SUITE_P(fixtures, tp_processes, ::testing::ValuesIn(cases()), [](const auto& info) {
  return testing::test_name(info.param.fixture + "_tp" + std::to_string(info.param.tp));
});

}  // namespace
}  // namespace conveyor
