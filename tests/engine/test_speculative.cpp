// Speculative decoding: the verification pass and KV rollback of the executor, the greedy identity
// with plain decoding on every fixture, and the distribution of rejection sampling.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "conveyor/engine/local_pipeline.hpp"
#include "conveyor/engine/speculative_decoder.hpp"
#include "conveyor/engine/speculative_sampling.hpp"
#include "conveyor/kernels/cpu_backend.hpp"
#include "conveyor/kernels/sampling.hpp"
#include "golden.hpp"

namespace conveyor {
namespace {

using engine::local_pipeline;

constexpr float logit_tol = 1e-4f;

using testing::max_abs_diff;

engine::executor_options options(int max_step_tokens = 512, int max_seqs = 16, int kv_blocks = 128) {
  engine::executor_options o;
  o.kv_block_size = 16;
  o.kv_blocks = kv_blocks;
  o.max_step_tokens = max_step_tokens;
  o.max_seqs = max_seqs;
  return o;
}

std::unique_ptr<local_pipeline> make(kernels::backend& b, const std::string& dir, int stages,
                                     const engine::executor_options& o, int keep_layers = 0) {
  auto p = local_pipeline::create(b, dir, stages, o, keep_layers);
  EXPECT_TRUE(p.ok()) << (p.ok() ? "" : p.err().message);
  return p.ok() ? std::move(p).value() : nullptr;
}

class speculative_golden : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    golden_ = testing::load_golden(GetParam());
    backend_ = kernels::make_cpu_backend({});
  }
  testing::golden_fixture golden_;
  std::unique_ptr<kernels::backend> backend_;
};

// One verification step (k + 1 new positions on top of the KV) draws at every row what sequential
// decoding draws, with the same logits; after rejected drafts, truncating and re-verifying gives
// the same result as if they had never been written.
TEST_P(speculative_golden, verify_pass_and_rollback_match_sequential_decoding) {
  for (int stages : {1, 2}) {
    auto pipe = make(*backend_, golden_.dir, stages, options());
    ASSERT_TRUE(pipe);
    const int vocab = pipe->config().vocab_size;
    auto& blocks = pipe->blocks();
    for (std::size_t pi = 0; pi < golden_.prompts.size(); ++pi) {
      const auto& p = golden_.prompts[pi];
      const int t = static_cast<int>(p.input_ids.size());
      const auto& g = p.greedy;
      auto run = [&](std::vector<std::int32_t> tokens, int start, int rows) {
        EXPECT_TRUE(blocks.reserve(3, start + static_cast<int>(tokens.size())).ok());
        engine::step_plan plan;
        engine::sequence_step s;
        s.seq_id = 3;
        s.tokens = std::move(tokens);
        s.start_pos = start;
        s.block_table = blocks.table(3);
        s.sample_rows = rows;
        s.sampling.step = static_cast<std::uint64_t>(start + s.tokens.size());
        s.logits = engine::logits_mode::sampled;
        plan.seqs.push_back(s);
        auto out = pipe->step(plan);
        EXPECT_TRUE(out.ok()) << out.err().message;
        return out.ok() ? std::move(out).value() : engine::step_output{};
      };
      auto out = run(p.input_ids, 0, 1);
      ASSERT_EQ(out.row_tokens, std::vector<std::int32_t>{g[0]});
      // Wrong drafts after g0: only the first row (after g0) is right.
      std::vector<std::int32_t> wrong{g[0]};
      for (int i = 1; i <= 4; ++i) wrong.push_back((g[i] + 1) % vocab);
      out = run(wrong, t, 5);
      ASSERT_EQ(out.row_tokens.size(), 5u);
      EXPECT_EQ(out.row_tokens[0], g[1]) << "prompt " << pi;
      EXPECT_LE(max_abs_diff(out.logits.data(), p.greedy_logits.data() + vocab, vocab), logit_tol);
      // Roll back to [prompt, g0] and verify the right drafts g1..g4.
      blocks.truncate(3, t + 1);
      out = run({g[1], g[2], g[3], g[4]}, t + 1, 4);
      ASSERT_EQ(out.row_tokens.size(), 4u);
      EXPECT_EQ(out.row_tokens, std::vector<std::int32_t>(g.begin() + 2, g.begin() + 6)) << "prompt " << pi;
      ASSERT_EQ(out.logits.size(), 4u * vocab);
      EXPECT_LE(max_abs_diff(out.logits.data(), p.greedy_logits.data() + 2 * vocab, 4 * vocab), logit_tol)
          << "stages " << stages << " prompt " << pi;
      blocks.release(3);
    }
  }
}

