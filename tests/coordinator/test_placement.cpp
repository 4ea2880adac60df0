// Placement: TorchServe's GPU assignment (its documented examples), hosts, layers, the memory
// estimate and the dry-run report. Plain code: no processes, no actors.
#include <gtest/gtest.h>

#include <filesystem>

#include "config_test_util.hpp"
#include "conveyor/engine/model_config.hpp"
#include "conveyor/placement/memory_estimate.hpp"
#include "conveyor/placement/placement.hpp"
#include "conveyor/placement/plan_report.hpp"

namespace conveyor::placement {
namespace {

using config::testing::contains;
using config::testing::parse_ok;

/// A model shape for placing, without a checkpoint.
engine::model_config shape(int layers, int heads = 64, int kv_heads = 8) {
  engine::model_config c;
  c.model_type = "llama";
  c.num_layers = layers;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.hidden_size = 128 * heads;
  c.head_dim = 128;
  c.intermediate_size = 4 * c.hidden_size;
  c.vocab_size = 1000;
  c.max_position_embeddings = 8192;
  return c;
}

std::vector<std::string> worker_devices(const placement_plan& p) {
  std::vector<std::string> out;
  for (const auto& w : p.workers) out.push_back(visible_devices(w.gpus));
  return out;
}

placement_plan place_ok(const config::deployment& d, const engine::model_config& m) {
  auto p = place(d, m);
  EXPECT_TRUE(p.ok()) << (p.ok() ? "" : p.err().message);
  return p.ok() ? std::move(p).value() : placement_plan{};
}

std::string place_error(const config::deployment& d, const engine::model_config& m) {
  auto p = place(d, m);
  return p.ok() ? std::string() : p.err().message;
}

// ---- TorchServe's documented examples ----

TEST(placement_torchserve, eight_gpus_four_per_worker) {
  EXPECT_EQ(round_robin({0, 1, 2, 3, 4, 5, 6, 7}, 4, 2), (std::vector<std::vector<int>>{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  // The same through a deployment: two 4-GPU workers on one 8-GPU host, one TP-4 stage each.
  const auto d = parse_ok(R"(
[model]
device = "cuda"
[parallel]
stages = 2
tp = 4
[placement]
nproc_per_node = 4
[[placement.hosts]]
address = "127.0.0.1"
gpus = 8
)");
  const auto p = place_ok(d, shape(8));
  EXPECT_EQ(worker_devices(p), (std::vector<std::string>{"0,1,2,3", "4,5,6,7"}));
  EXPECT_EQ(visible_devices(p.stages[0].gpus), "0,1,2,3");
  EXPECT_EQ(visible_devices(p.stages[1].gpus), "4,5,6,7");
}

TEST(placement_torchserve, device_ids_two_per_worker) {
  EXPECT_EQ(round_robin({2, 3, 4, 5}, 2, 2), (std::vector<std::vector<int>>{{2, 3}, {4, 5}}));
  const auto d = parse_ok(R"(
[model]
device = "cuda"
[parallel]
type = "pptp"
stages = 2
tp = 2
[placement]
parallel_level = 2
device_ids = [2, 3, 4, 5]
[[placement.hosts]]
address = "127.0.0.1"
gpus = 8
)");
  const auto p = place_ok(d, shape(8));
  EXPECT_EQ(worker_devices(p), (std::vector<std::string>{"2,3", "4,5"}));
}

TEST(placement_torchserve, round_robin_wraps_when_ids_run_out) {
  // TorchServe's counter wraps modulo the usable GPUs; workers then share them.
  EXPECT_EQ(round_robin({0, 1}, 1, 3), (std::vector<std::vector<int>>{{0}, {1}, {0}}));
  // One GPU named, its count unknown (configs/one-gpu.toml with two stages): both stages on GPU 0.
  const auto d = parse_ok("[model]\ndevice = \"cuda\"\n[parallel]\nstages = 2\n[placement]\ndevice_ids = [0]\n");
  const auto p = place_ok(d, shape(8));
  EXPECT_EQ(worker_devices(p), (std::vector<std::string>{"0", "0"}));
  ASSERT_EQ(p.notes.size(), 1u);
  EXPECT_TRUE(contains(p.notes[0], "share GPUs")) << p.notes[0];
}

TEST(placement_torchserve, a_worker_of_several_stages_gets_their_gpus_in_one_block) {
  // parallel_level 4 with tp 1: each worker (CUDA_VISIBLE_DEVICES of 4 GPUs) holds 4 pipeline stages.
  const auto d = parse_ok(R"(
[model]
device = "cuda"
[parallel]
stages = 8
[placement]
parallel_level = 4
[[placement.hosts]]
address = "127.0.0.1"
gpus = 8
)");
  const auto p = place_ok(d, shape(16));
  EXPECT_EQ(worker_devices(p), (std::vector<std::string>{"0,1,2,3", "4,5,6,7"}));
  ASSERT_EQ(p.stages.size(), 8u);
  for (int k = 0; k < 8; ++k) {
    EXPECT_EQ(p.stages[k].worker, k / 4);
    EXPECT_EQ(p.stages[k].gpus, std::vector<int>{k});
  }
}

// ---- hosts and layers ----

TEST(placement_hosts, the_two_host_example_keeps_tp_groups_on_one_host) {
  auto d = config::load_deployment(std::string(CONVEYOR_CONFIGS_DIR) + "/two-hosts-8-gpus.toml");
  ASSERT_TRUE(d.ok()) << d.err().message;
  const auto p = place_ok(*d, shape(80));  // Llama 3 70B: 80 layers, 64 heads, 8 KV heads
  ASSERT_EQ(p.stages.size(), 4u);
  const std::vector<std::pair<std::string, std::string>> want{
      {"node-a", "0,1,2,3"}, {"node-a", "4,5,6,7"}, {"node-b", "0,1,2,3"}, {"node-b", "4,5,6,7"}};
  for (int k = 0; k < 4; ++k) {
    EXPECT_EQ(p.hosts[p.stages[k].host].name, want[k].first) << "stage " << k;
    EXPECT_EQ(visible_devices(p.stages[k].gpus), want[k].second) << "stage " << k;
    EXPECT_EQ(p.stages[k].first_layer, 20 * k);
    EXPECT_EQ(p.stages[k].last_layer, 20 * k + 20);
  }
}

TEST(placement_hosts, cpu_stages_spread_evenly_in_contiguous_blocks) {
  const auto d = parse_ok(R"(
[parallel]
stages = 5
[cluster]
listen = "10.0.0.1:0"
[launch]
method = "ssh"
[[placement.hosts]]
name = "a"
address = "10.0.0.1"
[[placement.hosts]]
name = "b"
address = "10.0.0.2"
)");
  const auto p = place_ok(d, shape(10));
  std::vector<int> hosts;
  for (const auto& s : p.stages) hosts.push_back(s.host);
  EXPECT_EQ(hosts, (std::vector<int>{0, 0, 0, 1, 1}));
  for (const auto& s : p.stages) EXPECT_TRUE(s.gpus.empty());
}

TEST(placement_hosts, a_full_host_spills_to_the_next) {
  const auto d = parse_ok(R"(
[model]
device = "cuda"
[parallel]
stages = 3
[cluster]
listen = "10.0.0.1:0"
[launch]
method = "ssh"
[[placement.hosts]]
name = "small"
address = "10.0.0.1"
gpus = 1
[[placement.hosts]]
name = "big"
address = "10.0.0.2"
gpus = 4
)");
  const auto p = place_ok(d, shape(6));
  EXPECT_EQ(p.stages[0].host, 0);
  EXPECT_EQ(p.stages[1].host, 1);
  EXPECT_EQ(p.stages[2].host, 1);
  EXPECT_EQ(worker_devices(p), (std::vector<std::string>{"0", "0", "1"}));
}

TEST(placement_hosts, an_idle_host_and_assumed_gpus_are_noted) {
  const auto d = parse_ok(R"(
[model]
device = "cuda"
[cluster]
listen = "10.0.0.1:0"
[launch]
method = "ssh"
[[placement.hosts]]
name = "a"
address = "10.0.0.1"
[[placement.hosts]]
name = "b"
address = "10.0.0.2"
)");
  const auto p = place_ok(d, shape(4));
  ASSERT_EQ(p.notes.size(), 2u);
  EXPECT_TRUE(contains(p.notes[0], "GPUs 0..0 are assumed")) << p.notes[0];
  EXPECT_TRUE(contains(p.notes[1], "host b (10.0.0.2) runs no stage")) << p.notes[1];
}

TEST(placement_hosts, an_explicit_layer_split_is_kept) {
  const auto d = parse_ok("[parallel]\nstages = 3\nlayers = [1, 5, 2]\n");
  const auto p = place_ok(d, shape(8));
  EXPECT_EQ(p.stages[0].last_layer, 1);
  EXPECT_EQ(p.stages[1].first_layer, 1);
  EXPECT_EQ(p.stages[1].last_layer, 6);
  EXPECT_EQ(p.stages[2].last_layer, 8);
}

// ---- errors ----

TEST(placement_errors, stages_that_do_not_fill_a_worker) {
  const auto d = parse_ok(R"(
[model]
device = "cuda"
[parallel]
stages = 3
tp = 2
[placement]
parallel_level = 4
[[placement.hosts]]
address = "127.0.0.1"
gpus = 8
)");
  const auto e = place_error(d, shape(8));
  EXPECT_TRUE(contains(e, "deploy.toml:5:10: parallel.stages = 3 does not fill workers of placement.parallel_level = 4"))
      << e;
  EXPECT_TRUE(contains(e, "make stages a multiple of 2")) << e;
}

TEST(placement_errors, a_worker_never_spans_hosts) {
  // 12 GPUs in all, but each host fits one 4-GPU worker: three TP-4 stages cannot be placed.
  const auto d = parse_ok(R"(
[model]
device = "cuda"
[parallel]
stages = 3
tp = 4
[cluster]
listen = "10.0.0.1:0"
[launch]
method = "ssh"
[[placement.hosts]]
name = "a"
address = "10.0.0.1"
gpus = 6
[[placement.hosts]]
name = "b"
address = "10.0.0.2"
gpus = 6
)");
  const auto e = place_error(d, shape(8));
  EXPECT_TRUE(contains(e, "needs 3 workers of 4 GPUs")) << e;
  EXPECT_TRUE(contains(e, "a fits 1 (6 usable GPUs), b fits 1 (6 usable GPUs)")) << e;
}

TEST(placement_errors, the_model_shape_is_checked) {
  EXPECT_TRUE(contains(place_error(parse_ok("[parallel]\nstages = 9\n"), shape(8)), "parallel.stages = 9: the model has 8 layers"));
  EXPECT_TRUE(contains(place_error(parse_ok("[parallel]\ntp = 3\n"), shape(8)), "parallel.tp = 3: must divide"));
  EXPECT_TRUE(contains(place_error(parse_ok("[parallel]\nstages = 2\nlayers = [3, 3]\n"), shape(8)), "adds up to 6 layers"));
}

TEST(placement_errors, contradictions_are_config_errors_naming_both_keys) {
  const auto e = config::testing::parse_error_of("[placement]\nnproc_per_node = 2\nparallel_level = 2\n");
  EXPECT_TRUE(contains(e, "placement.nproc_per_node = 2")) << e;
  EXPECT_TRUE(contains(e, "placement.parallel_level = 2")) << e;
  EXPECT_TRUE(contains(e, "are both set")) << e;
}

// ---- memory ----

std::string tiny() { return std::string(CONVEYOR_FIXTURES_DIR) + "/tiny-llama"; }

TEST(placement_memory, weights_come_from_the_checkpoint_tensors) {
  auto model = engine::load_model_config(tiny());
  ASSERT_TRUE(model.ok()) << model.err().message;
  auto tensors = read_tensor_shapes(tiny());
  ASSERT_TRUE(tensors.ok()) << tensors.err().message;
  auto d = parse_ok("[parallel]\nstages = 2\n[serving]\nkv_blocks = 8\nkv_block_size = 16\n");
  d.model.dir = tiny();
  const auto p = place_ok(d, *model);
  const auto m = estimate_memory(p, d, *model, *tensors);
  // tiny-llama (f32): hidden 128, ffn 352, 4 heads / 2 KV heads of 32, vocab 1024, untied.
  const std::uint64_t layer = 4 * (128 * 128 + 2 * 64 * 128 + 128 * 128 + 3 * 352 * 128 + 2 * 128);
  const std::uint64_t table = 4 * 1024 * 128;
  ASSERT_EQ(m.stages.size(), 2u);
  EXPECT_EQ(m.stages[0].weight_bytes, table + 2 * layer);
  EXPECT_EQ(m.stages[1].weight_bytes, 2 * layer + 4 * 128 + table);
  // K and V of 2 layers × 128 slots × 2 KV heads × 32 dims × 4 bytes.
  EXPECT_EQ(m.kv_tokens, 128);
  EXPECT_EQ(m.stages[0].kv_bytes, 2ull * 2 * 128 * 2 * 32 * 4);
  ASSERT_EQ(m.devices.size(), 2u);  // one process per stage on the CPU
  EXPECT_EQ(m.devices[1].total(), m.stages[1].weight_bytes + m.stages[1].kv_bytes);
}

TEST(placement_memory, tensor_parallel_ranks_hold_slices_and_bf16_halves_matrices) {
  auto model = engine::load_model_config(tiny());
  auto tensors = read_tensor_shapes(tiny());
  ASSERT_TRUE(model.ok() && tensors.ok());
  auto d = parse_ok("[model]\ndevice = \"cuda\"\n[parallel]\ntp = 2\n[serving]\nkv_blocks = 8\n");
  const auto p = place_ok(d, *model);
  const auto m = estimate_memory(p, d, *model, *tensors);
  // Each rank: half of every projection (bf16), both norms (f32), embedding and head whole (bf16).
  const std::uint64_t layer = 2 * (128 * 128 + 2 * 64 * 128 + 128 * 128 + 3 * 352 * 128) / 2 + 4 * 2 * 128;
  EXPECT_EQ(m.stages[0].weight_bytes, 4 * layer + 2 * 2 * 1024 * 128 + 4 * 128);
  // One of the two KV heads per rank, in bf16.
  EXPECT_EQ(m.stages[0].kv_bytes, 2ull * 4 * 128 * 1 * 32 * 2);
  ASSERT_EQ(m.devices.size(), 2u);  // GPUs 0 and 1 of the one host
  EXPECT_EQ(m.devices[0].gpu, 0);
  EXPECT_EQ(m.devices[1].gpu, 1);
}

TEST(placement_memory, kv_for_the_configured_batch_and_context) {
  auto model = engine::load_model_config(tiny());
  ASSERT_TRUE(model.ok());
  auto d = parse_ok("[serving]\nmax_batch_size = 4\nmax_batch_tokens = 64\nmax_context = 100\nkv_block_size = 16\n");
  const auto p = place_ok(d, *model);
  const auto m = estimate_memory(p, d, *model, {});
  EXPECT_EQ(m.kv_tokens, 4 * 112);  // 100 tokens round up to 7 blocks of 16
  EXPECT_TRUE(contains(m.kv_basis, "max_batch_size 4 sequences × 100 tokens")) << m.kv_basis;
}

TEST(placement_memory, what_does_not_fit_is_named) {
  auto model = engine::load_model_config(tiny());
  auto tensors = read_tensor_shapes(tiny());
  ASSERT_TRUE(model.ok() && tensors.ok());
  auto d = parse_ok(R"(
[model]
device = "cuda"
[parallel]
stages = 2
[serving]
kv_blocks = 4096
[[placement.hosts]]
name = "gpu-box"
address = "127.0.0.1"
gpus = 2
gpu_memory_gib = 0.01
)");
  const auto p = place_ok(d, *model);
  const auto m = estimate_memory(p, d, *model, *tensors);
  const auto st = check_fit(m, p);
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(contains(st.err().message, "host gpu-box GPU 0 (stage 0) needs")) << st.err().message;
  EXPECT_TRUE(contains(st.err().message, "host gpu-box GPU 1 (stage 1) needs")) << st.err().message;
  EXPECT_TRUE(contains(st.err().message, "lower serving.max_batch_size")) << st.err().message;
  d.placement.hosts[0].gpu_memory_gib = 1;
  const auto p2 = place_ok(d, *model);
  EXPECT_TRUE(check_fit(estimate_memory(p2, d, *model, *tensors), p2).ok());
}

TEST(placement_memory, sharded_checkpoints_are_read_through_their_index) {
  const std::string dir = std::string(CONVEYOR_FIXTURES_DIR) + "/mistral-sliding";
  auto tensors = read_tensor_shapes(dir);
  ASSERT_TRUE(tensors.ok()) << tensors.err().message;
  EXPECT_GT(tensors->size(), 10u);
  EXPECT_FALSE(read_tensor_shapes("/nonexistent/model").ok());
}

TEST(placement_report, the_table_names_stage_host_gpus_and_layers) {
  auto model = engine::load_model_config(tiny());
  auto tensors = read_tensor_shapes(tiny());
  ASSERT_TRUE(model.ok() && tensors.ok());
  auto d = parse_ok(R"(
[model]
device = "cuda"
[parallel]
stages = 2
tp = 2
[placement]
device_ids = [2, 3, 4, 5]
[serving]
kv_blocks = 16
[[placement.hosts]]
name = "box"
address = "127.0.0.1"
gpus = 8
gpu_memory_gib = 80
)");
  d.model.dir = tiny();
  const auto p = place_ok(d, *model);
  const auto text = format_plan(p, estimate_memory(p, d, *model, *tensors), d, *model);
  EXPECT_TRUE(contains(text, "pptp, 2 stages × tp 2; 2 workers of 2 GPUs on 1 host")) << text;
  EXPECT_TRUE(contains(text, "0      box   127.0.0.1  0       2,3                   0-1 (2 layers)")) << text;
  EXPECT_TRUE(contains(text, "1      box   127.0.0.1  1       4,5                   2-3 (2 layers)")) << text;
  EXPECT_TRUE(contains(text, "80.00 GiB (0% used)")) << text;
}

// ---- quantized weights (issue 12) ----

TEST(placement_memory, quantized_layers_take_a_byte_per_weight_plus_row_scales) {
  auto model = engine::load_model_config(tiny());
  auto tensors = read_tensor_shapes(tiny());
  ASSERT_TRUE(model.ok() && tensors.ok());
  // tiny-llama: per layer q 128x128, k/v 64x128, o 128x128, gate/up 352x128, down 128x352.
  const std::uint64_t numel = 128 * 128 + 2 * 64 * 128 + 128 * 128 + 3 * 352 * 128;
  const std::uint64_t rows = 128 + 2 * 64 + 128 + 2 * 352 + 128;
  const std::uint64_t norms = 4 * 2 * 128;
  for (const char* q : {"int8", "fp8"}) {
    auto d = parse_ok(std::string("[model]\ndevice = \"cuda\"\nquantization = \"") + q + "\"\n[serving]\nkv_blocks = 8\n");
    const auto p = place_ok(d, *model);
    const auto m = estimate_memory(p, d, *model, *tensors);
    // Embedding and head stay bf16 (the head is quantized only with quantize_lm_head).
    EXPECT_EQ(m.stages[0].weight_bytes, 4 * (numel + 4 * rows + norms) + 2 * 2 * 1024 * 128 + 4 * 128) << q;
    auto plain = parse_ok("[model]\ndevice = \"cuda\"\n[serving]\nkv_blocks = 8\n");
    const auto m_plain = estimate_memory(place_ok(plain, *model), plain, *model, *tensors);
    EXPECT_LT(m.stages[0].weight_bytes, m_plain.stages[0].weight_bytes) << q;
  }
  // With the head: 1024 x 128 codes + 1024 scales instead of 2 bytes each.
  auto d = parse_ok("[model]\ndevice = \"cuda\"\nquantization = \"int8\"\nquantize_lm_head = true\n[serving]\nkv_blocks = 8\n");
  const auto m = estimate_memory(place_ok(d, *model), d, *model, *tensors);
  EXPECT_EQ(m.stages[0].weight_bytes, 4 * (numel + 4 * rows + norms) + 2 * 1024 * 128 + (1024 * 128 + 4 * 1024) + 4 * 128);
}

TEST(placement_memory, quantized_tensor_parallel_ranks_keep_whole_rows_of_row_parallel_matrices) {
  auto model = engine::load_model_config(tiny());
  auto tensors = read_tensor_shapes(tiny());
  ASSERT_TRUE(model.ok() && tensors.ok());
  auto d = parse_ok("[model]\ndevice = \"cuda\"\nquantization = \"int8\"\n[parallel]\ntp = 2\n[serving]\nkv_blocks = 8\n");
  const auto m = estimate_memory(place_ok(d, *model), d, *model, *tensors);
  // Half of every matrix's codes; column-parallel (q/k/v/gate/up) half the rows' scales, row-parallel
  // (o/down) every row's scale.
  const std::uint64_t codes = (128 * 128 + 2 * 64 * 128 + 128 * 128 + 3 * 352 * 128) / 2;
  const std::uint64_t scales = 4 * ((128 + 2 * 64 + 2 * 352) / 2 + 128 + 128);
  EXPECT_EQ(m.stages[0].weight_bytes, 4 * (codes + scales + 4 * 2 * 128) + 2 * 2 * 1024 * 128 + 4 * 128);
}

}  // namespace
}  // namespace conveyor::placement
