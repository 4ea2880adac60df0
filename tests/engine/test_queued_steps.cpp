// Queued steps (stage_executor::begin / end, local_pipeline::begin_step / end_step): a host loop that
// queues decode step n+1, its token ids chained on the device to step n's draw, before it waits for
// step n, gives the same tokens as the step-by-step loop; generate() (which queues where it can)
// stops a sequence at EOS while its next step is already queued; misuse is an error value.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "conveyor/engine/local_pipeline.hpp"
#include "conveyor/kernels/cpu_backend.hpp"
#include "conveyor/transport/cpu_collective.hpp"
#include "golden.hpp"

namespace conveyor {
namespace {

using engine::local_pipeline;

class queued_steps : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    golden_ = testing::load_golden(GetParam());
    backend_ = kernels::make_cpu_backend({});
  }
  std::unique_ptr<local_pipeline> make(const std::string& dir, int stages = 1) {
    engine::executor_options o;
    o.kv_block_size = 16;
    o.kv_blocks = 64;
    o.max_step_tokens = 512;
    o.max_seqs = 16;
    auto p = local_pipeline::create(*backend_, dir, stages, o);
    EXPECT_TRUE(p.ok()) << (p.ok() ? "" : p.err().message);
    return p.ok() ? std::move(p).value() : nullptr;
  }
  /// Every prompt prefilled by step(), then `steps` decode steps of all of them together, queued one
  /// ahead and chained (queue) or one at a time; the tokens drawn, per prompt.
  std::vector<std::vector<std::int32_t>> decode_all(local_pipeline& pipe, int steps, bool queue) {
    const std::size_t n = golden_.prompts.size();
    std::vector<std::vector<std::int32_t>> got(n);
    std::vector<std::int64_t> ids(n);
    engine::step_plan prefill;
    for (std::size_t i = 0; i < n; ++i) {
      const auto& p = golden_.prompts[i];
      ids[i] = 100 + static_cast<std::int64_t>(i);
      EXPECT_TRUE(pipe.blocks().reserve(ids[i], static_cast<int>(p.input_ids.size()) + steps + 1).ok());
      engine::sequence_step s;
      s.seq_id = ids[i];
      s.tokens = p.input_ids;
      s.block_table = pipe.blocks().table(ids[i]);
      s.sample = true;
      prefill.seqs.push_back(s);
    }
    auto first = pipe.step(prefill);
    EXPECT_TRUE(first.ok()) << (first.ok() ? "" : first.err().message);
    if (!first.ok()) return got;
    for (std::size_t i = 0; i < n; ++i) got[i].push_back(first->tokens[i]);
    auto plan_at = [&](int step) {
      engine::step_plan plan;
      for (std::size_t i = 0; i < n; ++i) {
        engine::sequence_step s;
        s.seq_id = ids[i];
        s.tokens = {got[i].back()};  // stale when queued and chained: the device's draw is used
        s.start_pos = static_cast<int>(golden_.prompts[i].input_ids.size()) + step - 1;
        s.block_table = pipe.blocks().table(ids[i]);
        s.sample = true;
        plan.seqs.push_back(s);
      }
      return plan;
    };
    auto take = [&](const engine::step_output& out) {
      for (std::size_t i = 0; i < n; ++i) got[i].push_back(out.tokens[i]);
    };
    for (int step = 1; step <= steps; ++step) {
      if (!queue) {
        auto out = pipe.step(plan_at(step));
        EXPECT_TRUE(out.ok()) << (out.ok() ? "" : out.err().message);
        if (out.ok()) take(*out);
        continue;
      }
      const auto st = pipe.begin_step(plan_at(step), step > 1);
      EXPECT_TRUE(st.ok()) << (st.ok() ? "" : st.err().message);
      if (step > 1) {
        auto out = pipe.end_step();
        EXPECT_TRUE(out.ok()) << (out.ok() ? "" : out.err().message);
        if (out.ok()) take(*out);
      }
    }
    if (queue) {
      auto out = pipe.end_step();
      EXPECT_TRUE(out.ok()) << (out.ok() ? "" : out.err().message);
      if (out.ok()) take(*out);
    }
    for (auto id : ids) pipe.blocks().release(id);
    return got;
  }

