// Defaults, every key, derived defaults, and origins.
#include <set>
#include <sstream>

#include "config_test_util.hpp"

namespace conveyor::config {
namespace {

using testing::contains;
using testing::parse_ok;

TEST(config_defaults, empty_file_is_a_laptop_deployment_on_loopback) {
  const deployment d = parse_ok("");
  EXPECT_EQ(d.model.dir, "");
  EXPECT_EQ(d.model.dtype, model_dtype::f32);
  EXPECT_EQ(d.model.device, device_kind::cpu);
  EXPECT_EQ(d.model.quantization, weight_quantization::none);
  EXPECT_FALSE(d.model.quantize_lm_head);
  EXPECT_EQ(d.parallel.type, parallel_type::pp);
  EXPECT_EQ(d.parallel.stages, 1);
  EXPECT_EQ(d.parallel.tp, 1);
  EXPECT_EQ(d.parallel.chunks, 1);
  EXPECT_TRUE(d.parallel.layers.empty());
  ASSERT_EQ(d.placement.hosts.size(), 1u);
  EXPECT_EQ(d.placement.hosts[0].name, "localhost");
  EXPECT_EQ(d.placement.hosts[0].address, "127.0.0.1");
  EXPECT_EQ(d.placement.hosts[0].gpus, 0);
  EXPECT_EQ(d.placement.nproc_per_node, 0);
  EXPECT_EQ(d.placement.parallel_level, 0);
  EXPECT_TRUE(d.placement.device_ids.empty());
  EXPECT_EQ(gpus_per_worker(d), 1);
  EXPECT_EQ(d.transport.ucx_tls, "auto");
  EXPECT_EQ(d.transport.max_frame_bytes, 256 << 20);
  EXPECT_EQ(d.cluster.listen, (endpoint{"127.0.0.1", 0}));
  EXPECT_EQ(d.cluster.token, "");
  EXPECT_EQ(d.cluster.token_file, "");
  EXPECT_LT(d.cluster.heartbeat_interval_s, d.cluster.heartbeat_timeout_s);
  EXPECT_EQ(d.frontend.rpc_listen, (endpoint{"127.0.0.1", 7600}));
  EXPECT_FALSE(d.frontend.http_listen.has_value());
  EXPECT_EQ(d.serving.batching, batching_mode::continuous);
  EXPECT_EQ(d.serving.max_batch_size, 32);
  EXPECT_EQ(d.serving.max_batch_delay_ms, 5);
  EXPECT_EQ(d.serving.max_batch_tokens, 2048);
  EXPECT_EQ(d.serving.job_queue_size, 100);
  EXPECT_EQ(d.serving.max_queued_tokens, 0);
  EXPECT_FALSE(d.serving.use_job_ticket);
  EXPECT_TRUE(d.serving.prefix_caching);
  EXPECT_DOUBLE_EQ(d.serving.response_timeout_s, 120);
  EXPECT_DOUBLE_EQ(d.serving.startup_timeout_s, 120);
  EXPECT_EQ(d.serving.min_workers, 1);
  EXPECT_EQ(d.serving.max_workers, 1);
  EXPECT_EQ(d.serving.kv_block_size, 16);
  EXPECT_EQ(d.serving.kv_blocks, 0);
  EXPECT_DOUBLE_EQ(d.serving.kv_memory_fraction, 0.9);
  EXPECT_EQ(d.serving.max_context, 0);
  EXPECT_EQ(d.launch.method, launch_method::local);
  EXPECT_TRUE(d.origins.empty()) << "nothing was set by the file";
}

TEST(config_defaults, every_default_address_is_loopback) {
  const deployment d = parse_ok("");
  EXPECT_TRUE(is_loopback(d.cluster.listen.host));
  EXPECT_TRUE(is_loopback(d.frontend.rpc_listen.host));
  for (const auto& h : d.placement.hosts) EXPECT_TRUE(is_loopback(h.address)) << h.address;
}

TEST(config_defaults, dtype_follows_device) {
  EXPECT_EQ(parse_ok("[model]\ndevice = \"cuda\"\n").model.dtype, model_dtype::bf16);
  EXPECT_EQ(parse_ok("[model]\ndevice = \"cpu\"\n").model.dtype, model_dtype::f32);
  EXPECT_EQ(parse_ok("[model]\ndevice = \"cuda\"\ndtype = \"f32\"\n").model.dtype, model_dtype::f32);
}

TEST(config_defaults, type_is_inferred_from_stages_and_tp) {
  EXPECT_EQ(parse_ok("[parallel]\nstages = 3\n").parallel.type, parallel_type::pp);
  EXPECT_EQ(parse_ok("[parallel]\ntp = 2\n").parallel.type, parallel_type::tp);
  EXPECT_EQ(parse_ok("[parallel]\nstages = 2\ntp = 2\n").parallel.type, parallel_type::pptp);
}

TEST(config_defaults, chunks_default_to_one_per_stage) {
  EXPECT_EQ(parse_ok("[parallel]\nstages = 3\n").parallel.chunks, 3);
  EXPECT_EQ(parse_ok("[parallel]\nstages = 3\nchunks = 1\n").parallel.chunks, 1);
}

// Every key at a value other than its default. Three keys are exclusive with others and are set in
// `exclusive_alternatives` instead.
constexpr std::string_view every_key = R"(
[model]
dir = "/models/m"
dtype = "bf16"
device = "cuda"
quantization = "fp8"
quantize_lm_head = true
draft = "/models/d"
draft_layers = 3
spec_k = 6
batch_invariant = false

[parallel]
type = "custom"
stages = 2
tp = 2
chunks = 5
layers = [3, 1]

[placement]
parallel_level = 2
device_ids = [2, 3, 4, 5]

[[placement.hosts]]
name = "a"
address = "10.1.0.1"
gpus = 8
gpu_memory_gib = 80

[[placement.hosts]]
name = "b"
address = "10.1.0.2"
gpus = 6
gpu_memory_gib = 141.5

[transport]
ucx_tls = "tcp,cma,posix"
max_frame_bytes = 1048576

[cluster]
listen = "10.1.0.1:7700"
token = "s3cret-token"
heartbeat_interval_s = 2
heartbeat_timeout_s = 7.5
recover_stages = false
max_stage_restarts = 5

[frontend]
rpc_listen = "0.0.0.0:9000"
http_listen = "[::1]:9001"

[serving]
batching = "static"
max_batch_size = 8
max_batch_delay_ms = 40
max_batch_tokens = 512
job_queue_size = 7
max_queued_tokens = 100000
use_job_ticket = true
prefix_caching = false
queued_steps = false
response_timeout_s = 30.5
startup_timeout_s = 45
min_workers = 2
max_workers = 3
kv_block_size = 32
kv_blocks = 1000
max_context = 2048
warm_up = true
warm_up_batches = [1, 4]

[launch]
method = "ssh"
ssh_command = "ssh -p 2222 {host} {command}"
srun_command = "srun --mpi=none"
executable = "/opt/conveyor/bin/conveyor"
)";

constexpr std::string_view exclusive_alternatives = R"(
[model]
draft = "ngram"
spec_k = 5
ngram_min = 3
ngram_max = 9
ngram_corpus = "/data/kjv.ids"
[placement]
nproc_per_node = 4
[cluster]
token_file = "secrets/token"
[serving]
kv_memory_fraction = 0.5
)";

