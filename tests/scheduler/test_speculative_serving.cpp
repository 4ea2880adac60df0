// Speculative decoding in the serving scheduler: draft tokens ride in decode steps, the scheduler
// keeps the prefix the target agrees with and rolls back the rest, and results never change.
#include <gtest/gtest.h>

#include <future>

#include "conveyor/engine/draft_proposer.hpp"
#include "conveyor/engine/ngram_proposer.hpp"
#include "conveyor/engine/speculative_sampling.hpp"
#include "conveyor/service/local_inference_service.hpp"
#include "scheduler_fixture.hpp"

namespace conveyor::scheduler {
namespace {

using testing::collecting_sink;

class speculative_serving : public testing::scheduler_test {
 protected:
  std::unique_ptr<engine::draft_proposer> make_draft(int layers, int kv_blocks = 64) {
    engine::executor_options eo;
    eo.kv_blocks = kv_blocks;
    eo.kv_block_size = 16;
    eo.max_step_tokens = 24;
    eo.max_seqs = 8;
    auto p = engine::local_pipeline::create(*backend_, golden_.dir, 1, eo, layers);
    EXPECT_TRUE(p.ok()) << p.err().message;
    return p.ok() ? std::make_unique<engine::draft_proposer>(std::move(p).value()) : nullptr;
  }

  /// Runs every microbatch's step as the coordinator does (all planned, then completed in order),
  /// handing back the flat per-row tokens the last stage sends.
  void drain_spec(batch_scheduler& s) {
    for (int guard = 0; s.has_work() && guard < 10000; ++guard) {
      std::vector<std::pair<int, engine::step_plan>> plans;
      for (int m = 0; m < s.chunks(); ++m) {
        if (auto plan = s.next_step(m)) plans.emplace_back(m, std::move(*plan));
      }
      if (plans.empty()) break;
      for (auto& [m, plan] : plans) {
        auto out = pipe_->step(plan);
        ASSERT_TRUE(out.ok()) << out.err().message;
        s.complete(m, engine::flat_sampled_tokens(plan, *out));
      }
    }
    EXPECT_FALSE(s.has_work()) << "the scheduler did not drain";
  }