engine::generation_request greedy(const testing::golden_prompt& p) {
  engine::generation_request r;
  r.prompt = p.input_ids;
  r.max_new_tokens = static_cast<int>(p.greedy.size());
  r.stop_at_eos = false;
  return r;
}

// Greedy speculative decoding emits exactly the target's tokens, whatever the draft, k, the stage
// split or the step budget (a small budget splits the prompt + drafts into chunks).
TEST_P(speculative_golden, greedy_output_equals_plain_decoding) {
  auto cfg = engine::load_model_config(golden_.dir);
  ASSERT_TRUE(cfg.ok());
  std::vector<engine::generation_request> all;
  for (const auto& p : golden_.prompts) all.push_back(greedy(p));
  struct variant {
    int stages, keep_layers, k, max_step_tokens;
  };
  for (const variant v : {variant{1, 1, 4, 512}, variant{2, 1, 3, 512}, variant{2, cfg->num_layers - 1, 5, 8},
                          variant{1, cfg->num_layers, 4, 512}}) {
    auto target = make(*backend_, golden_.dir, v.stages, options(v.max_step_tokens));
    auto draft = make(*backend_, golden_.dir, 1, options(v.max_step_tokens), v.keep_layers);
    ASSERT_TRUE(target && draft);
    auto spec = engine::speculative_decoder::create(*target, *draft, {v.k});
    ASSERT_TRUE(spec.ok()) << spec.err().message;
    auto res = (*spec)->generate(all);  // every prompt in one batch
    ASSERT_TRUE(res.ok()) << res.err().message;
    for (std::size_t i = 0; i < all.size(); ++i) {
      EXPECT_EQ((*res)[i].tokens, golden_.prompts[i].greedy)
          << "stages " << v.stages << " draft layers " << v.keep_layers << " k " << v.k << " prompt " << i;
    }
    const auto& st = (*spec)->stats();
    EXPECT_EQ(st.emitted, static_cast<std::int64_t>(all.size() * golden_.prompts[0].greedy.size()));
    if (v.keep_layers == cfg->num_layers) {
      // The draft is the target: every draft is kept, k + 1 tokens per step but the last ones, after
      // the prompt's step (its 1 token).
      EXPECT_EQ(st.accepted, st.proposed);
      EXPECT_DOUBLE_EQ(st.acceptance_rate(), 1.0);
      EXPECT_EQ(st.rounds, static_cast<std::int64_t>(all.size()) * (1 + (23 + v.k) / (v.k + 1)));
    }
  }
}