TEST(config_keys, every_key_is_read) {
  const deployment d = parse_ok(every_key);
  EXPECT_EQ(d.model.dir, "/models/m");
  EXPECT_EQ(d.model.dtype, model_dtype::bf16);
  EXPECT_EQ(d.model.device, device_kind::cuda);
  EXPECT_EQ(d.model.quantization, weight_quantization::fp8);
  EXPECT_TRUE(d.model.quantize_lm_head);
  EXPECT_EQ(d.model.draft, "/models/d");
  EXPECT_EQ(d.model.draft_layers, 3);
  EXPECT_EQ(d.model.spec_k, 6);
  EXPECT_EQ(d.model.batch_invariant, std::optional<bool>(false));
  EXPECT_EQ(d.parallel.type, parallel_type::custom);
  EXPECT_EQ(d.parallel.stages, 2);
  EXPECT_EQ(d.parallel.tp, 2);
  EXPECT_EQ(d.parallel.chunks, 5);
  EXPECT_EQ(d.parallel.layers, (std::vector<int>{3, 1}));
  EXPECT_EQ(d.placement.parallel_level, 2);
  EXPECT_EQ(d.placement.device_ids, (std::vector<int>{2, 3, 4, 5}));
  EXPECT_EQ(gpus_per_worker(d), 2);
  ASSERT_EQ(d.placement.hosts.size(), 2u);
  EXPECT_EQ(d.placement.hosts[0].name, "a");
  EXPECT_EQ(d.placement.hosts[0].address, "10.1.0.1");
  EXPECT_EQ(d.placement.hosts[0].gpus, 8);
  EXPECT_EQ(d.placement.hosts[1].name, "b");
  EXPECT_EQ(d.placement.hosts[1].address, "10.1.0.2");
  EXPECT_EQ(d.placement.hosts[1].gpus, 6);
  EXPECT_DOUBLE_EQ(d.placement.hosts[0].gpu_memory_gib, 80);
  EXPECT_DOUBLE_EQ(d.placement.hosts[1].gpu_memory_gib, 141.5);
  EXPECT_EQ(d.transport.ucx_tls, "tcp,cma,posix");
  EXPECT_EQ(d.transport.max_frame_bytes, 1048576);
  EXPECT_EQ(d.cluster.listen, (endpoint{"10.1.0.1", 7700}));
  EXPECT_EQ(d.cluster.token, "s3cret-token");
  EXPECT_DOUBLE_EQ(d.cluster.heartbeat_interval_s, 2.0);
  EXPECT_DOUBLE_EQ(d.cluster.heartbeat_timeout_s, 7.5);
  EXPECT_FALSE(d.cluster.recover_stages);
  EXPECT_EQ(d.cluster.max_stage_restarts, 5);
  EXPECT_EQ(d.frontend.rpc_listen, (endpoint{"0.0.0.0", 9000}));
  ASSERT_TRUE(d.frontend.http_listen.has_value());
  EXPECT_EQ(*d.frontend.http_listen, (endpoint{"::1", 9001}));
  EXPECT_EQ(d.serving.batching, batching_mode::fixed);
  EXPECT_EQ(d.serving.max_batch_size, 8);
  EXPECT_EQ(d.serving.max_batch_delay_ms, 40);
  EXPECT_EQ(d.serving.max_batch_tokens, 512);
  EXPECT_EQ(d.serving.job_queue_size, 7);
  EXPECT_EQ(d.serving.max_queued_tokens, 100000);
  EXPECT_TRUE(d.serving.use_job_ticket);
  EXPECT_FALSE(d.serving.prefix_caching);
  EXPECT_FALSE(d.serving.queued_steps);
  EXPECT_DOUBLE_EQ(d.serving.response_timeout_s, 30.5);
  EXPECT_DOUBLE_EQ(d.serving.startup_timeout_s, 45);
  EXPECT_EQ(d.serving.min_workers, 2);
  EXPECT_EQ(d.serving.max_workers, 3);
  EXPECT_EQ(d.serving.kv_block_size, 32);
  EXPECT_EQ(d.serving.kv_blocks, 1000);
  EXPECT_EQ(d.serving.max_context, 2048);
  EXPECT_TRUE(d.serving.warm_up);
  EXPECT_EQ(d.serving.warm_up_batches, (std::vector<int>{1, 4}));
  EXPECT_EQ(warm_up_batches(d), (std::vector<int>{1, 4}));
  EXPECT_EQ(d.launch.method, launch_method::ssh);
  EXPECT_EQ(d.launch.ssh_command, "ssh -p 2222 {host} {command}");
  EXPECT_EQ(d.launch.srun_command, "srun --mpi=none");
  EXPECT_EQ(d.launch.executable, "/opt/conveyor/bin/conveyor");

  const deployment alt = parse_ok(exclusive_alternatives);
  EXPECT_EQ(alt.placement.nproc_per_node, 4);
  EXPECT_EQ(gpus_per_worker(alt), 4);
  EXPECT_EQ(alt.cluster.token_file, "secrets/token") << "parse_deployment keeps paths as written";
  EXPECT_DOUBLE_EQ(alt.serving.kv_memory_fraction, 0.5);
  EXPECT_EQ(alt.model.draft, "ngram");
  EXPECT_EQ(alt.model.ngram_min, 3);
  EXPECT_EQ(alt.model.ngram_max, 9);
  EXPECT_EQ(alt.model.ngram_corpus, "/data/kjv.ids");
}

