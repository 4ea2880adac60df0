// tp_step_bench: what a tensor-parallel stage's host side adds to a step. One stage of `--tp` ranks
// (CPU backends of one thread each, the CPU collective; ranks as threads of tp_stage) on a small model
// runs `--steps` decode steps of one sequence; prints the median and mean step time, against the same
// model on one rank. The model's compute is tiny (tests/fixtures/tiny-llama by default), so the
// difference is mostly the per-step dispatch of the ranks and the all-reduces' synchronisation.
//   usage: tp_step_bench [--model DIR] [--tp N] [--steps N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "conveyor/engine/local_pipeline.hpp"
#include "conveyor/kernels/cpu_backend.hpp"
#include "conveyor/transport/cpu_collective.hpp"

using namespace conveyor;

namespace {
struct timing {
  double median_us = 0, mean_us = 0;
};

timing decode_steps(int tp, const std::string& model, int steps) {
  std::vector<std::unique_ptr<kernels::backend>> owned;
  std::vector<kernels::backend*> backends;
  for (int r = 0; r < tp; ++r) {
    owned.push_back(kernels::make_cpu_backend({1}));
    backends.push_back(owned.back().get());
  }
  engine::executor_options o;
  o.kv_blocks = (steps + 64) / 16 + 2;
  o.max_step_tokens = 64;
  o.max_seqs = 4;
  auto make_group = [](int size) -> result<std::vector<std::unique_ptr<kernels::collective>>> {
    return transport::cpu_group(size, std::chrono::seconds(30)).all_ranks();
  };
  auto pipe = engine::local_pipeline::create(backends, model, 1, o, make_group);
  if (!pipe) {
    std::fprintf(stderr, "tp_step_bench: %s\n", pipe.err().message.c_str());
    std::exit(1);
  }
  auto& p = **pipe;
  if (!p.blocks().reserve(1, steps + 9).ok()) std::exit(1);
  engine::step_plan plan;
  engine::sequence_step s;
  s.seq_id = 1;
  s.tokens = {1, 2, 3, 4, 5, 6, 7, 8};
  s.block_table = p.blocks().table(1);
  plan.seqs.push_back(s);
  auto out = p.step(plan);
  if (!out) std::exit(1);
  std::vector<double> us;
  int pos = 8;
  for (int i = 0; i < steps; ++i) {
    plan.seqs[0].tokens = {out->tokens[0]};
    plan.seqs[0].start_pos = pos++;
    const auto t0 = std::chrono::steady_clock::now();
    out = p.step(plan);
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    if (!out) {
      std::fprintf(stderr, "tp_step_bench: %s\n", out.err().message.c_str());
      std::exit(1);
    }
  }
  timing t;
  for (double x : us) t.mean_us += x / us.size();
  std::nth_element(us.begin(), us.begin() + us.size() / 2, us.end());
  t.median_us = us[us.size() / 2];
  return t;
}
}  // namespace

int main(int argc, char** argv) {
  std::string model = CONVEYOR_FIXTURES_DIR "/tiny-llama";
  int tp = 2, steps = 400;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--model")) model = argv[i + 1];
    else if (!std::strcmp(argv[i], "--tp")) tp = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--steps")) steps = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "tp_step_bench: unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  if (tp < 1 || steps < 1) {
    std::fprintf(stderr, "tp_step_bench: --tp and --steps must be positive\n");
    return 2;
  }
  for (int round = 0; round < 2; ++round) {
    for (int t : {1, tp}) {
      const timing r = decode_steps(t, model, steps);
      std::printf("round %d tp %d: decode step median %.1f us, mean %.1f us (%d steps)\n", round + 1, t,
                  r.median_us, r.mean_us, steps);
    }
  }
  return 0;
}
