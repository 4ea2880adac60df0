// Every example in configs/ loads, and the laptop example is the complete, runnable reference.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "config_test_util.hpp"

namespace conveyor::config {
namespace {

namespace fs = std::filesystem;
using testing::contains;

std::vector<fs::path> example_files() {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(CONVEYOR_CONFIGS_DIR)) {
    if (entry.path().extension() == ".toml") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

TEST(config_examples, every_file_in_configs_loads) {
  const auto files = example_files();
  ASSERT_GE(files.size(), 3u) << "configs/ should hold laptop, one-gpu and two-hosts examples";
  for (const auto& f : files) {
    auto d = load_deployment(f.string());
    EXPECT_TRUE(d.ok()) << f << ": " << (d.ok() ? "" : d.err().message);
  }
}

TEST(config_examples, laptop_runs_the_tiny_model_in_two_cpu_stages) {
  auto d = load_deployment(std::string(CONVEYOR_CONFIGS_DIR) + "/laptop.toml");
  ASSERT_TRUE(d.ok()) << d.err().message;
  EXPECT_EQ(d->model.device, device_kind::cpu);
  EXPECT_EQ(d->parallel.stages, 2);
  // model.dir is resolved against configs/, so it works from any working directory.
  EXPECT_TRUE(fs::equivalent(d->model.dir, CONVEYOR_FIXTURES_DIR "/tiny-llama")) << d->model.dir;
  EXPECT_TRUE(fs::exists(fs::path(d->model.dir) / "config.json"));
  // tests/fixtures/tiny-llama/config.json: 4 layers, 4 attention heads, 2 KV heads, 512 positions.
  EXPECT_TRUE(validate_against_model(*d, 4, 4, 2, 512).ok());
  EXPECT_TRUE(is_loopback(d->cluster.listen.host));
  EXPECT_TRUE(is_loopback(d->frontend.rpc_listen.host));
}

TEST(config_examples, laptop_is_the_reference_and_sets_every_key) {
  auto d = load_deployment(std::string(CONVEYOR_CONFIGS_DIR) + "/laptop.toml");
  ASSERT_TRUE(d.ok()) << d.err().message;
  std::set<std::string> defaulted;
  std::istringstream lines(describe(*d));
  for (std::string line; std::getline(lines, line);) {
    if (contains(line, "(default)")) defaulted.insert(line.substr(0, line.find(" = ")));
  }
  // These are exclusive with keys it sets, or need a GPU; it explains them in comments.
  const std::set<std::string> commented{"placement.nproc_per_node", "placement.parallel_level",
                                        "placement.device_ids",     "cluster.token",
                                        "cluster.token_file",       "serving.kv_memory_fraction",
                                        "model.draft",              "model.draft_layers",
                                        "model.spec_k",             "model.ngram_min",
                                        "model.ngram_max",          "model.ngram_corpus",       "model.batch_invariant"};
  EXPECT_EQ(defaulted, commented);
  std::ifstream in(std::string(CONVEYOR_CONFIGS_DIR) + "/laptop.toml");
  std::stringstream text;
  text << in.rdbuf();
  for (const auto& key : commented) {
    const std::string leaf = key.substr(key.find('.') + 1);
    EXPECT_TRUE(contains(text.str(), "# " + leaf + " = ")) << key << " is not shown commented out";
  }
}

TEST(config_examples, two_hosts_is_pptp_over_sixteen_gpus) {
  auto d = load_deployment(std::string(CONVEYOR_CONFIGS_DIR) + "/two-hosts-8-gpus.toml");
  ASSERT_TRUE(d.ok()) << d.err().message;
  EXPECT_EQ(d->parallel.type, parallel_type::pptp);
  ASSERT_EQ(d->placement.hosts.size(), 2u);
  EXPECT_EQ(d->placement.hosts[0].gpus + d->placement.hosts[1].gpus, 16);
  EXPECT_EQ(d->parallel.stages * d->parallel.tp, 16);
  EXPECT_EQ(gpus_per_worker(*d), d->parallel.tp);
  EXPECT_EQ(d->launch.method, launch_method::ssh);
  // Llama 3 70B: 80 layers, 64 heads, 8 KV heads.
  EXPECT_TRUE(validate_against_model(*d, 80, 64, 8, 8192).ok());
}

TEST(config_examples, relative_paths_resolve_against_the_file) {
  const fs::path dir = fs::temp_directory_path() / ("conveyor_config_paths_" + std::to_string(::getpid()));
  fs::create_directories(dir / "sub");
  std::ofstream(dir / "sub" / "d.toml") << "[model]\ndir = \"../m\"\n[cluster]\ntoken_file = \"tok\"\n";
  auto d = load_deployment((dir / "sub" / "d.toml").string());
  fs::remove_all(dir);
  ASSERT_TRUE(d.ok()) << d.err().message;
  EXPECT_EQ(d->model.dir, (dir / "m").string());
  EXPECT_EQ(d->cluster.token_file, (dir / "sub" / "tok").string());
}

}  // namespace
}  // namespace conveyor::config