// serving.warm_up_batches left out: cuda stages warm up at 1, 2, 4, ... 64 up to max_batch_size,
// cpu stages not at all; warm_up = false: none anywhere; a list given: that list on either.
TEST(config_keys, warm_up_batches_default_by_device) {
  EXPECT_EQ(warm_up_batches(parse_ok("[model]\ndevice = \"cuda\"\n[serving]\nmax_batch_size = 20\n")),
            (std::vector<int>{1, 2, 4, 8, 16}));
  EXPECT_EQ(warm_up_batches(parse_ok("[model]\ndevice = \"cuda\"\n[serving]\nmax_batch_size = 256\n")),
            (std::vector<int>{1, 2, 4, 8, 16, 32, 64}));
  EXPECT_TRUE(warm_up_batches(parse_ok("[model]\ndevice = \"cuda\"\n[serving]\nwarm_up = false\n")).empty());
  EXPECT_TRUE(warm_up_batches(parse_ok("[serving]\nmax_batch_size = 20\n")).empty());
  EXPECT_EQ(warm_up_batches(parse_ok("[serving]\nwarm_up_batches = [3, 1]\n")), (std::vector<int>{3, 1}));
}

// Guards the test above: when a key is added to `describe`, it must be added to `every_key` too.
TEST(config_keys, every_described_key_is_covered_by_the_every_key_test) {
  std::set<std::string> defaulted;
  std::istringstream lines(describe(parse_ok(every_key)));
  for (std::string line; std::getline(lines, line);) {
    if (contains(line, "(default)")) defaulted.insert(line.substr(0, line.find(" = ")));
  }
  EXPECT_EQ(defaulted, (std::set<std::string>{"placement.nproc_per_node", "cluster.token_file",
                                              "serving.kv_memory_fraction", "model.ngram_min", "model.ngram_max",
                                              "model.ngram_corpus"}));
  std::istringstream alt(describe(parse_ok(exclusive_alternatives)));
  for (std::string line; std::getline(alt, line);) {
    const std::string key = line.substr(0, line.find(" = "));
    if (defaulted.count(key)) {
      EXPECT_FALSE(contains(line, "(default)")) << line;
    }
  }
}

