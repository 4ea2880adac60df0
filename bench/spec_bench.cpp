// spec_bench: speculative decoding vs plain decoding of the same prompts, in one process (issue 12).
// Loads the target once and times plain greedy decoding of each prompt (batch 1, one after the
// other), then speculative decoding with each draft asked: a trained draft model of the same
// vocabulary (--draft DIR) and/or the target's own first N layers + its final norm and head
// (--draft-layers N), for each k. Every speculative run must emit the plain tokens; the number that
// do is printed. One JSON line per run: wall time of all prompts' generations (prefill included),
// tok/s, acceptance, tokens per target step, and the speed-up over plain measured in the same run.
//   usage: spec_bench --model DIR [--device cpu|cuda] [--dtype f32|bf16] [--threads N]
//            [--draft DIR,DIR] [--draft-layers 2,4] [--k 2,4]
//            [--prompt-text "A|B|C" | --prompt 128] [--new 256] [--reps 2] [--batch-invariant 0|1]
//            [--ngram 2:4,1:3] [--ngram-corpus-text FILE | --ngram-corpus IDS] [--write-corpus IDS]
// --ngram MIN:MAX: the n-gram proposer (prompt lookup, no model) with those match lengths, alone and,
// with a corpus, again with the corpus as its datastore. --ngram-corpus-text FILE: a text tokenised
// here with the model's tokenizer (paragraphs between blank lines, no special tokens; --write-corpus
// writes the ids for `conveyor generate --ngram-corpus`); --ngram-corpus IDS: decimal token ids.
// --batch-invariant 1 (CUDA): row-invariant kernels, so verification rows compute exactly what
// decode steps do (cuda_backend_options::batch_invariant); plain decoding runs on the same backend.
#include <chrono>
#include <fstream>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "conveyor/engine/local_pipeline.hpp"
#include "conveyor/engine/draft_proposer.hpp"
#include "conveyor/engine/ngram_proposer.hpp"
#include "conveyor/engine/speculative_decoder.hpp"
#include "conveyor/kernels/cpu_backend.hpp"
#include "conveyor/tokenizer/tokenizer.hpp"
#include "flag_values.hpp"
#ifdef CONVEYOR_HAVE_CUDA
#include "conveyor/kernels/cuda_backend.hpp"
#endif