// With sampling and exact-match verification, the tokens are those plain decoding draws with the
// same seed (the target draws every row with the position's own random number).
TEST_P(speculative_golden, exact_match_sampling_equals_plain_sampling) {
  auto target = make(*backend_, golden_.dir, 2, options());
  auto draft = make(*backend_, golden_.dir, 1, options(), 1);
  ASSERT_TRUE(target && draft);
  std::vector<engine::generation_request> reqs;
  for (std::uint64_t seed : {1u, 2u, 3u}) {
    engine::generation_request r = greedy(golden_.prompts.back());
    r.sampling.temperature = 0.9f;
    r.sampling.top_k = 40;
    r.sampling.top_p = 0.95f;
    r.sampling.seed = seed;
    reqs.push_back(r);
  }
  auto plain = target->generate(reqs);
  ASSERT_TRUE(plain.ok()) << plain.err().message;
  engine::speculative_options o;
  o.k = 3;
  o.rejection_sampling = false;
  auto spec = engine::speculative_decoder::create(*target, *draft, o);
  ASSERT_TRUE(spec.ok());
  auto res = (*spec)->generate(reqs);
  ASSERT_TRUE(res.ok()) << res.err().message;
  for (std::size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ((*res)[i].tokens, (*plain)[i].tokens) << "seed " << i + 1;
}

INSTANTIATE_TEST_SUITE_P(fixtures, speculative_golden, ::testing::ValuesIn(testing::fixture_names()));

TEST(speculative, a_draft_with_another_vocabulary_is_an_error) {
  auto b = kernels::make_cpu_backend({});
  auto target = make(*b, testing::fixture_dir("tiny-llama"), 1, options());
  auto draft = make(*b, testing::fixture_dir("llama3-scaled"), 1, options());
  ASSERT_TRUE(target && draft);
  auto spec = engine::speculative_decoder::create(*target, *draft, {4});
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.err().message.find("vocabulary"), std::string::npos) << spec.err().message;
  EXPECT_FALSE(engine::speculative_decoder::create(*target, *target, {0}).ok());
}

// A draft of another family (tiny-qwen2, same 1024-token vocabulary, unrelated random weights)
// is rejected almost always, and the output is still exactly the target's.
TEST(speculative, unrelated_draft_keeps_greedy_output) {
  auto b = kernels::make_cpu_backend({});
  const auto golden = testing::load_golden("tiny-llama");
  auto target = make(*b, golden.dir, 2, options());
  auto draft = make(*b, testing::fixture_dir("tiny-qwen2"), 1, options());
  ASSERT_TRUE(target && draft);
  auto spec = engine::speculative_decoder::create(*target, *draft, {4});
  ASSERT_TRUE(spec.ok());
  for (const auto& p : golden.prompts) {
    auto res = (*spec)->generate({greedy(p)});
    ASSERT_TRUE(res.ok()) << res.err().message;
    EXPECT_EQ((*res)[0].tokens, p.greedy);
  }
}

// Pearson's chi-square of counts against probabilities (cells with p == 0 must be empty).
double chi_square(const std::vector<int>& counts, const std::vector<double>& p, int n, bool* impossible) {
  double chi = 0.0;
  *impossible = false;
  for (std::size_t i = 0; i < p.size(); ++i) {
    if (p[i] == 0.0) {
      *impossible = *impossible || counts[i] > 0;
      continue;
    }
    const double e = p[i] * n;
    chi += (counts[i] - e) * (counts[i] - e) / e;
  }
  return chi;
}

std::int32_t draw_from(const std::vector<double>& w, double u) {
  double cum = 0.0;
  for (std::size_t i = 0; i < w.size(); ++i) {
    cum += w[i];
    if (u < cum) return static_cast<std::int32_t>(i);
  }
  return static_cast<std::int32_t>(w.size() - 1);
}