TEST(config_keys, a_host_name_defaults_to_its_address) {
  const deployment d = parse_ok("[[placement.hosts]]\naddress = \"127.0.0.2\"\n");
  ASSERT_EQ(d.placement.hosts.size(), 1u);
  EXPECT_EQ(d.placement.hosts[0].name, "127.0.0.2");
}

TEST(config_keys, origins_point_at_the_value) {
  const deployment d = parse_ok("# comment\n[parallel]\n  stages   = 2\n");
  ASSERT_EQ(d.origins.count("parallel.stages"), 1u);
  const auto& pos = d.origins.at("parallel.stages");
  EXPECT_EQ(pos.source, "deploy.toml");
  EXPECT_EQ(pos.line, 3);
  EXPECT_EQ(pos.column, 14);
}

TEST(config_keys, dotted_keys_and_inline_tables_mean_the_same) {
  const deployment a = parse_ok("parallel.stages = 2\nmodel = { device = \"cuda\" }\n");
  EXPECT_EQ(a.parallel.stages, 2);
  EXPECT_EQ(a.model.device, device_kind::cuda);
  const deployment b = parse_ok("[placement]\nhosts = [{ address = \"127.0.0.1\", gpus = 2 }]\n");
  ASSERT_EQ(b.placement.hosts.size(), 1u);
  EXPECT_EQ(b.placement.hosts[0].gpus, 2);
}