  /// One stage of `tp` ranks (CPU backends, the CPU collective).
  std::unique_ptr<local_pipeline> make_tp(int tp) {
    for (int r = 0; r < tp; ++r) rank_backends_.push_back(kernels::make_cpu_backend({1}));
    std::vector<kernels::backend*> backends;
    for (auto& b : rank_backends_) backends.push_back(b.get());
    engine::executor_options o;
    o.kv_block_size = 16;
    o.kv_blocks = 64;
    o.max_step_tokens = 512;
    o.max_seqs = 16;
    auto make_group = [](int size) -> result<std::vector<std::unique_ptr<kernels::collective>>> {
      return transport::cpu_group(size, std::chrono::seconds(30)).all_ranks();
    };
    auto p = local_pipeline::create(backends, golden_.dir, 1, o, make_group);
    EXPECT_TRUE(p.ok()) << (p.ok() ? "" : p.err().message);
    return p.ok() ? std::move(p).value() : nullptr;
  }

  /// Six decode steps of every prompt, queued and chained, then one at a time: the same tokens, and
  /// HF's greedy ones (f32 on the CPU).
  void expect_chained_equal_plain_and_hf(local_pipeline& pipe) {
    ASSERT_TRUE(pipe.can_queue_steps());
    const int steps = 6;
    const auto plain = decode_all(pipe, steps, false);
    const auto queued = decode_all(pipe, steps, true);
    EXPECT_EQ(queued, plain);
    for (std::size_t i = 0; i < golden_.prompts.size(); ++i) {
      const auto& want = golden_.prompts[i].greedy;
      const std::size_t k = std::min(want.size(), plain[i].size());
      EXPECT_EQ(std::vector<std::int32_t>(plain[i].begin(), plain[i].begin() + k),
                std::vector<std::int32_t>(want.begin(), want.begin() + k))
          << "prompt " << i;
    }
  }

  testing::golden_fixture golden_;
  std::unique_ptr<kernels::backend> backend_;
  std::vector<std::unique_ptr<kernels::backend>> rank_backends_;
};

// A tensor-parallel stage queues steps too: every rank queues its part (tp_stage::begin) and chains
// its own draw, which is the same on every rank.
TEST_P(queued_steps, tensor_parallel_ranks_chain_their_own_draws) {
  auto pipe = make_tp(2);
  ASSERT_TRUE(pipe);
  expect_chained_equal_plain_and_hf(*pipe);
  EXPECT_EQ(pipe->stages()[0]->queued(), 0);
}

TEST_P(queued_steps, chained_steps_draw_what_step_by_step_draws) {
  auto pipe = make(golden_.dir);
  ASSERT_TRUE(pipe);
  expect_chained_equal_plain_and_hf(*pipe);
}

