// A stage's activations through the staging path (executor run_raw -> reused staging buffer ->
// wire dtype -> run_raw on the next stage) give bit-identical logits to the float32 path
// (run -> std::vector<float> -> run), on the CPU backend (CI) and on the CUDA backend in bf16 (GPU
// machine: pinned buffers, bf16 on the wire, half the bytes), where the test is labelled gpu and
// skips without a device.
#include <gtest/gtest.h>

#include <cstring>

#include "conveyor/engine/checkpoint.hpp"
#include "conveyor/engine/executor.hpp"
#include "conveyor/engine/model_config.hpp"
#include "conveyor/engine/stage.hpp"
#include "conveyor/kernels/cpu_backend.hpp"
#include "conveyor/transport/staging_pool.hpp"
#include "../engine/golden.hpp"
#if CONVEYOR_TEST_CUDA
#include "conveyor/kernels/cuda_backend.hpp"
#endif

namespace conveyor {
namespace {

using kernels::dtype;

result<std::unique_ptr<kernels::backend>> make_backend(const std::string& kind) {
  if (kind == "cpu") return kernels::make_cpu_backend({1});
#if CONVEYOR_TEST_CUDA
  return kernels::make_cuda_backend({});  // bf16 activations
#else
  return make_error(errc::unsupported, "built without CUDA");
#endif
}

class staged_activations : public ::testing::TestWithParam<std::string> {};

TEST_P(staged_activations, give_the_same_logits_as_the_f32_path) {
  std::vector<std::unique_ptr<kernels::backend>> backends;
  for (int s = 0; s < 2; ++s) {
    auto b = make_backend(GetParam());
    if (!b) GTEST_SKIP() << "no " << GetParam() << " backend here: " << b.err().message;
    backends.push_back(std::move(*b));
  }
  const bool device = !backends[0]->caps().host_memory;
  const dtype act = backends[0]->caps().act_dtype;
  const auto golden = testing::load_golden("tiny-llama");
  auto cfg = engine::load_model_config(golden.dir);
  auto ckpt = engine::checkpoint::open(golden.dir);
  ASSERT_TRUE(cfg && ckpt);
  auto ranges = engine::split_even(*cfg, 2);
  ASSERT_TRUE(ranges.ok());
  engine::executor_options o;
  o.kv_blocks = 64;
  std::vector<std::unique_ptr<engine::stage_executor>> ex;
  for (int s = 0; s < 2; ++s) {
    auto e = engine::stage_executor::create(*backends[s], *ckpt, *cfg, (*ranges)[s], o);
    ASSERT_TRUE(e.ok()) << e.err().message;
    ex.push_back(std::move(*e));
  }
  transport::staging_pool pool(4, device);
  const auto& p = golden.prompts[0];
  engine::step_plan plan;
  engine::sequence_step s;
  s.seq_id = 1;
  s.tokens = p.input_ids;
  for (int b = 0; b * o.kv_block_size < static_cast<int>(p.input_ids.size()); ++b) s.block_table.push_back(b);
  s.logits = engine::logits_mode::all;
  s.sample = false;
  plan.seqs.push_back(s);
  const std::size_t values = p.input_ids.size() * static_cast<std::size_t>(cfg->hidden_size);

  // The float32 path the stage runtime used before.
  auto a = ex[0]->run(plan, {});
  ASSERT_TRUE(a.ok()) << a.err().message;
  auto f32 = ex[1]->run(plan, a->hidden);
  ASSERT_TRUE(f32.ok()) << f32.err().message;

  // The staging path: raw activations into a reused buffer, sent in the stage's dtype.
  for (int frame = 0; frame < 3; ++frame) {
    auto buf = pool.acquire(values * kernels::dtype_size(act));
    ASSERT_TRUE(buf.ok());
    if (device) EXPECT_TRUE(buf->pinned()) << "a GPU stage stages through page-locked memory";
    ASSERT_TRUE(ex[0]->run_raw(plan, nullptr, buf->data()).ok());
    auto raw = ex[1]->run_raw(plan, buf->data(), nullptr);
    ASSERT_TRUE(raw.ok()) << raw.err().message;
    ASSERT_EQ(raw->logits.size(), f32->logits.size());
    EXPECT_EQ(0, std::memcmp(raw->logits.data(), f32->logits.data(), f32->logits.size() * 4)) << "frame " << frame;
    // A receiver that computes in f32 gets the wire's values converted, and converting back is exact.
    std::vector<float> widened(values);
    ASSERT_TRUE(transport::convert_activations(buf->data(), act, widened.data(), dtype::f32, values).ok());
    auto back = pool.acquire(values * kernels::dtype_size(act));
    ASSERT_TRUE(transport::convert_activations(widened.data(), dtype::f32, back->data(), act, values).ok());
    EXPECT_EQ(0, std::memcmp(back->data(), buf->data(), values * kernels::dtype_size(act)));
    EXPECT_EQ(0, std::memcmp(widened.data(), a->hidden.data(), values * 4)) << "read_f32 and the wire agree";
  }
  EXPECT_LE(pool.allocations(), 2u) << "frames reuse their staging buffers";
  if (act == dtype::bf16) std::printf("[staging] bf16 wire: %zu bytes per frame instead of %zu\n", values * 2, values * 4);
}

INSTANTIATE_TEST_SUITE_P(backends, staged_activations, ::testing::Values("cpu", "cuda"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace conveyor
