// spec_bench: speculative decoding on one GPU (issue 12). Loads the target once, times plain greedy
// decoding of one prompt, then speculative decoding with drafts made of the target's first N layers
// (+ its final norm and head) for each (N, k) asked, checking that every run emits the plain
// tokens. Prints one JSON line per run: wall time of the whole generation (prefill included), tok/s,
// acceptance, tokens per target step, and the speed-up over plain measured in the same process.
//   usage: spec_bench --model DIR [--draft-layers 2,4] [--k 4] [--prompt 128] [--new 256] [--dtype bf16]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "conveyor/engine/local_pipeline.hpp"
#include "conveyor/engine/speculative_decoder.hpp"
#include "conveyor/kernels/cuda_backend.hpp"

namespace {

using namespace conveyor;

[[noreturn]] void die(const std::string& why) {
  std::fprintf(stderr, "spec_bench: %s\n", why.c_str());
  std::exit(1);
}

std::vector<int> int_list(const std::string& s) {
  std::vector<int> v;
  std::stringstream in(s);
  for (std::string x; std::getline(in, x, ',');) v.push_back(std::stoi(x));
  return v;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::string model, dtype = "bf16";
  std::vector<int> layers{2, 4}, ks{4};
  int prompt = 128, new_tokens = 256, reps = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--model") model = v;
    else if (k == "--draft-layers") layers = int_list(v);
    else if (k == "--k") ks = int_list(v);
    else if (k == "--prompt") prompt = std::stoi(v);
    else if (k == "--new") new_tokens = std::stoi(v);
    else if (k == "--dtype") dtype = v;
    else if (k == "--reps") reps = std::stoi(v);
    else die("unknown flag " + k);
  }
  if (model.empty()) die("--model DIR is required");
  kernels::cuda_backend_options bo;
  bo.compute_dtype = dtype == "f32" ? kernels::dtype::f32 : kernels::dtype::bf16;
  auto backend = kernels::make_cuda_backend(bo);
  if (!backend) die("backend: " + backend.err().message);
  engine::executor_options o;
  o.kv_block_size = 16;
  o.kv_blocks = (prompt + new_tokens + 64) / 16 + 8;
  o.max_step_tokens = std::max(512, prompt + 64);
  o.max_seqs = 1;
  auto t0 = std::chrono::steady_clock::now();
  auto target = engine::local_pipeline::create(**backend, model, 1, o);
  if (!target) die("target: " + target.err().message);
  std::fprintf(stderr, "target loaded in %.1f s\n", seconds_since(t0));
  const int vocab = (*target)->config().vocab_size;
  std::mt19937 rng(3);
  engine::generation_request req;
  for (int i = 0; i < prompt; ++i) req.prompt.push_back(static_cast<std::int32_t>(rng() % (vocab - 1000)) + 500);
  req.max_new_tokens = new_tokens;
  req.stop_at_eos = false;

  // Plain decoding: warm-up (records the CUDA graphs), then the best of `reps`.
  std::vector<std::int32_t> plain_tokens;
  double plain_s = 1e30;
  for (int r = 0; r <= reps; ++r) {
    t0 = std::chrono::steady_clock::now();
    auto res = (*target)->generate({req});
    (*backend)->synchronize();
    const double s = seconds_since(t0);
    if (!res) die("plain: " + res.err().message);
    plain_tokens = (*res)[0].tokens;
    if (r > 0) plain_s = std::min(plain_s, s);
  }
  std::printf("{\"run\":\"plain\",\"new_tokens\":%d,\"seconds\":%.4f,\"tok_s\":%.1f,\"ms_per_token\":%.3f}\n", new_tokens,
              plain_s, new_tokens / plain_s, plain_s * 1e3 / new_tokens);
  std::fflush(stdout);
  for (int n : layers) {
    t0 = std::chrono::steady_clock::now();
    auto draft = engine::local_pipeline::create(**backend, model, 1, o, n);
    if (!draft) die("draft: " + draft.err().message);
    std::fprintf(stderr, "draft of %d layers loaded in %.1f s\n", n, seconds_since(t0));
    for (int k : ks) {
      auto spec = engine::speculative_decoder::create(**target, **draft, {k});
      if (!spec) die("spec: " + spec.err().message);
      double best = 1e30;
      std::vector<std::int32_t> tokens;
      for (int r = 0; r <= reps; ++r) {
        t0 = std::chrono::steady_clock::now();
        auto res = (*spec)->generate({req});
        (*backend)->synchronize();
        const double s = seconds_since(t0);
        if (!res) die("spec: " + res.err().message);
        tokens = (*res)[0].tokens;
        if (r > 0) best = std::min(best, s);
      }
      std::size_t same = 0;
      while (same < tokens.size() && same < plain_tokens.size() && tokens[same] == plain_tokens[same]) ++same;
      const auto& st = (*spec)->stats();
      std::printf("{\"run\":\"spec\",\"draft_layers\":%d,\"k\":%d,\"seconds\":%.4f,\"tok_s\":%.1f,\"speedup\":%.3f,"
                  "\"acceptance\":%.4f,\"tokens_per_target_step\":%.3f,\"target_steps\":%lld,\"draft_steps\":%lld,"
                  "\"target_s\":%.4f,\"draft_s\":%.4f,\"identical_prefix\":%zu}\n",
                  n, k, best, new_tokens / best, plain_s / best, st.acceptance_rate(), st.tokens_per_target_step(),
                  static_cast<long long>(st.target_steps), static_cast<long long>(st.draft_steps), st.target_seconds,
                  st.draft_seconds, same);
      std::fflush(stdout);
    }
  }
  return 0;
}