// Rejection sampling on a 6-token vocabulary: draft q, target p (one token the draft never
// proposes, one the target never emits). The first emitted token must follow p, the pair of the
// first two tokens p0 × p1. Chi-square critical values at 0.999: 20.52 (5 dof), 27.88 (9 dof).
TEST(speculative_rejection_sampling, emitted_tokens_follow_the_target_distribution) {
  const std::vector<double> p0{0.30, 0.25, 0.20, 0.15, 0.10, 0.00};
  const std::vector<double> q0{0.10, 0.40, 0.05, 0.00, 0.15, 0.30};
  const std::vector<double> p1{0.05, 0.05, 0.10, 0.20, 0.60, 0.00};
  const std::vector<double> q1{0.40, 0.30, 0.10, 0.10, 0.05, 0.05};
  const std::vector<double> p2{0.20, 0.20, 0.20, 0.20, 0.20, 0.00};
  constexpr int n = 40000;
  std::vector<int> first(6, 0), drafted(6, 0);
  std::map<std::pair<int, int>, int> pairs;
  std::int64_t accepted = 0;
  for (int trial = 0; trial < n; ++trial) {
    const std::uint64_t seed = 1000 + trial;
    // The draft draws two tokens with its own stream, as the decoder does.
    const std::int32_t d0 = draw_from(q0, kernels::sample_uniform(engine::draft_seed(seed), 10));
    const std::int32_t d1 = draw_from(q1, kernels::sample_uniform(engine::draft_seed(seed), 11));
    const std::vector<std::int32_t> drafts{d0, d1};
    const std::vector<std::vector<double>> p{p0, p1, p2}, q{q0, q1};
    const auto v = engine::verify_rejection(drafts, p, q, seed, 10);
    ASSERT_GE(v.accepted, 0);
    ASSERT_LE(v.accepted, 2);
    accepted += v.accepted;
    std::vector<std::int32_t> out(drafts.begin(), drafts.begin() + v.accepted);
    out.push_back(v.next);
    ++first[out[0]];
    ++drafted[d0];
    if (out.size() >= 2) ++pairs[{out[0], out[1]}];
  }
  bool impossible = false;
  const double chi_first = chi_square(first, p0, n, &impossible);
  EXPECT_FALSE(impossible) << "a token with target probability 0 was emitted";
  EXPECT_LT(chi_first, 20.52) << "first token does not follow the target";
  // The test can tell: the draft's own tokens are far from p.
  EXPECT_GT(chi_square(drafted, p0, n, &impossible), 1000.0);
  // Second token given the first is p1 whatever happened at the first position: condition on the
  // first token being 0 (kept draft or correction alike).
  std::vector<int> second(6, 0);
  int given = 0;
  for (const auto& [k, c] : pairs) {
    if (k.first == 0) {
      second[k.second] += c;
      given += c;
    }
  }
  EXPECT_LT(chi_square(second, p1, given, &impossible), 20.52);
  EXPECT_FALSE(impossible);
  // Expected acceptance at position 0 is sum min(p, q) = 0.5.
  EXPECT_GT(accepted, n / 2);
}

TEST(speculative_rejection_sampling, warped_probs_is_the_distribution_sample_row_draws) {
  const std::vector<float> logits{1.0f, 3.0f, 2.5f, -1.0f, 0.5f, 2.9f};
  kernels::sample_params sp;
  sp.temperature = 0.7f;
  sp.top_k = 4;
  sp.top_p = 0.9f;
  std::vector<double> p;
  engine::warped_probs(logits.data(), 6, sp, p);
  std::vector<int> counts(6, 0);
  std::vector<std::pair<float, std::int32_t>> scratch;
  constexpr int n = 20000;
  for (int i = 0; i < n; ++i) {
    sp.seed = 7;
    sp.step = i;
    ++counts[kernels::sample_row(logits.data(), 6, sp, scratch)];
  }
  bool impossible = false;
  EXPECT_LT(chi_square(counts, p, n, &impossible), 20.52);
  EXPECT_FALSE(impossible);
  sp.temperature = 0.0f;
  engine::warped_probs(logits.data(), 6, sp, p);
  EXPECT_EQ(p, (std::vector<double>{0, 1, 0, 0, 0, 0}));
}

