// tp_step_bench: what a tensor-parallel stage's host side adds to a decode step. One stage of `--tp`
// ranks runs `--steps` decode steps of `--batch` sequences, against the same model on one rank, each
// two ways: plain steps (the host waits for each step's tokens before it plans the next) and queued
// steps (tp_stage::begin / end: step n+1 is queued, its ids chained on the device to step n's draw,
// before the host waits for step n). Prints the median and mean time a step.
//   --device cpu (default): CPU backends of one thread each, the CPU collective; the model's compute
//     is tiny (tests/fixtures/tiny-llama by default), so the ranks' dispatch and the all-reduces'
//     synchronisation dominate.
//   --device cuda: bf16 CUDA backends, rank r on GPU r, NCCL (needs --tp GPUs; a multi-GPU device
//     kind). TP steps are not recorded as CUDA graphs, so the host's launches are part of the step.
//   usage: tp_step_bench [--model DIR] [--tp N] [--steps N] [--batch N] [--device cpu|cuda]
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
#ifdef CONVEYOR_HAVE_CUDA
#include "conveyor/kernels/cuda_backend.hpp"
#include "conveyor/transport/nccl_collective.hpp"
#endif

using namespace conveyor;

namespace {
struct options {
  std::string model = CONVEYOR_FIXTURES_DIR "/tiny-llama";
  std::string device = "cpu";
  int tp = 2, steps = 400, batch = 1;
};

struct timing {
  double median_us = 0, mean_us = 0;
};

timing summarize(std::vector<double> us) {
  timing t;
  for (double x : us) t.mean_us += x / static_cast<double>(us.size());
  std::nth_element(us.begin(), us.begin() + static_cast<long>(us.size() / 2), us.end());
  t.median_us = us[us.size() / 2];
  return t;
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "tp_step_bench: %s\n", what.c_str());
  std::exit(1);
}

/// Owns the ranks' backends and the pipeline (one stage of `tp` ranks).
struct stage_under_test {
  std::vector<std::unique_ptr<kernels::backend>> owned;
  std::unique_ptr<engine::local_pipeline> pipe;
};

stage_under_test make_stage(const options& o, int tp) {
  stage_under_test s;
  std::vector<kernels::backend*> backends;
  for (int r = 0; r < tp; ++r) {
    if (o.device == "cuda") {
#ifdef CONVEYOR_HAVE_CUDA
      kernels::cuda_backend_options co;
      co.device = r;
      co.compute_dtype = kernels::dtype::bf16;
      auto b = kernels::make_cuda_backend(co);
      if (!b) die(b.err().message);
      s.owned.push_back(std::move(b).value());
#else
      die("built without CUDA");
#endif
    } else {
      s.owned.push_back(kernels::make_cpu_backend({1}));
    }
    backends.push_back(s.owned.back().get());
  }
  engine::executor_options eo;
  eo.kv_block_size = 16;
  eo.kv_blocks = o.batch * ((o.steps + 40) / 16 + 2);
  eo.max_step_tokens = std::max(64, 8 * o.batch);
  eo.max_seqs = o.batch;
  engine::tp_group_factory make_group = [](int size) -> result<std::vector<std::unique_ptr<kernels::collective>>> {
    return transport::cpu_group(size, std::chrono::seconds(30)).all_ranks();
  };
#ifdef CONVEYOR_HAVE_CUDA
  if (o.device == "cuda") {
    make_group = [backends](int size) {
      std::vector<int> devices;
      std::vector<void*> streams;
      for (int r = 0; r < size; ++r) {
        devices.push_back(r);
        streams.push_back(kernels::cuda_stream_of(*backends[static_cast<std::size_t>(r)]));
      }
      return transport::make_nccl_group(devices, streams);
    };
  }
#endif
  auto pipe = engine::local_pipeline::create(backends, o.model, 1, eo, make_group);
  if (!pipe) die(pipe.err().message);
  s.pipe = std::move(pipe).value();
  return s;
}

/// `o.steps` decode steps of `o.batch` sequences after an 8-token prefill each; queued: one step
/// ahead, chained. The time a step: plain, each step's call; queued, the time between ends.
timing decode_steps(const options& o, engine::local_pipeline& p, bool queued) {
  engine::step_plan plan;
  for (int i = 0; i < o.batch; ++i) {
    if (!p.blocks().reserve(i + 1, o.steps + 10).ok()) die("KV pool too small");
    engine::sequence_step s;
    s.seq_id = i + 1;
    s.tokens = {1, 2, 3, 4, 5, 6, 7, static_cast<std::int32_t>(8 + i)};
    s.block_table = p.blocks().table(i + 1);
    plan.seqs.push_back(s);
  }
  auto out = p.step(plan);
  if (!out) die(out.err().message);
  auto next = [&](int k) {  // step k's plan (its ids are stale when chained: the device's draw is used)
    for (int i = 0; i < o.batch; ++i) {
      plan.seqs[static_cast<std::size_t>(i)].tokens = {out->tokens[static_cast<std::size_t>(i)]};
      plan.seqs[static_cast<std::size_t>(i)].start_pos = 8 + k;
    }
    return plan;
  };
  std::vector<double> us;
  auto t0 = std::chrono::steady_clock::now();
  auto lap = [&] {
    const auto t = std::chrono::steady_clock::now();
    us.push_back(std::chrono::duration<double, std::micro>(t - t0).count());
    t0 = t;
  };
  if (!queued) {
    for (int k = 0; k < o.steps; ++k) {
      out = p.step(next(k));
      if (!out) die(out.err().message);
      lap();
    }
  } else {
    if (auto st = p.begin_step(next(0), false); !st) die(st.err().message);
    for (int k = 1; k < o.steps; ++k) {
      if (auto st = p.begin_step(next(k), true); !st) die(st.err().message);
      auto done = p.end_step();
      if (!done) die(done.err().message);
      lap();
    }
    auto done = p.end_step();
    if (!done) die(done.err().message);
    lap();
  }
  for (int i = 0; i < o.batch; ++i) p.blocks().release(i + 1);
  return summarize(std::move(us));
}
}  // namespace

int main(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) die(flag + " needs a value");
    const char* v = argv[i + 1];
    if (flag == "--model") o.model = v;
    else if (flag == "--device") o.device = v;
    else if (flag == "--tp") o.tp = std::atoi(v);
    else if (flag == "--steps") o.steps = std::atoi(v);
    else if (flag == "--batch") o.batch = std::atoi(v);
    else die("unknown flag " + flag);
  }
  if (o.tp < 1 || o.steps < 2 || o.batch < 1) die("--tp and --batch must be positive, --steps at least 2");
  if (o.device != "cpu" && o.device != "cuda") die("--device is cpu or cuda, not " + o.device);
  std::printf("tp_step_bench: %s, %s, batch %d, %d decode steps a run\n", o.model.c_str(), o.device.c_str(),
              o.batch, o.steps);
  for (int t : {1, o.tp}) {
    auto s = make_stage(o, t);
    for (int round = 0; round < 2; ++round) {
      for (bool queued : {false, true}) {
        const timing r = decode_steps(o, *s.pipe, queued);
        std::printf("round %d tp %d %s: decode step median %.1f us, mean %.1f us\n", round + 1, t,
                    queued ? "queued" : "plain ", r.median_us, r.mean_us);
      }
    }
    if (o.tp == 1) break;
  }
  return 0;
}