// The model's EOS made a token that prompt 0's greedy continuation draws at its third step: every
// prompt stops at its first such token (its step after that was already queued, and is dropped),
// the others run to their length, all in one generate() call.
TEST_P(queued_steps, generate_stops_at_eos_with_the_next_step_queued) {
  const auto& p0 = golden_.prompts[0];
  ASSERT_GE(p0.greedy.size(), 4u);
  const std::int32_t eos = p0.greedy[2];
  const auto dir = std::filesystem::path(::testing::TempDir()) / ("queued_eos_" + GetParam());
  std::filesystem::remove_all(dir);
  std::filesystem::copy(golden_.dir, dir, std::filesystem::copy_options::recursive);
  nlohmann::json cfg;
  {
    std::ifstream in(dir / "config.json");
    in >> cfg;
  }
  cfg["eos_token_id"] = eos;
  std::ofstream(dir / "config.json") << cfg.dump(2);
  auto pipe = make(dir.string());
  ASSERT_TRUE(pipe);
  std::vector<engine::generation_request> reqs;
  for (const auto& p : golden_.prompts) {
    engine::generation_request r;
    r.prompt = p.input_ids;
    r.max_new_tokens = static_cast<int>(p.greedy.size());
    r.stop_at_eos = true;
    reqs.push_back(r);
  }
  auto res = pipe->generate(reqs);
  ASSERT_TRUE(res.ok()) << res.err().message;
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    const auto& g = golden_.prompts[i].greedy;
    const auto at = std::find(g.begin(), g.end(), eos);
    const std::vector<std::int32_t> want(g.begin(), at == g.end() ? g.end() : at + 1);
    EXPECT_EQ((*res)[i].tokens, want) << "prompt " << i;
    EXPECT_EQ((*res)[i].finish_reason, at == g.end() ? "length" : "stop") << "prompt " << i;
  }
  EXPECT_EQ((*res)[0].tokens.size(), 3u);
  std::filesystem::remove_all(dir);
}

TEST_P(queued_steps, misuse_is_an_error_value) {
  auto pipe = make(golden_.dir);
  ASSERT_TRUE(pipe);
  auto& ex = pipe->stages()[0]->rank0();
  const auto& p = golden_.prompts[0];
  ASSERT_TRUE(pipe->blocks().reserve(7, static_cast<int>(p.input_ids.size()) + 4).ok());
  engine::step_plan plan;
  engine::sequence_step s;
  s.seq_id = 7;
  s.tokens = p.input_ids;
  s.block_table = pipe->blocks().table(7);
  s.sample = true;
  plan.seqs.push_back(s);
  EXPECT_FALSE(pipe->end_step().ok()) << "nothing queued";
  EXPECT_FALSE(pipe->begin_step(plan, true).ok()) << "chained to nothing";
  engine::step_plan with_logits = plan;
  with_logits.seqs[0].logits = engine::logits_mode::last;
  EXPECT_FALSE(pipe->begin_step(with_logits, false).ok()) << "logits cannot be read back from a queued step";
  ASSERT_TRUE(pipe->begin_step(plan, false).ok());
  engine::step_plan next = plan;
  next.seqs[0].tokens = {p.input_ids[0]};
  next.seqs[0].start_pos = static_cast<int>(p.input_ids.size());
  engine::step_plan other = next;
  other.seqs[0].seq_id = 8;
  EXPECT_FALSE(pipe->begin_step(other, true).ok()) << "chained to another sequence";
  engine::step_plan two = next;  // two tokens: only one a sequence can be chained
  two.seqs[0].tokens = {p.input_ids[0], p.input_ids[0]};
  EXPECT_FALSE(pipe->begin_step(two, true).ok()) << "chained with two tokens";
  EXPECT_FALSE(pipe->step(next).ok()) << "run() while a step is queued";
  ASSERT_TRUE(pipe->begin_step(next, true).ok());
  next.seqs[0].start_pos += 1;
  EXPECT_FALSE(pipe->begin_step(next, true).ok()) << "a third queued step";
  EXPECT_EQ(ex.queued(), 2);
  EXPECT_TRUE(pipe->end_step().ok());
  EXPECT_TRUE(pipe->end_step().ok());
  EXPECT_EQ(ex.queued(), 0);
  auto two_stages = make(golden_.dir, 2);
  ASSERT_TRUE(two_stages);
  EXPECT_FALSE(two_stages->can_queue_steps());
  EXPECT_FALSE(two_stages->begin_step(plan, false).ok()) << "two stages";
  pipe->blocks().release(7);
}

INSTANTIATE_TEST_SUITE_P(fixtures, queued_steps, ::testing::Values("tiny-llama", "tiny-qwen2"),
                         [](const auto& info) { return testing::test_name(info.param); });

}  // namespace
}  // namespace conveyor
