// Every kind of error names file:line:column, the dotted key, and what is allowed.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <vector>

#include "config_test_util.hpp"

namespace conveyor::config {
namespace {

using testing::contains;
using testing::parse_error_of;

struct bad_config {
  const char* name;
  const char* toml;
  std::vector<const char*> expected;  ///< substrings of the message, in any order
};

std::ostream& operator<<(std::ostream& os, const bad_config& c) { return os << c.name; }

class config_error : public ::testing::TestWithParam<bad_config> {};

TEST_P(config_error, message_names_position_key_and_what_is_allowed) {
  const bad_config& c = GetParam();
  const std::string message = parse_error_of(c.toml);
  ASSERT_FALSE(message.empty()) << c.name << " was accepted";
  for (const char* piece : c.expected)
    EXPECT_TRUE(contains(message, piece)) << "missing \"" << piece << "\" in:\n" << message;
  EXPECT_EQ(message.rfind("deploy.toml:", 0), 0u) << "every message starts with the file: " << message;
}

const bad_config value_errors[] = {
    {"syntax", "[parallel]\nstages = = 2\n", {"deploy.toml:2:", "not valid TOML"}},
    {"range",
     "[parallel]\nstages = 0\n",
     {"deploy.toml:2:10: parallel.stages = 0: must be an integer from 1 to 1024"}},
    {"range_high",
     "[parallel]\ntp = 1000\n",
     {"deploy.toml:2:6: parallel.tp = 1000: must be an integer from 1 to 64"}},
    {"ngram_range",
     "[model]\nngram_max = 65\n",
     {"deploy.toml:2:13: model.ngram_max = 65: must be an integer from 1 to 64"}},
    {"spec_k_range",
     "[model]\nspec_k = 65\n",
     {"deploy.toml:2:10: model.spec_k = 65: must be an integer from 0 to 64"}},
    {"type_int",
     "[parallel]\nstages = \"2\"\n",
     {"deploy.toml:2:10: parallel.stages = \"2\": must be an integer from 1 to 1024, not a string"}},
    {"float_for_int",
     "[parallel]\nchunks = 2.0\n",
     {"deploy.toml:2:10: parallel.chunks = 2.0", "not a float"}},
    {"choice",
     "[model]\ndtype = \"fp16\"\n",
     {"deploy.toml:2:9: model.dtype = \"fp16\": must be \"f32\" or \"bf16\""}},
    {"choice_type",
     "[model]\ndevice = 1\n",
     {"deploy.toml:2:10: model.device = 1: must be \"cpu\" or \"cuda\", not an integer"}},
    {"parallel_type",
     "[parallel]\ntype = \"dp\"\n",
     {"deploy.toml:2:8: parallel.type = \"dp\": must be \"pp\", \"tp\", \"pptp\" or \"custom\""}},
    {"batching",
     "[serving]\nbatching = \"greedy\"\n",
     {"deploy.toml:2:12: serving.batching = \"greedy\": must be \"continuous\", \"dynamic\" or \"static\""}},
    {"seconds_zero",
     "[serving]\nresponse_timeout_s = 0\n",
     {"deploy.toml:2:22: serving.response_timeout_s = 0: must be a number > 0 and <= 604800"}},
    {"seconds_type",
     "[serving]\nstartup_timeout_s = \"2m\"\n",
     {"deploy.toml:2:21: serving.startup_timeout_s", "not a string"}},
    {"fraction",
     "[serving]\nkv_memory_fraction = 1.5\n",
     {"deploy.toml:2:22: serving.kv_memory_fraction = 1.5: must be a number > 0 and <= 1"}},
    {"max_stage_restarts_negative",
     "[cluster]\nmax_stage_restarts = -1\n",
     {"deploy.toml:2:22: cluster.max_stage_restarts = -1: must be an integer from 0 to 1000"}},
    {"recover_stages_not_bool",
     "[cluster]\nrecover_stages = 1\n",
     {"deploy.toml:2:18: cluster.recover_stages = 1: must be true or false, not an integer"}},
    {"bool",
     "[serving]\nuse_job_ticket = \"yes\"\n",
     {"deploy.toml:2:18: serving.use_job_ticket = \"yes\": must be true or false, not a string"}},
    {"bool_prefix_caching",
     "[serving]\nprefix_caching = 0\n",
     {"deploy.toml:2:18: serving.prefix_caching = 0: must be true or false, not an integer"}},
    {"endpoint",
     "[frontend]\nrpc_listen = \"localhost\"\n",
     {"deploy.toml:2:14: frontend.rpc_listen = \"localhost\": must be \"HOST:PORT\" with a port from 0 to "
      "65535"}},
    {"endpoint_port",
     "[cluster]\nlisten = \"127.0.0.1:70000\"\n",
     {"deploy.toml:2:10: cluster.listen", "bad port \"70000\""}},
    {"empty_string", "[model]\ndir = \"\"\n", {"deploy.toml:2:7: model.dir = \"\": must not be empty"}},
    {"list_entry",
     "[parallel]\nstages = 2\nlayers = [2, 0]\n",
     {"deploy.toml:3:14: parallel.layers[1] = 0: each entry must be an integer from 1 to 100000"}},
    {"list_type",
     "[parallel]\nlayers = 4\n",
     {"deploy.toml:2:10: parallel.layers = 4: must be an array of integers"}},
    {"list_empty",
     "[placement]\ndevice_ids = []\n",
     {"deploy.toml:2:14: placement.device_ids = []: must not be empty"}},
    {"list_repeat",
     "[model]\ndevice = \"cuda\"\n[placement]\ndevice_ids = [0, 1, 0]\n",
     {"deploy.toml:4:21: placement.device_ids[2] = 0: listed twice"}},
    {"ucx_tls",
     "[transport]\nucx_tls = \"tcp;sm\"\n",
     {"deploy.toml:2:11: transport.ucx_tls = \"tcp;sm\": must be \"auto\", \"tcp\", \"shm\" or a UCX_TLS "
      "list"}},
    {"frame",
     "[transport]\nmax_frame_bytes = 10\n",
     {"deploy.toml:2:19: transport.max_frame_bytes = 10: must be an integer from 4096 to"}},
    {"ssh_template",
     "[launch]\nssh_command = \"ssh {host}\"\n",
     {"deploy.toml:2:15: launch.ssh_command", "must contain {command}"}},
    {"ssh_template_placeholder",
     "[launch]\nssh_command = \"ssh {hostname} {command}\"\n",
     {"deploy.toml:2:15: launch.ssh_command", "has {hostname}: the placeholders are {host} (= {address}), {name} and {command}"}},
    {"gpu_memory",
     "[[placement.hosts]]\naddress = \"127.0.0.1\"\ngpu_memory_gib = -1\n",
     {"deploy.toml:3:18: placement.hosts[0].gpu_memory_gib = -1: must be a number"}},
    {"section_type",
     "model = \"x\"\n",
     {"deploy.toml:1:9: model = \"x\": must be a table ([model]), not a string"}},
    {"host_address_missing",
     "[[placement.hosts]]\nname = \"a\"\ngpus = 2\n",
     {"deploy.toml:1:",
      "placement.hosts[0].address is missing: give the address workers on this host bind to"}},
    {"host_address_bad",
     "[[placement.hosts]]\naddress = \"10.0.0.1:22\"\n",
     {"deploy.toml:2:11: placement.hosts[0].address = \"10.0.0.1:22\": must be a hostname or IP address "
      "without a port"}},
    {"hosts_not_tables",
     "[placement]\nhosts = [\"a\", \"b\"]\n",
     {"deploy.toml:2:9: placement.hosts", "must be one or more [[placement.hosts]] tables"}},
    {"host_gpus",
     "[[placement.hosts]]\naddress = \"127.0.0.1\"\ngpus = -1\n",
     {"deploy.toml:3:8: placement.hosts[0].gpus = -1: must be an integer from 0 to 1024"}},
    {"quantization",
     "[model]\nquantization = \"int4\"\n",
     {"deploy.toml:2:16: model.quantization", "int4", "\"none\"", "\"int8\"", "\"fp8\""}},
};
INSTANTIATE_TEST_SUITE_P(values, config_error, ::testing::ValuesIn(value_errors),
                         [](const auto& test) { return std::string(test.param.name); });

const bad_config unknown_keys[] = {
    {"typo_in_table",
     "[parallel]\nstagess = 2\n",
     {"deploy.toml:2:1: parallel.stagess: unknown key; did you mean parallel.stages?",
      "allowed in [parallel]: type, stages, tp, chunks, layers"}},
    {"typo_in_table_name",
     "[modle]\ndir = \"x\"\n",
     {"deploy.toml:1:2: modle: unknown key; did you mean model?",
      "allowed tables: model, parallel, placement"}},
    {"key_in_wrong_table",
     "[model]\nstages = 2\n",
     {"deploy.toml:2:1: model.stages: unknown key; did you mean parallel.stages?"}},
    {"top_level_key",
     "chunks = 2\n",
     {"deploy.toml:1:1: chunks: unknown key; did you mean parallel.chunks?"}},
    {"torchserve_camel_case",
     "[placement]\nparallelLevel = 2\n",
     {"placement.parallelLevel: unknown key; did you mean placement.parallel_level?"}},
    {"vllm_prefix_caching",
     "[serving]\nenable_prefix_caching = false\n",
     {"deploy.toml:2:1: serving.enable_prefix_caching: unknown key; did you mean serving.prefix_caching?"}},
    {"vllm_capture_sizes",
     "[serving]\ncudagraph_capture_sizes = [1, 2]\n",
     {"serving.cudagraph_capture_sizes: unknown key; did you mean serving.warm_up_batches?"}},
    {"vllm_spelling",
     "[parallel]\ntensor_parallel_size = 2\n",
     {"parallel.tensor_parallel_size: unknown key; did you mean parallel.tp?"}},
    {"host_table",
     "[[placement.hosts]]\naddress = \"127.0.0.1\"\ngpu = 2\n",
     {"deploy.toml:3:1: placement.hosts[0].gpu: unknown key; did you mean placement.hosts[0].gpus?",
      "(allowed in [[placement.hosts]]: address, name, gpus, gpu_memory_gib)"}},
};
INSTANTIATE_TEST_SUITE_P(unknown, config_error, ::testing::ValuesIn(unknown_keys),
                         [](const auto& test) { return std::string(test.param.name); });

const bad_config contradictions[] = {
    {"nproc_per_node_and_parallel_level",
     "[placement]\nnproc_per_node = 2\nparallel_level = 2\n",
     {"deploy.toml:3:18: placement.nproc_per_node = 2 (deploy.toml:2:18) and placement.parallel_level = 2 "
      "are both set",
      "set only one"}},
    {"kv_blocks_and_fraction",
     "[serving]\nkv_memory_fraction = 0.5\nkv_blocks = 100\n",
     {"deploy.toml:3:13: serving.kv_blocks = 100 and serving.kv_memory_fraction = 0.5 (deploy.toml:2:22) are "
      "both set"}},
    {"token_and_token_file",
     "[cluster]\ntoken = \"t\"\ntoken_file = \"f\"\n",
     {"deploy.toml:3:14: cluster.token = (hidden) (deploy.toml:2:9) and cluster.token_file = \"f\" are both "
      "set"}},
    {"pp_with_tp",
     "[parallel]\ntype = \"pp\"\ntp = 2\n",
     {"deploy.toml:3:6: parallel.type = \"pp\" (deploy.toml:2:8) contradicts parallel.tp = 2",
      "use type = \"pptp\""}},
    {"tp_with_stages",
     "[parallel]\nstages = 2\ntype = \"tp\"\n",
     {"deploy.toml:3:8: parallel.type = \"tp\" contradicts parallel.stages = 2 (deploy.toml:2:10)"}},
    {"layers_vs_stages",
     "[parallel]\nlayers = [2, 2]\n",
     {"deploy.toml:2:10: parallel.layers = [2, 2] has 2 entries but parallel.stages = 1 (default)"}},
    {"per_worker_not_multiple_of_tp",
     "[parallel]\ntp = 2\n[placement]\nparallel_level = 3\n",
     {"deploy.toml:4:18: placement.parallel_level = 3 is not a multiple of parallel.tp = 2 "
      "(deploy.toml:2:6)"}},
    {"remote_hosts_with_loopback_listen",
     "[launch]\nmethod = \"ssh\"\n[[placement.hosts]]\naddress = \"10.0.0.1\"\n[[placement.hosts]]\naddress "
     "= \"10.0.0.2\"\n",
     {"cluster.listen = \"127.0.0.1:0\" (default) is a loopback address", "could not reach the coordinator"}},
    {"shm_across_hosts",
     "[transport]\nucx_tls = \"shm\"\n[cluster]\nlisten = \"10.0.0.1:0\"\n[launch]\nmethod = \"ssh\"\n"
     "[[placement.hosts]]\naddress = \"10.0.0.1\"\n[[placement.hosts]]\naddress = \"10.0.0.2\"\n",
     {"deploy.toml:7:1: transport.ucx_tls = \"shm\" (deploy.toml:2:11) cannot connect the 2 hosts"}},
    {"local_launch_across_hosts",
     "[cluster]\nlisten = \"10.0.0.1:0\"\n[[placement.hosts]]\naddress = "
     "\"10.0.0.1\"\n[[placement.hosts]]\naddress = \"10.0.0.2\"\n",
     {"launch.method = \"local\" (default) can only start processes on this machine",
      "use method = \"ssh\" or \"slurm\""}},
    {"duplicate_hosts",
     "[cluster]\nlisten = \"10.0.0.1:0\"\n[launch]\nmethod = \"ssh\"\n"
     "[[placement.hosts]]\nname = \"a\"\naddress = \"10.0.0.1\"\n[[placement.hosts]]\nname = \"a\"\naddress "
     "= \"10.0.0.1\"\n",
     {"deploy.toml:9:8: placement.hosts[1].name = \"a\": another host has this name",
      "deploy.toml:10:11: placement.hosts[1].address = \"10.0.0.1\": another host has this address"}},
    {"device_ids_on_cpu",
     "[placement]\ndevice_ids = [0]\n",
     {"deploy.toml:2:14: placement.device_ids = [0] needs model.device = \"cuda\" (default)"}},
    {"device_ids_beyond_host",
     "[model]\ndevice = \"cuda\"\n[placement]\ndevice_ids = [6, 7, 8]\n"
     "[[placement.hosts]]\naddress = \"127.0.0.1\"\ngpus = 8\n",
     {"deploy.toml:7:8: placement.device_ids = [6, 7, 8] (deploy.toml:4:14) names GPU 8, but host "
      "\"127.0.0.1\" has "
      "placement.hosts[0].gpus = 8 (ids 0 to 7)"}},
    {"not_enough_gpus",
     "[model]\ndevice = \"cuda\"\n[parallel]\nstages = 4\ntp = 2\n"
     "[[placement.hosts]]\naddress = \"127.0.0.1\"\ngpus = 4\n",
     {"deploy.toml:5:6: parallel.stages = 4 (deploy.toml:4:10) × parallel.tp = 2 needs 8 GPUs, but "
      "placement.hosts offers 4"}},
    {"tp_group_spans_hosts",
     "[model]\ndevice = \"cuda\"\n[parallel]\ntp = 8\n[cluster]\nlisten = \"10.0.0.1:0\"\n"
     "[launch]\nmethod = \"ssh\"\n[[placement.hosts]]\naddress = \"10.0.0.1\"\ngpus = 4\n"
     "[[placement.hosts]]\naddress = \"10.0.0.2\"\ngpus = 4\n",
     {"a worker needs 8 GPUs", "no host of placement.hosts has more than 4 usable"}},
    {"min_workers_above_max",
     "[serving]\nmin_workers = 3\n",
     {"deploy.toml:2:15: serving.min_workers = 3 is more than serving.max_workers = 1 (default)"}},
    {"heartbeat_timeout_not_longer",
     "[cluster]\nheartbeat_interval_s = 5\nheartbeat_timeout_s = 5\n",
     {"deploy.toml:3:23: cluster.heartbeat_timeout_s = 5 must be longer than cluster.heartbeat_interval_s = "
      "5"}},
    {"batch_tokens_below_batch_size",
     "[serving]\nmax_batch_size = 64\nmax_batch_tokens = 32\n",
     {"deploy.toml:3:20: serving.max_batch_tokens = 32 is less than serving.max_batch_size = 64 "
      "(deploy.toml:2:18)"}},
    {"warm_up_batch_above_batch_size",
     "[serving]\nmax_batch_size = 8\nwarm_up_batches = [1, 16]\n",
     {"serving.warm_up_batches = [1, 16]", "has 16, more than serving.max_batch_size = 8"}},
    {"warm_up_off_with_batches",
     "[serving]\nwarm_up = false\nwarm_up_batches = [1, 2]\n",
     {"serving.warm_up = false", "contradicts serving.warm_up_batches = [1, 2]"}},
    {"warm_up_batches_bad_entries",
     "[serving]\nwarm_up_batches = [1, 0, 1]\n",
     {"serving.warm_up_batches[1] = 0: each entry must be an integer from 1",
      "serving.warm_up_batches[2] = 1: listed twice"}},
    {"kv_blocks_too_few",
     "[serving]\nkv_blocks = 10\nmax_context = 4096\n",
     {"deploy.toml:3:15: serving.kv_blocks = 10 (deploy.toml:2:13) of serving.kv_block_size = 16 (default) "
      "tokens "
      "cannot hold one sequence of serving.max_context = 4096 tokens"}},
    {"same_port_twice",
     "[frontend]\nhttp_listen = \"127.0.0.1:7600\"\n",
     {"deploy.toml:2:15: frontend.rpc_listen = \"127.0.0.1:7600\" (default) and frontend.http_listen = "
      "\"127.0.0.1:7600\" share a port"}},
    {"fp8_on_cpu",
     "[model]\nquantization = \"fp8\"\n",
     {"model.quantization = \"fp8\" needs model.device = \"cuda\"", "use \"int8\" on the CPU"}},
    {"quantize_lm_head_without_quantization",
     "[model]\nquantize_lm_head = true\n",
     {"deploy.toml:2:20: model.quantize_lm_head = true needs model.quantization = \"int8\" or \"fp8\""}},
    {"ngram_min_above_max",
     "[model]\ndraft = \"ngram\"\nngram_min = 5\nngram_max = 3\n",
     {"deploy.toml:4:13: model.ngram_min = 5 (deploy.toml:3:13) is above model.ngram_max = 3"}},
    {"ngram_corpus_without_ngram",
     "[model]\nngram_corpus = \"kjv.ids\"\n",
     {"model.ngram_corpus = \"kjv.ids\" needs model.draft = \"ngram\""}},
    {"ngram_with_draft_layers",
     "[model]\ndraft = \"ngram\"\ndraft_layers = 2\n",
     {"model.draft_layers = 2", "applies to a draft model, not to model.draft = \"ngram\""}},
    {"wildcard_shares_a_port",
     "[cluster]\nlisten = \"0.0.0.0:7600\"\n",
     {"deploy.toml:2:10: cluster.listen = \"0.0.0.0:7600\" and frontend.rpc_listen = \"127.0.0.1:7600\" "
      "(default) share a port"}},
};
INSTANTIATE_TEST_SUITE_P(contradictions, config_error, ::testing::ValuesIn(contradictions),
                         [](const auto& test) { return std::string(test.param.name); });

TEST(config_errors, every_problem_is_reported_at_once) {
  const std::string message =
      parse_error_of("[parallel]\nstages = 0\ntp = 0\n[serving]\nbatchingg = \"dynamic\"\n");
  EXPECT_TRUE(contains(message, "parallel.stages = 0")) << message;
  EXPECT_TRUE(contains(message, "parallel.tp = 0")) << message;
  EXPECT_TRUE(contains(message, "serving.batchingg: unknown key; did you mean serving.batching?")) << message;
  EXPECT_EQ(std::count(message.begin(), message.end(), '\n'), 2) << "one line per problem:\n" << message;
}

TEST(config_errors, no_suggestion_for_a_word_unlike_any_key) {
  const std::string message = parse_error_of("[serving]\nzebra = 1\n");
  EXPECT_TRUE(contains(message, "deploy.toml:2:1: serving.zebra: unknown key (allowed in [serving]:"))
      << message;
  EXPECT_FALSE(contains(message, "did you mean")) << message;
}

TEST(config_errors, error_codes_tell_syntax_from_values) {
  auto syntax = parse_deployment("[a", "deploy.toml");
  ASSERT_FALSE(syntax.ok());
  EXPECT_EQ(syntax.err().code, errc::bad_format);
  auto value = parse_deployment("parallel.stages = 0", "deploy.toml");
  ASSERT_FALSE(value.ok());
  EXPECT_EQ(value.err().code, errc::invalid_argument);
}

TEST(config_errors, missing_file_is_not_found_and_names_it) {
  auto d = load_deployment("/nonexistent/deploy.toml");
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.err().code, errc::not_found);
  EXPECT_TRUE(contains(d.err().message, "/nonexistent/deploy.toml")) << d.err().message;
}

TEST(config_errors, a_directory_is_not_an_empty_config) {
  auto d = load_deployment(std::filesystem::temp_directory_path().string());
  ASSERT_FALSE(d.ok()) << "a directory must not load as all defaults";
  EXPECT_TRUE(contains(d.err().message, "is a directory")) << d.err().message;
}

TEST(config_errors, file_errors_name_the_path_given) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("conveyor_config_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = (dir / "bad.toml").string();
  std::ofstream(path) << "[parallel]\nstages = -3\n";
  auto d = load_deployment(path);
  std::filesystem::remove_all(dir);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.err().message, path + ":2:10: parallel.stages = -3: must be an integer from 1 to 1024");
}

}  // namespace
}  // namespace conveyor::config