// End to end on tiny-llama: 1500 seeded requests under rejection sampling (draft = the model's first
// three layers, top-k 4). The first token is the target's own draw after the prompt (the prompt goes
// through the target alone, as in plain decoding); the second is the first verified one, and follows
// the target's marginal sum over t0 of p(t0) p(t1 | t0).
TEST(speculative_rejection_sampling, end_to_end_first_token_follows_the_target) {
  auto b = kernels::make_cpu_backend({});
  const auto golden = testing::load_golden("tiny-llama");
  const auto& prompt = golden.prompts[1].input_ids;
  constexpr int n = 1500;
  auto target = make(*b, golden.dir, 1, options(4096, n, n * 3));
  auto draft = make(*b, golden.dir, 1, options(4096, n, n * 3), 3);
  ASSERT_TRUE(target && draft);
  kernels::sample_params sp;
  sp.temperature = 1.5f;
  sp.top_k = 4;
  // The target's distribution after the prompt.
  ASSERT_TRUE(target->blocks().reserve(-1, static_cast<int>(prompt.size())).ok());
  engine::step_plan plan;
  engine::sequence_step s;
  s.seq_id = -1;
  s.tokens = prompt;
  s.block_table = target->blocks().table(-1);
  s.logits = engine::logits_mode::last;
  plan.seqs.push_back(s);
  auto out = target->step(plan);
  target->blocks().release(-1);
  ASSERT_TRUE(out.ok());
  const int vocab = target->config().vocab_size;
  std::vector<double> p;
  engine::warped_probs(out->logits.data(), vocab, sp, p);
  // The second token's marginal: every possible first token t0, the target's distribution after it.
  std::vector<double> p2(vocab, 0.0);
  for (int t0 = 0; t0 < vocab; ++t0) {
    if (p[t0] == 0.0) continue;
    std::vector<std::int32_t> ids = prompt;
    ids.push_back(t0);
    ASSERT_TRUE(target->blocks().reserve(-1, static_cast<int>(ids.size())).ok());
    engine::step_plan plan2;
    engine::sequence_step s2;
    s2.seq_id = -1;
    s2.tokens = ids;
    s2.block_table = target->blocks().table(-1);
    s2.logits = engine::logits_mode::last;
    plan2.seqs.push_back(s2);
    auto out2 = target->step(plan2);
    target->blocks().release(-1);
    ASSERT_TRUE(out2.ok());
    std::vector<double> q;
    engine::warped_probs(out2->logits.data(), vocab, sp, q);
    for (int t = 0; t < vocab; ++t) p2[t] += p[t0] * q[t];
  }
  std::vector<engine::generation_request> reqs;
  for (int i = 0; i < n; ++i) {
    engine::generation_request r;
    r.prompt = prompt;
    r.max_new_tokens = 3;  // the prompt's token, then one verification of 1 draft token (k = min(2, 3 - 1 - 1))
    r.stop_at_eos = false;
    r.sampling = sp;
    r.sampling.seed = 5000 + i;
    reqs.push_back(r);
  }
  auto spec = engine::speculative_decoder::create(*target, *draft, {2});
  ASSERT_TRUE(spec.ok());
  auto res = (*spec)->generate(reqs);
  ASSERT_TRUE(res.ok()) << res.err().message;
  std::vector<int> counts(vocab, 0), counts2(vocab, 0);
  for (const auto& r : *res) {
    ++counts[r.tokens.at(0)];
    ++counts2[r.tokens.at(1)];
  }
  bool impossible = false;
  EXPECT_LT(chi_square(counts, p, n, &impossible), 16.27);  // 3 dof, 0.999
  EXPECT_FALSE(impossible);
  // 0.999 quantiles of chi-square by degrees of freedom (at most 4 x 4 - 1 categories' worth).
  const double q999[] = {0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12, 27.88, 29.59, 31.26, 32.91,
                         34.53, 36.12, 37.70};
  const int dof = static_cast<int>(std::count_if(p2.begin(), p2.end(), [](double x) { return x > 0.0; })) - 1;
  ASSERT_GE(dof, 1);
  ASSERT_LE(dof, 15);
  EXPECT_LT(chi_square(counts2, p2, n, &impossible), q999[dof]);
  EXPECT_FALSE(impossible);
  const auto& st = (*spec)->stats();
  EXPECT_GT(st.proposed, 0);
  EXPECT_GT(st.accepted, 0);
  EXPECT_LT(st.accepted, st.proposed);
}

}  // namespace
}  // namespace conveyor
