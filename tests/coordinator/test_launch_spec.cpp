// The processes `conveyor launch` starts, without starting them: command lines per launch method,
// where the token goes, template placeholders, quoting (checked by a real shell), the --slurm list.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "conveyor/coordinator/launch_spec.hpp"
#include "conveyor/coordinator/worker_launcher.hpp"

namespace conveyor::coordinator {
namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

launch_settings settings(launch_method m) {
  launch_settings ls;
  ls.method = m;
  ls.executable = "/opt/conveyor/bin/conveyor";
  ls.coordinator = "10.0.0.1:7700";
  ls.join_timeout_s = 120;
  return ls;
}

std::vector<worker_site> two_hosts() {
  return {{"node-a", "10.0.0.1", "0,1"}, {"node-b", "10.0.0.2", "2,3"}};
}

TEST(launch_spec, shell_quote) {
  EXPECT_EQ(shell_quote("abc-1.2/x:y,z@w"), "abc-1.2/x:y,z@w");
  EXPECT_EQ(shell_quote("a b"), "'a b'");
  EXPECT_EQ(shell_quote("it's"), "'it'\\''s'");
  EXPECT_EQ(shell_quote(""), "''");
  EXPECT_EQ(shell_quote("$(rm -rf /)"), "'$(rm -rf /)'");
}

TEST(launch_spec, templates_name_unknown_placeholders) {
  auto ok = expand_template("ssh -p 22 {host} {command}", {{"host", "h"}, {"command", "c"}});
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, "ssh -p 22 h c");
  auto bad = expand_template("ssh {hots} {command}", {{"host", "h"}, {"command", "c"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(contains(bad.err().message, "unknown placeholder {hots} (known: {host}, {command})")) << bad.err().message;
  EXPECT_FALSE(expand_template("ssh {host", {{"host", "h"}}).ok());
}

TEST(launch_spec, local_workers_without_an_address_bind_the_default_one) {
  auto ls = settings(launch_method::local);
  std::vector<worker_site> sites(2);
  sites[0].address.clear();  // as `serve` makes them
  sites[1].address.clear();
  auto plain = worker_processes(ls, sites, "t");
  ASSERT_TRUE(plain.ok()) << plain.err().message;
  EXPECT_EQ(std::count((*plain)[0].argv.begin(), (*plain)[0].argv.end(), "--address"), 0);
  ls.default_address = "10.0.0.1";
  auto bound = worker_processes(ls, sites, "t");
  ASSERT_TRUE(bound.ok()) << bound.err().message;
  for (const auto& p : *bound) {
    auto it = std::find(p.argv.begin(), p.argv.end(), "--address");
    ASSERT_NE(it, p.argv.end());
    EXPECT_EQ(*(it + 1), "10.0.0.1");
  }
  EXPECT_EQ((*bound)[1].label, "stage 1");  // labels still say only the stage
}

TEST(launch_spec, local_workers_get_the_token_in_their_environment) {
  auto ps = worker_processes(settings(launch_method::local), two_hosts(), "s3cret");
  ASSERT_TRUE(ps.ok()) << ps.err().message;
  ASSERT_EQ(ps->size(), 2u);
  const auto& p = (*ps)[1];
  EXPECT_EQ(p.argv, (std::vector<std::string>{"/opt/conveyor/bin/conveyor", "worker", "--stage", "1", "--address",
                                              "10.0.0.2", "--coordinator", "10.0.0.1:7700", "--threads", "0",
                                              "--join-timeout", "120"}));
  EXPECT_EQ(p.env, (std::vector<std::string>{"CONVEYOR_CLUSTER_TOKEN=s3cret", "CONVEYOR_EXIT_WITH_PARENT=1",
                                             "CUDA_VISIBLE_DEVICES=2,3"}));
  EXPECT_TRUE(p.stdin_text.empty());
  EXPECT_EQ(p.label, "host node-b (10.0.0.2) stage 1");
}

TEST(launch_spec, ssh_runs_the_template_and_sends_the_token_on_stdin) {
  auto ls = settings(launch_method::ssh);
  ls.ssh_template = "ssh -o BatchMode=yes {host} {command}";
  auto ps = worker_processes(ls, two_hosts(), "s3cret");
  ASSERT_TRUE(ps.ok()) << ps.err().message;
  const auto& p = (*ps)[0];
  ASSERT_EQ(p.argv.size(), 3u);
  EXPECT_EQ(p.argv[0], "/bin/sh");
  EXPECT_EQ(p.argv[1], "-c");
  EXPECT_EQ(p.argv[2],
            "ssh -o BatchMode=yes 10.0.0.1 'env CUDA_VISIBLE_DEVICES=0,1 /opt/conveyor/bin/conveyor worker --stage 0 "
            "--address 10.0.0.1 --token-stdin --coordinator 10.0.0.1:7700 --threads 0 --join-timeout 120'");
  EXPECT_EQ(p.stdin_text, "s3cret\n");
  for (const auto& e : p.env) EXPECT_FALSE(contains(e, "s3cret"));
  EXPECT_FALSE(contains(p.argv[2], "s3cret"));
}

TEST(launch_spec, slurm_is_one_step_with_the_placement_and_the_token_in_its_environment) {
  auto ls = settings(launch_method::slurm);
  ls.srun_command = "srun --mpi=none";
  const std::vector<worker_site> sites{{"a", "10.0.0.1", "0"}, {"a", "10.0.0.1", "1"}, {"b", "10.0.0.2", "0"}};
  auto ps = worker_processes(ls, sites, "s3cret");
  ASSERT_TRUE(ps.ok()) << ps.err().message;
  ASSERT_EQ(ps->size(), 1u);
  const auto& p = ps->front();
  EXPECT_EQ(p.argv[2],
            "srun --mpi=none --ntasks=3 --nodes=2 --distribution=block --kill-on-bad-exit=1 "
            "/opt/conveyor/bin/conveyor worker --slurm --placement 'a@10.0.0.1/0;a@10.0.0.1/1;b@10.0.0.2/0' "
            "--coordinator 10.0.0.1:7700 --threads 0 --join-timeout 120");
  EXPECT_EQ(p.env, std::vector<std::string>{"CONVEYOR_CLUSTER_TOKEN=s3cret"});
  EXPECT_EQ(p.stages, (std::vector<int>{0, 1, 2}));
  // Two stages on each of two nodes: the same count everywhere, so srun is told it.
  auto even = worker_processes(ls, {sites[0], sites[1], {"b", "10.0.0.2", "0"}, {"b", "10.0.0.2", "1"}}, "t");
  ASSERT_TRUE(even.ok());
  EXPECT_TRUE(contains(even->front().argv[2], "--ntasks-per-node=2")) << even->front().argv[2];
}

TEST(launch_spec, the_placement_list_round_trips) {
  const std::vector<worker_site> sites{{"node-a", "10.0.0.1", "0,1,2,3"}, {"cpu-box", "box.example", ""}};
  const auto text = encode_sites(sites);
  EXPECT_EQ(text, "node-a@10.0.0.1/0,1,2,3;cpu-box@box.example");
  auto back = decode_sites(text);
  ASSERT_TRUE(back.ok()) << back.err().message;
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ((*back)[0].visible_devices, "0,1,2,3");
  EXPECT_EQ((*back)[1].address, "box.example");
  auto bad = decode_sites("a@1.2.3.4;oops");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(contains(bad.err().message, "entry 1 \"oops\"")) << bad.err().message;
}

// The quoting must survive a real shell on "the far side": the template below runs {command} with
// `sh -c`, as ssh does, and the arguments arrive unchanged even in a path with spaces and quotes.
TEST(launch_spec, a_shell_on_the_far_side_gets_the_arguments_back) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("conveyor launch spec " + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path tool = dir / "it's args";
  {
    std::ofstream s(tool);
    s << "#!/bin/sh\nfor a in \"$@\"; do printf '[%s]\\n' \"$a\"; done\nprintf 'token=' ; head -n 1\n";
  }
  fs::permissions(tool, fs::perms::owner_all);
  const fs::path out = dir / "out";
  auto ls = settings(launch_method::ssh);
  ls.executable = tool.string();
  ls.ssh_template = "sh -c {command} > " + shell_quote(out.string());
  auto ps = worker_processes(ls, {{"odd name", "127.0.0.1", ""}}, "tok en");
  ASSERT_TRUE(ps.ok()) << ps.err().message;
  {
    worker_launcher launcher(tool.string());
    auto pid = launcher.launch(ps->front());
    ASSERT_TRUE(pid.ok()) << pid.err().message;
    std::optional<worker_launcher::exit_report> ended;
    for (int i = 0; i < 500 && !ended; ++i) {
      ended = launcher.poll_exit();
      if (!ended) usleep(10000);
    }
    ASSERT_TRUE(ended.has_value());
    EXPECT_EQ(ended->how, "exited with status 0");
  }
  std::ifstream in(out);
  std::stringstream got;
  got << in.rdbuf();
  EXPECT_EQ(got.str(),
            "[worker]\n[--stage]\n[0]\n[--address]\n[127.0.0.1]\n[--token-stdin]\n[--coordinator]\n[10.0.0.1:7700]\n"
            "[--threads]\n[0]\n[--join-timeout]\n[120]\ntoken=tok en\n");
  fs::remove_all(dir);
}

// Workers that size their KV cache from free memory split it with those on the same GPU.
TEST(launch_spec, gpu_sharers_counts_the_stages_on_each_gpu) {
  EXPECT_EQ(gpu_sharers({{"localhost", "", "0"}, {"localhost", "", "0"}}), (std::vector<int>{2, 2}));
  EXPECT_EQ(gpu_sharers({{"localhost", "", "0"}, {"localhost", "", "1"}}), (std::vector<int>{1, 1}));
  // tp 2: GPUs 0,1 and 1,2 overlap on 1; 3 is alone.
  EXPECT_EQ(gpu_sharers({{"h", "", "0,1"}, {"h", "", "1,2"}, {"h", "", "3"}}), (std::vector<int>{2, 2, 1}));
  // The same GPU number on another host is another GPU.
  EXPECT_EQ(gpu_sharers({{"w1", "10.0.0.2", "0"}, {"w2", "10.0.0.3", "0"}}), (std::vector<int>{1, 1}));
  // No list: the worker sees every GPU of its host.
  EXPECT_EQ(gpu_sharers({{"h", "", ""}, {"h", "", "2"}, {"g", "", ""}}), (std::vector<int>{2, 2, 1}));
  EXPECT_EQ(gpu_sharers({}), std::vector<int>{});
}

}  // namespace
}  // namespace conveyor::coordinator