TEST(config_keys, batching_modes_and_launch_methods) {
  EXPECT_EQ(parse_ok("serving.batching = \"dynamic\"").serving.batching, batching_mode::dynamic);
  EXPECT_EQ(parse_ok("serving.batching = \"continuous\"").serving.batching, batching_mode::continuous);
  EXPECT_EQ(to_string(batching_mode::fixed), "static");
  EXPECT_EQ(parse_ok("launch.method = \"slurm\"").launch.method, launch_method::slurm);
}

TEST(config_transport, ucx_tls_names_map_to_ucx_values) {
  transport_section t;
  EXPECT_EQ(ucx_tls_env(t), "") << "auto leaves UCX_TLS unset";
  t.ucx_tls = "tcp";
  EXPECT_EQ(ucx_tls_env(t), "tcp,self");
  t.ucx_tls = "shm";
  EXPECT_EQ(ucx_tls_env(t), "sm,self");
  t.ucx_tls = "^ib";
  EXPECT_EQ(ucx_tls_env(t), "^ib");
  EXPECT_EQ(parse_ok("transport.ucx_tls = \"^ib,rdmacm\"").transport.ucx_tls, "^ib,rdmacm");
}

TEST(config_endpoint, parses_and_prints) {
  auto e = parse_endpoint("127.0.0.1:7600");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(*e, (endpoint{"127.0.0.1", 7600}));
  EXPECT_EQ(to_string(*e), "127.0.0.1:7600");
  auto v6 = parse_endpoint("[::1]:0");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(to_string(*v6), "[::1]:0");
  auto named = parse_endpoint("node-a.example:80");
  ASSERT_TRUE(named.ok());
  EXPECT_EQ(named->host, "node-a.example");
  for (const char* bad : {"", "127.0.0.1", ":7600", "host:", "host:65536", "host:-1", "host:7x", "::1:7600",
                          "[::1]7600", "a b:1"}) {
    EXPECT_FALSE(parse_endpoint(bad).ok()) << bad;
  }
  EXPECT_TRUE(is_loopback("127.0.0.1"));
  EXPECT_TRUE(is_loopback("127.3.2.1"));
  EXPECT_TRUE(is_loopback("::1"));
  EXPECT_TRUE(is_loopback("localhost"));
  EXPECT_FALSE(is_loopback("0.0.0.0"));
  EXPECT_FALSE(is_loopback("10.0.0.1"));
}

TEST(config_model, speculative_decoding_keys) {
  const deployment off = parse_ok("");
  EXPECT_EQ(off.model.spec_k, 0);
  EXPECT_EQ(off.model.draft_layers, 0);
  EXPECT_EQ(off.model.draft, "");
  const deployment d = parse_ok("[model]\ndraft = \"/models/draft\"\ndraft_layers = 2\nspec_k = 5\n");
  EXPECT_EQ(d.model.draft, "/models/draft");
  EXPECT_EQ(d.model.draft_layers, 2);
  EXPECT_EQ(d.model.spec_k, 5);
  EXPECT_TRUE(contains(describe(d), "model.spec_k = 5"));
  // Unset, row-invariant kernels follow the draft (speculative verification = decode steps in bf16).
  EXPECT_FALSE(d.model.batch_invariant.has_value());
  EXPECT_TRUE(contains(describe(d), "model.batch_invariant = true (spec_k > 0)  (default)")) << describe(d);
  EXPECT_TRUE(contains(describe(off), "model.batch_invariant = false (spec_k = 0)  (default)"));
  const deployment on = parse_ok("[model]\nbatch_invariant = true\n");
  EXPECT_TRUE(contains(describe(on), "model.batch_invariant = true  (deploy.toml:2:19)")) << describe(on);
  EXPECT_TRUE(contains(testing::parse_error_of("[model]\nbatch_invariant = \"yes\"\n"), "model.batch_invariant"));
}

}  // namespace
}  // namespace conveyor::config