namespace {

using namespace conveyor;

[[noreturn]] void die(const std::string& why) {
  std::fprintf(stderr, "spec_bench: %s\n", why.c_str());
  std::exit(1);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> v;
  std::stringstream in(s);
  for (std::string x; std::getline(in, x, sep);)
    if (!x.empty()) v.push_back(x);
  return v;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct run_result {
  double seconds = 0.0;
  std::vector<std::vector<std::int32_t>> tokens;  // per prompt
  engine::speculative_stats stats;                // summed over prompts (speculative runs)
};

}  // namespace

int main(int argc, char** argv) {
  std::string model, device = "cuda", dtype, prompt_text, corpus_text, corpus_ids, write_corpus;
  std::vector<std::string> ngrams;
  std::vector<std::string> drafts;
  std::vector<int> layers, ks{4};
  bool layers_given = false;
  int prompt = 128, new_tokens = 256, reps = 2, threads = 0, batch_invariant = 0;
  for (int i = 1; i < argc; i += 2) {
    const std::string k = argv[i];
    if (i + 1 >= argc) die("missing value after " + k);
    const std::string v = argv[i + 1];
    if (k == "--model") model = v;
    else if (k == "--device") device = v;
    else if (k == "--dtype") dtype = v;
    else if (k == "--threads") threads = bench::int_flag(k, v, 0, 4096, die);
    else if (k == "--draft") drafts = split(v, ',');
    else if (k == "--draft-layers") layers = bench::int_list_flag(k, v, 1, 4096, die), layers_given = true;
    else if (k == "--k") ks = bench::int_list_flag(k, v, 1, 64, die);
    else if (k == "--prompt") prompt = bench::int_flag(k, v, 1, 1 << 20, die);
    else if (k == "--prompt-text") prompt_text = v;
    else if (k == "--new") new_tokens = bench::int_flag(k, v, 1, 1 << 20, die);
    else if (k == "--reps") reps = bench::int_flag(k, v, 1, 1000, die);
    else if (k == "--batch-invariant") batch_invariant = bench::int_flag(k, v, 0, 1, die);
    else if (k == "--ngram") ngrams = split(v, ',');
    else if (k == "--ngram-corpus-text") corpus_text = v;
    else if (k == "--ngram-corpus") corpus_ids = v;
    else if (k == "--write-corpus") write_corpus = v;
    else die("unknown flag " + k);
  }
  if (model.empty()) die("--model DIR is required");
  if (!layers_given && drafts.empty() && ngrams.empty()) layers = {2, 4};
  if (dtype.empty()) dtype = device == "cpu" ? "f32" : "bf16";

  std::unique_ptr<kernels::backend> backend;
  if (device == "cpu") {
    if (dtype != "f32") die("--device cpu computes in f32 only");
    backend = kernels::make_cpu_backend({threads});
  } else if (device == "cuda") {
#ifdef CONVEYOR_HAVE_CUDA
    kernels::cuda_backend_options bo;
    bo.compute_dtype = dtype == "f32" ? kernels::dtype::f32 : kernels::dtype::bf16;
    bo.batch_invariant = batch_invariant != 0;
    auto b = kernels::make_cuda_backend(bo);
    if (!b) die("backend: " + b.err().message);
    backend = std::move(b).value();
#else
    die("this build has no CUDA backend");
#endif
  } else {
    die("--device must be cpu or cuda");
  }

  // Prompts: texts through the model's tokenizer, or one prompt of random ids.
  std::vector<std::vector<std::int32_t>> prompts;
  if (!prompt_text.empty()) {
    auto tok = tokenizer::load_tokenizer(model);
    if (!tok) die("tokenizer: " + tok.err().message);
    for (const auto& text : split(prompt_text, '|')) {
      auto ids = (*tok)->encode(text);
      if (!ids) die("tokenizer: " + ids.err().message);
      prompts.push_back(std::move(ids).value());
    }
  }
  engine::executor_options o;
  o.kv_block_size = 16;
  int longest = prompt;
  for (const auto& p : prompts) longest = std::max(longest, static_cast<int>(p.size()));
  o.kv_blocks = (longest + new_tokens + 64) / 16 + 8;
  o.max_step_tokens = std::max(512, longest + 64);
  o.max_seqs = 1;
  auto t0 = std::chrono::steady_clock::now();
  auto target = engine::local_pipeline::create(*backend, model, 1, o);
  if (!target) die("target: " + target.err().message);
  std::fprintf(stderr, "target loaded in %.1f s\n", seconds_since(t0));
  if (prompts.empty()) {
    const int vocab = (*target)->config().vocab_size;
    std::mt19937 rng(3);
    std::vector<std::int32_t> ids;
    for (int i = 0; i < prompt; ++i) ids.push_back(static_cast<std::int32_t>(rng() % (vocab - 1000)) + 500);
    prompts.push_back(std::move(ids));
  }
  auto request = [&](const std::vector<std::int32_t>& ids) {
    engine::generation_request r;
    r.prompt = ids;
    r.max_new_tokens = new_tokens;
    r.stop_at_eos = false;
    return r;
  };
  // Each prompt alone (batch 1), one after the other; the best of `reps` timed runs after a warm-up
  // (which records the CUDA graphs).
  auto timed = [&](auto&& gen) {
    run_result best;
    best.seconds = 1e30;
    for (int r = 0; r <= reps; ++r) {
      run_result cur;
      for (const auto& p : prompts) {
        const auto t = std::chrono::steady_clock::now();
        auto res = gen(request(p), cur.stats);
        backend->synchronize();
        cur.seconds += seconds_since(t);
        cur.tokens.push_back(std::move(res));
      }
      if (r == 0) best.tokens = cur.tokens;  // every run draws the same tokens
      if (r > 0 && cur.seconds < best.seconds) {
        best.seconds = cur.seconds;
        best.stats = cur.stats;  // counters and step seconds of the timed run, not the warm-up's
      }
    }
    return best;
  };
  const run_result plain = timed([&](const engine::generation_request& req, engine::speculative_stats&) {
    auto res = (*target)->generate({req});
    if (!res) die("plain: " + res.err().message);
    return (*res)[0].tokens;
  });
  const int total = new_tokens * static_cast<int>(prompts.size());
  std::printf("{\"run\":\"plain\",\"device\":\"%s\",\"dtype\":\"%s\",\"batch_invariant\":%d,\"prompts\":%zu,"
              "\"new_tokens\":%d,\"seconds\":%.4f,\"tok_s\":%.1f,\"ms_per_token\":%.3f}\n",
              device.c_str(), dtype.c_str(), batch_invariant, prompts.size(), total, plain.seconds,
              total / plain.seconds, plain.seconds * 1e3 / total);
  std::fflush(stdout);

  auto bench_draft = [&](engine::token_proposer& draft, const std::string& name) {
    for (int k : ks) {
      auto spec = engine::speculative_decoder::create(**target, draft, {k});
      if (!spec) die("spec: " + spec.err().message);
      const run_result r = timed([&](const engine::generation_request& req, engine::speculative_stats& sum) {
        auto res = (*spec)->generate({req});
        if (!res) die("spec: " + res.err().message);
        const auto& st = (*spec)->stats();
        sum.target_steps += st.target_steps;
        sum.draft_steps += st.draft_steps;
        sum.proposed += st.proposed;
        sum.accepted += st.accepted;
        sum.emitted += st.emitted;
        sum.rounds += st.rounds;
        sum.draft_seconds += st.draft_seconds;
        sum.target_seconds += st.target_seconds;
        return (*res)[0].tokens;
      });
      // Tokens equal to plain decoding's, counted up to each prompt's first difference.
      std::size_t same = 0;
      bool identical = true;
      for (std::size_t i = 0; i < prompts.size(); ++i) {
        const auto& a = r.tokens[i];
        const auto& b = plain.tokens[i];
        std::size_t n = 0;
        while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
        same += n;
        identical = identical && a == b;
      }
      const auto& st = r.stats;
      std::printf("{\"run\":\"spec\",\"draft\":\"%s\",\"k\":%d,\"seconds\":%.4f,\"tok_s\":%.1f,\"speedup\":%.3f,"
                  "\"acceptance\":%.4f,\"tokens_per_target_step\":%.3f,\"target_steps\":%lld,\"draft_steps\":%lld,"
                  "\"target_s\":%.4f,\"draft_s\":%.4f,\"identical_tokens\":%zu,\"of\":%d,\"identical\":%s,"
                  "\"device\":\"%s\"}\n",
                  name.c_str(), k, r.seconds, total / r.seconds, plain.seconds / r.seconds, st.acceptance_rate(),
                  st.tokens_per_target_step(), static_cast<long long>(st.target_steps),
                  static_cast<long long>(st.draft_steps), st.target_seconds, st.draft_seconds, same, total,
                  identical ? "true" : "false", device.c_str());
      std::fflush(stdout);
    }
  };
  // The n-gram proposer: prompt lookup alone, then with the corpus as its datastore.
  std::vector<std::int32_t> corpus;
  if (!corpus_text.empty()) {
    auto tok = tokenizer::load_tokenizer(model);
    if (!tok) die("tokenizer: " + tok.err().message);
    std::ifstream in(corpus_text);
    if (!in) die("cannot read " + corpus_text);
    const auto t = std::chrono::steady_clock::now();
    std::string para, line;
    tokenizer::encode_options eo;
    eo.add_special = false;
    auto flush = [&] {
      if (para.empty()) return;
      auto ids = (*tok)->encode(para, eo);
      if (!ids) die("tokenizer: " + ids.err().message);
      corpus.insert(corpus.end(), ids->begin(), ids->end());
      para.clear();
    };
    // Paragraphs (chapters) one at a time: each ends with its newline, as in the text.
    while (std::getline(in, line)) {
      if (line.empty()) flush();
      para += line + "\n";
    }
    flush();
    std::fprintf(stderr, "corpus: %zu tokens from %s in %.1f s\n", corpus.size(), corpus_text.c_str(), seconds_since(t));
  } else if (!corpus_ids.empty()) {
    auto ids = engine::read_token_ids(corpus_ids);
    if (!ids) die(ids.err().message);
    corpus = std::move(ids).value();
  }
  if (!write_corpus.empty()) {
    std::ofstream out(write_corpus);
    for (std::size_t i = 0; i < corpus.size(); ++i) out << corpus[i] << ((i + 1) % 32 ? ' ' : '\n');
    out << '\n';
  }
  for (const auto& spec : ngrams) {
    const auto parts = split(spec, ':');
    if (parts.size() != 2) die("--ngram takes MIN:MAX, got " + spec);
    engine::ngram_options no{bench::int_flag("--ngram", parts[0], 1, 64, die),
                             bench::int_flag("--ngram", parts[1], 1, 64, die)};
    for (int with_corpus = 0; with_corpus <= (corpus.empty() ? 0 : 1); ++with_corpus) {
      const auto t = std::chrono::steady_clock::now();
      auto p = engine::ngram_proposer::create(no, with_corpus ? corpus : std::vector<std::int32_t>{});
      if (!p) die(p.err().message);
      if (with_corpus) std::fprintf(stderr, "ngram index %s built in %.2f s\n", spec.c_str(), seconds_since(t));
      bench_draft(**p, "ngram " + spec + (with_corpus ? " + corpus" : ""));
    }
  }
  for (const auto& dir : drafts) {
    auto draft = engine::local_pipeline::create(*backend, dir, 1, o);
    if (!draft) die("draft " + dir + ": " + draft.err().message);
    engine::draft_proposer p(**draft);
    bench_draft(p, dir);
  }
  for (int n : layers) {
    auto draft = engine::local_pipeline::create(*backend, model, 1, o, n);
    if (!draft) die("draft: " + draft.err().message);
    engine::draft_proposer p(**draft);
    bench_draft(p, "first " + std::to_string(n) + " layers");
  }
  return 0;
}
