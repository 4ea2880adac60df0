// The demo draft (models/demo-draft, tools/train_draft_model.py) with its target models/demo on the
// CPU in float32: speculative greedy decoding emits exactly the tokens of plain greedy decoding for
// every prompt and k, alone and batched, and the draft is accepted often enough to be the trained
// draft (a random model of the same vocabulary agrees about once in 8192 tokens).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "conveyor/engine/local_pipeline.hpp"
#include "conveyor/engine/ngram_proposer.hpp"
#include "conveyor/engine/speculative_decoder.hpp"
#include "conveyor/kernels/cpu_backend.hpp"
#include "conveyor/tokenizer/tokenizer.hpp"

namespace conveyor {
namespace {

const char* const prompts[] = {"In the beginning", "And God said", "The LORD is my shepherd", "Blessed are the",
                               "And it came to pass", "For God so loved the world"};
constexpr int new_tokens = 48;

engine::executor_options options() {
  engine::executor_options o;
  o.kv_block_size = 16;
  o.kv_blocks = 64;
  o.max_step_tokens = 256;
  o.max_seqs = 8;
  return o;
}

std::vector<engine::generation_request> requests() {
  auto tok = tokenizer::load_tokenizer(CONVEYOR_DEMO_MODEL);
  EXPECT_TRUE(tok.ok()) << (tok.ok() ? "" : tok.err().message);
  std::vector<engine::generation_request> all;
  if (!tok.ok()) return all;
  for (const char* text : prompts) {
    auto ids = (*tok)->encode(text);
    EXPECT_TRUE(ids.ok());
    engine::generation_request r;
    r.prompt = *ids;
    r.max_new_tokens = new_tokens;
    r.stop_at_eos = false;
    all.push_back(r);
  }
  return all;
}

TEST(demo_draft, greedy_speculative_output_equals_plain_decoding) {
  auto backend = kernels::make_cpu_backend({});
  auto target = engine::local_pipeline::create(*backend, CONVEYOR_DEMO_MODEL, 1, options());
  ASSERT_TRUE(target.ok()) << target.err().message;
  auto draft = engine::local_pipeline::create(*backend, CONVEYOR_DEMO_DRAFT, 1, options());
  ASSERT_TRUE(draft.ok()) << draft.err().message;
  const auto reqs = requests();
  ASSERT_EQ(reqs.size(), std::size(prompts));
  std::vector<std::vector<std::int32_t>> plain;
  for (const auto& r : reqs) {  // each prompt alone, as a user would run it
    auto res = (*target)->generate({r});
    ASSERT_TRUE(res.ok()) << res.err().message;
    plain.push_back((*res)[0].tokens);
  }
  for (int k : {1, 3}) {
    auto spec = engine::speculative_decoder::create(**target, **draft, {k});
    ASSERT_TRUE(spec.ok()) << spec.err().message;
    std::int64_t proposed = 0, accepted = 0;
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      auto res = (*spec)->generate({reqs[i]});
      ASSERT_TRUE(res.ok()) << res.err().message;
      EXPECT_EQ((*res)[0].tokens, plain[i]) << "k " << k << " prompt \"" << prompts[i] << "\"";
      proposed += (*spec)->stats().proposed;
      accepted += (*spec)->stats().accepted;
    }
    // All prompts at once (a batch of sequences verifying together) gives the same tokens too.
    auto batched = (*spec)->generate(reqs);
    ASSERT_TRUE(batched.ok()) << batched.err().message;
    for (std::size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ((*batched)[i].tokens, plain[i]) << "batched, k " << k;
    const double rate = proposed ? static_cast<double>(accepted) / proposed : 0.0;
    std::printf("[demo-draft] k %d: acceptance %.3f (%lld of %lld)\n", k, rate, static_cast<long long>(accepted),
                static_cast<long long>(proposed));
    // Measured 0.37 at k = 1 (models/demo-draft/README.md); a random draft of this vocabulary
    // accepts ~1/8192. The bound only says the committed draft is the trained one.
    if (k == 1) EXPECT_GE(rate, 0.25);
  }
}

// The n-gram proposer (prompt lookup + a small datastore: Jeremiah 26:1-2, tokenised here) gives
// the plain greedy tokens too, and the model, which recites the KJV (from "In the beginning" it
// recites Jeremiah 26:1), keeps the datastore's proposals.
TEST(demo_ngram, greedy_speculative_output_equals_plain_decoding) {
  auto backend = kernels::make_cpu_backend({});
  auto target = engine::local_pipeline::create(*backend, CONVEYOR_DEMO_MODEL, 1, options());
  ASSERT_TRUE(target.ok()) << target.err().message;
  auto tok = tokenizer::load_tokenizer(CONVEYOR_DEMO_MODEL);
  ASSERT_TRUE(tok.ok());
  tokenizer::encode_options eo;
  eo.add_special = false;
  auto corpus = (*tok)->encode(
      "Jeremiah 26\nIn the beginning of the reign of Jehoiakim the son of Josiah king of Judah came this word from "
      "the LORD, saying,\nThus saith the LORD; Stand in the court of the LORD's house, and speak unto all the cities "
      "of Judah, which come to worship in the LORD's house, all the words that I command thee to speak unto them; "
      "diminish not a word:\n",
      eo);
  ASSERT_TRUE(corpus.ok());
  const auto reqs = requests();
  ASSERT_EQ(reqs.size(), std::size(prompts));
  for (int k : {2, 4}) {
    auto proposer = engine::ngram_proposer::create({2, 8}, *corpus);
    ASSERT_TRUE(proposer.ok());
    auto spec = engine::speculative_decoder::create(**target, **proposer, {k});
    ASSERT_TRUE(spec.ok()) << spec.err().message;
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      auto plain = (*target)->generate({reqs[i]});
      ASSERT_TRUE(plain.ok());
      auto res = (*spec)->generate({reqs[i]});
      ASSERT_TRUE(res.ok()) << res.err().message;
      EXPECT_EQ((*res)[0].tokens, (*plain)[0].tokens) << "k " << k << " prompt \"" << prompts[i] << "\"";
      if (i == 0) {
        std::printf("[demo-ngram] k %d, \"%s\": %lld of %lld proposals kept\n", k, prompts[i],
                    static_cast<long long>((*spec)->stats().accepted), static_cast<long long>((*spec)->stats().proposed));
        EXPECT_GE((*spec)->stats().accepted, 10) << "the model recites Jeremiah 26:1: the corpus's continuations match";
      }
    }
  }
}

}  // namespace
}  // namespace conveyor
