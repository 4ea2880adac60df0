// The n-gram proposer (prompt lookup + a token datastore): the matcher's rules (longest n first,
// the latest earlier occurrence, the continuation cut at the end, nothing without a match), the
// corpus index, the proposer's errors, and speculative decoding with it on every fixture: greedy
// output equal to plain decoding, with proposals both kept and rejected.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "conveyor/engine/local_pipeline.hpp"
#include "conveyor/engine/ngram_proposer.hpp"
#include "conveyor/engine/speculative_decoder.hpp"
#include "conveyor/kernels/cpu_backend.hpp"
#include "golden.hpp"

namespace conveyor {
namespace {

using engine::lookup_in_sequence;
using ids = std::vector<std::int32_t>;

TEST(ngram_match, proposes_what_followed_the_latest_earlier_occurrence) {
  const ids t{1, 2, 3, 9, 1, 2, 3, 7, 5, 1, 2, 3};
  EXPECT_EQ(lookup_in_sequence(t, 3, 3, 3), (ids{7, 5, 1}));  // not the first occurrence's 9
  EXPECT_EQ(lookup_in_sequence(t, 1, 3, 1), (ids{7}));
}

TEST(ngram_match, the_longest_n_wins_and_min_n_bounds_it) {
  const ids t{5, 2, 3, 8, 1, 2, 3, 9, 4, 5, 2, 3};
  EXPECT_EQ(lookup_in_sequence(t, 1, 3, 3), (ids{8, 1, 2}));  // [5 2 3] occurs, at 0
  EXPECT_EQ(lookup_in_sequence(t, 1, 2, 3), (ids{9, 4, 5}));  // [2 3] latest at 5
  const ids u{1, 2, 3, 4, 3};
  EXPECT_EQ(lookup_in_sequence(u, 1, 4, 4), (ids{4, 3}));  // only [3] occurs earlier
  EXPECT_TRUE(lookup_in_sequence(u, 2, 4, 4).empty());
}

TEST(ngram_match, cuts_the_continuation_at_the_end_and_is_empty_without_a_match) {
  const ids t{7, 8, 9, 7, 8};
  EXPECT_EQ(lookup_in_sequence(t, 2, 2, 5), (ids{9, 7, 8}));  // runs into the suffix, ends with t
  EXPECT_EQ(lookup_in_sequence(t, 2, 2, 1), (ids{9}));
  EXPECT_TRUE(lookup_in_sequence(ids{1, 2, 3, 4}, 1, 3, 4).empty());
  EXPECT_TRUE(lookup_in_sequence(t, 2, 2, 0).empty());
  EXPECT_TRUE(lookup_in_sequence(ids{7}, 1, 1, 2).empty());  // nothing earlier than the last token
  EXPECT_EQ(lookup_in_sequence(ids{4, 4, 4}, 1, 4, 3), (ids{4}));  // [4 4] at 0 beats [4]; one token follows
}

TEST(ngram_index, finds_the_latest_occurrence_of_every_length) {
  const engine::ngram_index index(ids{10, 11, 12, 13, 10, 11, 14}, 1, 3);
  auto as_ids = [](std::span<const std::int32_t> s) { return ids(s.begin(), s.end()); };
  EXPECT_EQ(as_ids(index.continuation(ids{10, 11}, 2)), (ids{14}));  // latest, cut at the end
  EXPECT_EQ(as_ids(index.continuation(ids{11, 12}, 2)), (ids{13, 10}));
  EXPECT_EQ(as_ids(index.continuation(ids{10, 11, 12}, 9)), (ids{13, 10, 11, 14}));
  EXPECT_EQ(as_ids(index.continuation(ids{10}, 1)), (ids{11}));
  EXPECT_TRUE(index.continuation(ids{99}, 2).empty());
  EXPECT_TRUE(index.continuation(ids{14}, 2).empty());              // nothing after it
  EXPECT_TRUE(index.continuation(ids{12, 13, 10, 11}, 2).empty());  // longer than max_n
  EXPECT_TRUE(index.continuation(ids{11, 12}, 0).empty());
}

// A common n-gram's latest occurrence may be followed by a rare token: the index keeps the latest
// occurrence among those followed by the most frequent next token (ties: the latest, as above).
TEST(ngram_index, prefers_the_most_frequent_next_token) {
  const engine::ngram_index index(ids{10, 11, 12, 7, 10, 11, 12, 8, 10, 11, 14, 9}, 2, 2);
  auto as_ids = [](std::span<const std::int32_t> s) { return ids(s.begin(), s.end()); };
  EXPECT_EQ(as_ids(index.continuation(ids{10, 11}, 2)), (ids{12, 8}));  // 12 twice, 14 once
  EXPECT_EQ(as_ids(index.continuation(ids{11, 12}, 1)), (ids{8}));      // 7 and 8 once each: the latest
}

TEST(ngram_proposer, bad_options_and_corpora_are_errors) {
  EXPECT_FALSE(engine::ngram_proposer::create({0, 3}, {}).ok());
  EXPECT_FALSE(engine::ngram_proposer::create({1, 65}, {}).ok());
  auto swapped = engine::ngram_proposer::create({4, 2}, {});
  ASSERT_FALSE(swapped.ok());
  EXPECT_NE(swapped.err().message.find("min n (4) is above max n (2)"), std::string::npos) << swapped.err().message;
  EXPECT_FALSE(engine::ngram_proposer::create({1, 2}, ids{1, -3}).ok());
  auto p = engine::ngram_proposer::create({1, 2}, ids{3, 14});
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE((*p)->check_vocabulary(14).ok());
  EXPECT_TRUE((*p)->check_vocabulary(15).ok());
}

TEST(ngram_proposer, the_longer_match_wins_the_sequence_at_equal_length) {
  auto p = engine::ngram_proposer::create({1, 4}, ids{6, 1, 2, 3, 50, 51, 9, 3, 60});
  ASSERT_TRUE(p.ok());
  auto ask = [&](const ids& history, int k) {
    return (*p)->propose({engine::draft_query{1, history, {}, k}})[0].tokens;
  };
  EXPECT_EQ(ask(ids{8, 3, 70, 1, 2, 3}, 2), (ids{50, 51}));  // corpus [1 2 3] beats the sequence's [3]
  EXPECT_EQ(ask(ids{8, 3, 70, 8, 3}, 2), (ids{70, 8}));      // [8 3] in the sequence beats the corpus's [3]
  EXPECT_EQ(ask(ids{5, 3, 71, 9, 3}, 1), (ids{60}));         // [9 3] only in the corpus
  EXPECT_EQ(ask(ids{4, 3, 72, 5, 3}, 1), (ids{72}));         // [3] in both: the sequence's
  EXPECT_TRUE(ask(ids{40, 41}, 3).empty());
  EXPECT_GT((*p)->counters().seconds, 0.0);
  EXPECT_EQ((*p)->counters().steps, 0);
}

TEST(ngram_proposer, reads_token_id_files_and_names_what_is_wrong) {
  const std::string path = ::testing::TempDir() + "ngram_ids.txt";
  {
    std::ofstream(path) << "1 2,3\n 40\t5\n";
  }
  auto good = engine::read_token_ids(path);
  ASSERT_TRUE(good.ok()) << good.err().message;
  EXPECT_EQ(*good, (ids{1, 2, 3, 40, 5}));
  {
    std::ofstream(path) << "1 2 x3\n";
  }
  auto bad = engine::read_token_ids(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.err().message.find("byte 4 ('x')"), std::string::npos) << bad.err().message;
  EXPECT_FALSE(engine::read_token_ids(path + ".missing").ok());
  EXPECT_FALSE(engine::make_ngram_proposer({2, 4}, path).ok());
  std::remove(path.c_str());
}

class ngram_golden : public ::testing::TestWithParam<std::string> {};

// Greedy speculative decoding with n-gram proposals emits exactly the target's tokens. The corpus
// is every prompt's text and greedy output with every fourth output token changed, so proposals
// are made often, and some are kept while others are rejected (both paths run).
TEST_P(ngram_golden, greedy_output_equals_plain_decoding) {
  const auto golden = testing::load_golden(GetParam());
  auto backend = kernels::make_cpu_backend({});
  auto cfg = engine::load_model_config(golden.dir);
  ASSERT_TRUE(cfg.ok());
  ids corpus;
  std::vector<engine::generation_request> all;
  for (const auto& p : golden.prompts) {
    corpus.insert(corpus.end(), p.input_ids.begin(), p.input_ids.end());
    for (std::size_t i = 0; i < p.greedy.size(); ++i) {
      corpus.push_back(i % 4 == 3 ? (p.greedy[i] + 1) % cfg->vocab_size : p.greedy[i]);
    }
    engine::generation_request r;
    r.prompt = p.input_ids;
    r.max_new_tokens = static_cast<int>(p.greedy.size());
    r.stop_at_eos = false;
    all.push_back(r);
  }
  engine::executor_options o;
  o.kv_block_size = 16;
  o.kv_blocks = 128;
  o.max_step_tokens = 512;
  o.max_seqs = 16;
  for (int stages : {1, 2}) {
    for (int k : {1, 4}) {
      auto target = engine::local_pipeline::create(*backend, golden.dir, stages, o);
      ASSERT_TRUE(target.ok()) << target.err().message;
      auto proposer = engine::ngram_proposer::create({1, 3}, corpus);
      ASSERT_TRUE(proposer.ok());
      auto spec = engine::speculative_decoder::create(**target, **proposer, {k});
      ASSERT_TRUE(spec.ok()) << spec.err().message;
      std::int64_t proposed = 0, accepted = 0;
      for (std::size_t i = 0; i < all.size(); ++i) {  // each prompt alone, then all at once
        auto res = (*spec)->generate({all[i]});
        ASSERT_TRUE(res.ok()) << res.err().message;
        EXPECT_EQ((*res)[0].tokens, golden.prompts[i].greedy) << "stages " << stages << " k " << k << " prompt " << i;
        proposed += (*spec)->stats().proposed;
        accepted += (*spec)->stats().accepted;
      }
      auto batched = (*spec)->generate(all);
      ASSERT_TRUE(batched.ok()) << batched.err().message;
      for (std::size_t i = 0; i < all.size(); ++i) EXPECT_EQ((*batched)[i].tokens, golden.prompts[i].greedy);
      EXPECT_GT(accepted, 0) << "k " << k;
      EXPECT_LT(accepted, proposed) << "k " << k;
      EXPECT_EQ((*spec)->stats().draft_steps, 0);
    }
  }
}

// Seeded sampling with exact-match verification gives plain decoding's tokens for that seed; with
// rejection sampling (one-hot draft distributions) it runs and stays within the vocabulary.
TEST_P(ngram_golden, sampled_requests) {
  const auto golden = testing::load_golden(GetParam());
  auto backend = kernels::make_cpu_backend({});
  engine::executor_options o;
  o.kv_block_size = 16;
  o.kv_blocks = 64;
  o.max_step_tokens = 256;
  o.max_seqs = 4;
  auto target = engine::local_pipeline::create(*backend, golden.dir, 1, o);
  ASSERT_TRUE(target.ok());
  engine::generation_request r;
  r.prompt = golden.prompts.back().input_ids;
  r.max_new_tokens = 24;
  r.stop_at_eos = false;
  r.sampling.temperature = 0.8f;
  r.sampling.top_k = 20;
  r.sampling.seed = 7;
  auto plain = (*target)->generate({r});
  ASSERT_TRUE(plain.ok());
  // The plain sample itself as the corpus: exact matching keeps much of it.
  ids corpus = r.prompt;
  corpus.insert(corpus.end(), (*plain)[0].tokens.begin(), (*plain)[0].tokens.end());
  auto proposer = engine::ngram_proposer::create({1, 4}, corpus);
  ASSERT_TRUE(proposer.ok());
  engine::speculative_options so;
  so.k = 3;
  so.rejection_sampling = false;
  auto exact = engine::speculative_decoder::create(**target, **proposer, so);
  ASSERT_TRUE(exact.ok());
  auto res = (*exact)->generate({r});
  ASSERT_TRUE(res.ok());
  EXPECT_EQ((*res)[0].tokens, (*plain)[0].tokens);
  EXPECT_GT((*exact)->stats().accepted, 0);
  so.rejection_sampling = true;
  auto rejection = engine::speculative_decoder::create(**target, **proposer, so);
  ASSERT_TRUE(rejection.ok());
  auto sampled = (*rejection)->generate({r});
  ASSERT_TRUE(sampled.ok()) << sampled.err().message;
  ASSERT_EQ((*sampled)[0].tokens.size(), 24u);
  for (auto t : (*sampled)[0].tokens) EXPECT_TRUE(t >= 0 && t < (*target)->config().vocab_size);
  EXPECT_GT((*rejection)->stats().proposed, 0);
}

INSTANTIATE_TEST_SUITE_P(fixtures, ngram_golden, ::testing::ValuesIn(testing::fixture_names()));

}  // namespace
}  // namespace conveyor