  /// Every prompt twice, greedy and seeded; returns what the sinks got.
  std::vector<std::vector<std::int32_t>> serve(batch_scheduler& s) {
    std::vector<std::shared_ptr<collecting_sink>> sinks;
    for (int rep = 0; rep < 2; ++rep) {
      for (std::size_t p = 0; p < golden_.prompts.size(); ++p) {
        auto r = greedy(p);
        if (rep == 1) {
          r.sampling.temperature = 0.8f;
          r.sampling.top_k = 20;
          r.sampling.seed = 11 + p;
        }
        sinks.push_back(std::make_shared<collecting_sink>());
        EXPECT_TRUE(s.add(r, sinks.back()).ok());
      }
    }
    drain_spec(s);
    std::vector<std::vector<std::int32_t>> got;
    for (auto& sink : sinks) {
      EXPECT_TRUE(sink->ok());
      got.push_back(sink->tokens);
    }
    return got;
  }
};

TEST_F(speculative_serving, tokens_equal_plain_serving_and_blocks_are_returned) {
  batch_scheduler plain(opts_);
  const auto expected = serve(plain);
  for (std::size_t p = 0; p < golden_.prompts.size(); ++p) EXPECT_EQ(expected[p], golden_.prompts[p].greedy);
  for (int layers : {1, 4}) {
    auto draft = make_draft(layers);
    ASSERT_TRUE(draft);
    scheduler_options o = opts_;
    o.draft = draft.get();
    o.spec_k = 3;
    batch_scheduler s(o);
    EXPECT_EQ(serve(s), expected) << "draft layers " << layers;
    // Again on the same scheduler: the prompts now hit blocks published during the first round
    // (prefix cache), drafts and rollbacks on top of shared blocks.
    const auto hits = s.counters().prefix.hit_blocks;
    EXPECT_EQ(serve(s), expected) << "draft layers " << layers << ", second round";
    EXPECT_GT(s.counters().prefix.hit_blocks, hits);
    EXPECT_EQ(s.blocks().free_blocks(), opts_.kv_blocks) << "blocks leaked";
    const auto c = s.counters();
    EXPECT_GT(c.spec_steps, 0);
    EXPECT_GT(c.spec_proposed, 0);
    EXPECT_LE(c.spec_accepted, c.spec_proposed);
    EXPECT_EQ(c.spec_emitted, c.spec_accepted + c.spec_steps);
    EXPECT_EQ(c.tokens_generated, 2 * 2 * 24 * static_cast<std::int64_t>(golden_.prompts.size()));
    if (layers == 4) {
      // The draft is the model itself: every greedy draft is kept (sampled ones too: the draft draws
      // with the request's own random numbers).
      EXPECT_EQ(c.spec_accepted, c.spec_proposed);
    } else {
      EXPECT_LT(c.spec_accepted, c.spec_proposed);
    }
    service::stats_report r;
    s.report(r);
    EXPECT_EQ(r.spec_draft_tokens, c.spec_proposed);
    EXPECT_EQ(r.spec_accepted_tokens, c.spec_accepted);
  }
}

// The n-gram proposer in the scheduler: it reads each sequence's tokens while the step is planned.
// Its corpus is every prompt and its greedy output with every third token changed, so proposals are
// kept and rejected; the results are plain serving's, and no block leaks.
TEST_F(speculative_serving, ngram_proposer_tokens_equal_plain_serving) {
  batch_scheduler plain(opts_);
  const auto expected = serve(plain);
  std::vector<std::int32_t> corpus;
  for (const auto& p : golden_.prompts) {
    corpus.insert(corpus.end(), p.input_ids.begin(), p.input_ids.end());
    for (std::size_t i = 0; i < p.greedy.size(); ++i) {
      corpus.push_back(i % 3 == 2 ? (p.greedy[i] + 1) % pipe_->config().vocab_size : p.greedy[i]);
    }
  }
  auto ngram = engine::ngram_proposer::create({1, 3}, corpus);
  ASSERT_TRUE(ngram.ok());
  scheduler_options o = opts_;
  o.draft = ngram->get();
  o.spec_k = 3;
  batch_scheduler s(o);
  EXPECT_EQ(serve(s), expected);
  EXPECT_EQ(s.blocks().free_blocks(), opts_.kv_blocks) << "blocks leaked";
  const auto c = s.counters();
  EXPECT_GT(c.spec_accepted, 0);
  EXPECT_LT(c.spec_accepted, c.spec_proposed);
  EXPECT_EQ(c.spec_emitted, c.spec_accepted + c.spec_steps);
}

// Drafts only take free blocks; under KV pressure (preemption, re-prefill) results stay the same.
TEST_F(speculative_serving, kv_pressure_keeps_results) {
  opts_.kv_blocks = 9;
  batch_scheduler plain(opts_);
  const auto expected = serve(plain);
  auto draft = make_draft(2, 16);  // a small draft KV too: it forgets and re-prefills when full
  ASSERT_TRUE(draft);
  scheduler_options o = opts_;
  o.draft = draft.get();
  o.spec_k = 4;
  batch_scheduler s(o);
  EXPECT_EQ(serve(s), expected);
  EXPECT_EQ(s.blocks().free_blocks(), opts_.kv_blocks);
  // A draft that holds only 64 positions: longer sequences (the 100-token prompt) get no drafts,
  // the others still do.
  auto tiny = make_draft(2, 4);
  ASSERT_TRUE(tiny);
  o.draft = tiny.get();
  batch_scheduler t(o);
  EXPECT_EQ(serve(t), expected);
  EXPECT_GT(t.counters().spec_steps, 0);
  EXPECT_EQ(t.blocks().free_blocks(), opts_.kv_blocks);
}

TEST(speculative_local_service, reports_acceptance_in_stats) {
  const auto golden = conveyor::testing::load_golden("tiny-llama");
  service::local_service_options o;
  o.stages = 2;
  o.kv_blocks = 64;
  o.max_step_tokens = 64;
  o.max_seqs_per_step = 8;
  o.spec_k = 4;
  o.draft_layers = 2;
  auto svc = service::make_local_inference_service(golden.dir, o);
  ASSERT_TRUE(svc.ok()) << svc.err().message;
  auto sink = std::make_shared<collecting_sink>();
  service::generate_request r;
  r.prompt = golden.prompts[2].input_ids;
  r.max_new_tokens = 24;
  r.ignore_eos = true;
  (*svc)->submit(r, sink);
  ASSERT_TRUE(sink->wait());
  ASSERT_TRUE(sink->ok());
  EXPECT_EQ(sink->tokens, golden.prompts[2].greedy);
  std::promise<service::stats_report> got;
  (*svc)->stats([&](service::stats_report s) { got.set_value(std::move(s)); });
  const auto st = got.get_future().get();
  EXPECT_GT(st.spec_draft_tokens, 0);
  EXPECT_GT(st.spec_accepted_tokens, 0);
  EXPECT_EQ(st.tokens_generated, 24);
}

TEST(speculative_local_service, a_draft_of_another_vocabulary_is_an_error) {
  service::local_service_options o;
  o.spec_k = 4;
  o.draft_dir = conveyor::testing::fixture_dir("llama3-scaled");
  auto svc = service::make_local_inference_service(conveyor::testing::fixture_dir("tiny-llama"), o);
  ASSERT_FALSE(svc.ok());
  EXPECT_NE(svc.err().message.find("vocabulary"), std::string::npos) << svc.err().message;
}

}  // namespace
}  // namespace conveyor::scheduler
