// Stage-failure recovery against real processes: kill -9 a stage worker mid-generation and the
// coordinator notices, restarts that stage alone, rewires its neighbours, re-prefills the running
// requests, and every request ends with the tokens of a run without the fault. Also: a stage that
// keeps dying is given up on, and strangers on the cluster port cannot end steps or the cluster.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "cluster_fixture.hpp"

namespace conveyor::coordinator {
namespace {

using clock = std::chrono::steady_clock;

service::health_report health_of(service::inference_service& svc) {
  auto p = std::make_shared<std::promise<service::health_report>>();
  auto f = p->get_future();
  svc.health([p](service::health_report h) { p->set_value(std::move(h)); });
  return f.get();
}

/// Polls health until `want` holds for it; the time that took, or nullopt after `limit_s`.
template <class Pred>
std::optional<double> seconds_until(service::inference_service& svc, Pred want, double limit_s) {
  const auto t0 = clock::now();
  while (std::chrono::duration<double>(clock::now() - t0).count() < limit_s) {
    if (want(health_of(svc))) return std::chrono::duration<double>(clock::now() - t0).count();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return std::nullopt;
}

/// Every golden prompt, twice, streaming; the per-step delay keeps them running long enough to be
/// caught mid-generation.
struct load {
  std::vector<std::shared_ptr<collecting_sink>> sinks;
  std::vector<std::vector<std::int32_t>> expected;
  load(service::inference_service& svc, const testing::golden_fixture& golden) {
    for (int rep = 0; rep < 2; ++rep) {
      for (const auto& p : golden.prompts) {
        sinks.push_back(std::make_shared<collecting_sink>());
        expected.push_back(p.greedy);
        svc.submit(greedy(p), sinks.back());
      }
    }
  }
};

/// One request of 400 tokens: with a per-step delay it is still running when a stage is killed.
std::shared_ptr<collecting_sink> long_request(service::inference_service& svc) {
  service::generate_request r;
  r.prompt = {1, 2, 3};
  r.max_new_tokens = 400;
  r.ignore_eos = true;
  auto sink = std::make_shared<collecting_sink>();
  svc.submit(r, sink);
  return sink;
}

/// Which stage dies, and the UCX transports between stages.
struct fault {
  int victim;
  const char* tls;
};
class stage_recovery_of : public ::testing::TestWithParam<fault> {};

// Stage 0 (gets the steps), 1 (the middle: both neighbours reconnect) and 2 (samples the tokens);
// over tcp, where a dead peer's socket closes, and "auto" (shared memory on one host), where the
// neighbours only learn it from the channel's peer timeout.
TEST_P(stage_recovery_of, killed_stage_is_restarted_and_requests_finish_unchanged) {
  const int victim = GetParam().victim;
  const auto golden = testing::load_golden("tiny-llama");
  auto o = base_options("tiny-llama", 3);
  o.ucx_tls = GetParam().tls;
  o.step_delay_us = 20000;
  auto c = cluster::start(o);
  ASSERT_TRUE(c.ok()) << c.err().message;
  auto& svc = (*c)->service();
  load l(svc, golden);
  ASSERT_TRUE(l.sinks[0]->wait_tokens(3)) << "no tokens before the fault";
  ASSERT_FALSE(l.sinks[0]->done.has_value());
  const int old_pid = (*c)->worker_pids()[victim];
  ASSERT_EQ(::kill(old_pid, SIGKILL), 0);
  // Noticed: /ready (and RPC health) turn false, the stage restarting.
  auto noticed = seconds_until(svc, [](const service::health_report& h) { return !h.ready; }, 5.0);
  ASSERT_TRUE(noticed.has_value()) << "the coordinator did not notice the dead stage within 5 s";
  EXPECT_LT(*noticed, 2.0);
  RecordProperty("failure_noticed_s", std::to_string(*noticed));
  std::printf("dead stage noticed after %.3f s\n", *noticed);
  auto back = seconds_until(svc, [](const service::health_report& h) { return h.ready; }, 60.0);
  ASSERT_TRUE(back.has_value()) << "stage " << victim << " did not come back";
  RecordProperty("recovered_after_s", std::to_string(*noticed + *back));
  for (std::size_t i = 0; i < l.sinks.size(); ++i) {
    ASSERT_TRUE(l.sinks[i]->wait(60)) << "request " << i << " hung after the restart";
    ASSERT_TRUE(l.sinks[i]->done->ok()) << "request " << i << ": " << l.sinks[i]->done->err().message;
    EXPECT_EQ(l.sinks[i]->tokens, l.expected[i]) << "request " << i;
  }
  const auto pids = (*c)->worker_pids();
  EXPECT_NE(pids[victim], old_pid) << "stage " << victim << " has no new process";
  EXPECT_EQ(::kill(pids[victim], 0), 0) << "the new process is not running";
  const auto h = health_of(svc);
  EXPECT_TRUE(h.ready);
  ASSERT_EQ(h.stages.size(), 3u);
  EXPECT_NE(h.stages[victim].detail.find("restarted 1 time"), std::string::npos) << h.stages[victim].detail;
  const auto st = stats_of(svc);
  EXPECT_EQ(st.kv_blocks_free, st.kv_blocks_total);
  // And it keeps serving.
  auto after = std::make_shared<collecting_sink>();
  svc.submit(greedy(golden.prompts[0]), after);
  ASSERT_TRUE(after->wait());
  ASSERT_TRUE(after->done->ok()) << after->done->err().message;
  EXPECT_EQ(after->tokens, golden.prompts[0].greedy);
}

INSTANTIATE_TEST_SUITE_P(stage, stage_recovery_of,
                         ::testing::Values(fault{0, "tcp"}, fault{1, "tcp"}, fault{1, "auto"}, fault{2, "tcp"}),
                         [](const ::testing::TestParamInfo<fault>& i) {
                           return "stage" + std::to_string(i.param.victim) + "_" + i.param.tls;
                         });

// A worker that stops answering (SIGSTOP: its connections stay open, nothing closes) is declared
// dead after heartbeat_timeout, its process killed, and the stage replaced like a dead one.
TEST(stage_recovery, hung_stage_is_replaced_after_the_heartbeat_timeout) {
  const auto golden = testing::load_golden("tiny-llama");
  auto o = base_options("tiny-llama", 2);
  o.step_delay_us = 20000;
  o.heartbeat = std::chrono::milliseconds(200);
  o.heartbeat_timeout = std::chrono::milliseconds(800);
  auto c = cluster::start(o);
  ASSERT_TRUE(c.ok()) << c.err().message;
  auto& svc = (*c)->service();
  auto sink = std::make_shared<collecting_sink>();
  svc.submit(greedy(golden.prompts[1]), sink);
  ASSERT_TRUE(sink->wait_tokens(2));
  const int hung = (*c)->worker_pids()[1];
  ASSERT_EQ(::kill(hung, SIGSTOP), 0);
  auto noticed = seconds_until(svc, [](const service::health_report& h) { return !h.ready; }, 5.0);
  ASSERT_TRUE(noticed.has_value());
  EXPECT_LT(*noticed, 0.8 + 0.2 + 0.5) << "the bound is heartbeat_timeout + one interval (+ slack)";
  std::printf("hung stage noticed after %.3f s (heartbeat 0.2 s, timeout 0.8 s)\n", *noticed);
  ASSERT_TRUE(sink->wait(60)) << "request hung";
  ASSERT_TRUE(sink->done->ok()) << sink->done->err().message;
  EXPECT_EQ(sink->tokens, golden.prompts[1].greedy);
  EXPECT_NE((*c)->worker_pids()[1], hung);
  // The stopped process was killed, not left behind.
  for (int i = 0; i < 100 && ::kill(hung, 0) == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::ifstream stat("/proc/" + std::to_string(hung) + "/stat");
  std::string pid, comm, state;
  stat >> pid >> comm >> state;
  EXPECT_TRUE(!stat || state == "Z") << "the hung worker still runs (state " << state << ")";
}

// The last stage (the one that samples) dies twice with cluster.max_stage_restarts = 1: the first
// time it comes back, the second time the cluster gives up, naming the stage, and requests fail at
// once instead of hanging.
TEST(stage_recovery, stage_that_keeps_dying_is_given_up_on) {
  auto o = base_options("tiny-llama", 2);
  o.step_delay_us = 20000;
  o.max_stage_restarts = 1;
  auto c = cluster::start(o);
  ASSERT_TRUE(c.ok()) << c.err().message;
  auto& svc = (*c)->service();
  auto sink = long_request(svc);
  ASSERT_TRUE(sink->wait_tokens(2));
  ::kill((*c)->worker_pids()[1], SIGKILL);
  ASSERT_TRUE(seconds_until(svc, [](const service::health_report& h) { return !h.ready; }, 5.0));
  ASSERT_TRUE(seconds_until(svc, [](const service::health_report& h) { return h.ready; }, 60.0));
  const std::size_t had = sink->tokens.size();
  ASSERT_TRUE(sink->wait_tokens(had + 2)) << "the request did not carry on after the restart";
  ASSERT_FALSE(sink->done.has_value());
  const auto t0 = clock::now();
  ::kill((*c)->worker_pids()[1], SIGKILL);
  ASSERT_TRUE(sink->wait(10)) << "request hung after the stage was given up on";
  EXPECT_LT(std::chrono::duration<double>(clock::now() - t0).count(), 2.0);
  ASSERT_FALSE(sink->done->ok());
  const auto& why = sink->done->err().message;
  EXPECT_NE(why.find("stage 1"), std::string::npos) << why;
  EXPECT_NE(why.find("giving up on it after 1 restarts"), std::string::npos) << why;
  EXPECT_FALSE(health_of(svc).ready);
}

// A replacement that dies before it joins (here the worker binary was swapped for a script that exits
// 3) is a failed restart at once, not after serving.startup_timeout_s (60 s here): with
// max_stage_restarts = 2 the cluster gives up after two such tries within a few heartbeats, naming
// the stage and how its process ended.
TEST(stage_recovery, replacement_that_never_joins_is_a_failed_restart) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("conveyor-broken-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path exe = dir / "conveyor";
  fs::copy_file(CONVEYOR_BINARY, exe, fs::copy_options::overwrite_existing);
  auto o = base_options("tiny-llama", 2);
  o.executable = exe.string();
  o.step_delay_us = 20000;
  o.max_stage_restarts = 2;
  {
    auto c = cluster::start(o);
    ASSERT_TRUE(c.ok()) << c.err().message;
    auto& svc = (*c)->service();
    auto sink = long_request(svc);
    ASSERT_TRUE(sink->wait_tokens(2));
    fs::remove(exe);  // the running workers keep their image; a new one gets the script
    {
      std::ofstream f(exe);
      f << "#!/bin/sh\necho 'conveyor: broken on purpose by the test' >&2\nexit 3\n";
    }
    fs::permissions(exe, fs::perms::owner_all);
    const auto t0 = clock::now();
    ::kill((*c)->worker_pids()[1], SIGKILL);
    ASSERT_TRUE(sink->wait(30)) << "request hung while the replacement never joined";
    const double took = std::chrono::duration<double>(clock::now() - t0).count();
    EXPECT_LT(took, 15.0) << "waited for the start-up timeout instead of noticing the exit";
    ASSERT_FALSE(sink->done->ok());
    const auto& why = sink->done->err().message;
    EXPECT_NE(why.find("stage 1"), std::string::npos) << why;
    EXPECT_NE(why.find("exited with status 3 before it joined"), std::string::npos) << why;
    EXPECT_NE(why.find("giving up on it after 2 restarts"), std::string::npos) << why;
    EXPECT_FALSE(health_of(svc).ready);
  }
  fs::remove_all(dir);
}

// transport.max_frame_bytes reaches the workers: a prompt whose activations (tokens x 128 floats)
// are over 4096 bytes is refused by the sending stage, a short one is served.
TEST(stage_recovery, max_frame_bytes_reaches_the_workers) {
  auto o = base_options("tiny-llama", 2);
  o.max_frame_bytes = 4096;
  auto c = cluster::start(o);  // the canary is one token: 512 bytes
  ASSERT_TRUE(c.ok()) << c.err().message;
  service::generate_request r;
  r.prompt.assign(20, 5);  // 20 x 128 x 4 = 10240 bytes
  r.max_new_tokens = 2;
  auto big = std::make_shared<collecting_sink>();
  (*c)->service().submit(r, big);
  ASSERT_TRUE(big->wait(30));
  ASSERT_FALSE(big->done->ok());
  EXPECT_NE(big->done->err().message.find("over the limit of 4096"), std::string::npos) << big->done->err().message;
  r.prompt.assign(3, 5);
  auto small = std::make_shared<collecting_sink>();
  (*c)->service().submit(r, small);
  ASSERT_TRUE(small->wait(30));
  EXPECT_TRUE(small->done->ok()) << small->done->err().message;
}

/// The coordinator's CAF address, from a worker's command line (--coordinator HOST:PORT).
std::pair<std::string, std::uint16_t> coordinator_address(int worker_pid) {
  std::ifstream f("/proc/" + std::to_string(worker_pid) + "/cmdline");
  std::string all((std::istreambuf_iterator<char>(f)), {});
  std::vector<std::string> args;
  for (std::size_t at = 0; at < all.size();) {
    const auto end = all.find('\0', at);
    args.push_back(all.substr(at, end - at));
    at = end == std::string::npos ? all.size() : end + 1;
  }
  for (std::size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] != "--coordinator") continue;
    const auto colon = args[i + 1].rfind(':');
    return {args[i + 1].substr(0, colon), static_cast<std::uint16_t>(std::stoi(args[i + 1].substr(colon + 1)))};
  }
  return {};
}

// Anyone who reaches the cluster port may send messages; only the joined worker of a stage may end
// a step or report a broken stage, and only the cluster's owner may shut it down.
TEST(stage_recovery, strangers_cannot_end_steps_or_stop_the_cluster) {
  const auto golden = testing::load_golden("tiny-llama");
  auto o = base_options("tiny-llama", 2);
  o.step_delay_us = 20000;
  o.recover_stages = false;  // so that a believed stage failure would take the cluster down
  auto c = cluster::start(o);
  ASSERT_TRUE(c.ok()) << c.err().message;
  auto [host, port] = coordinator_address((*c)->worker_pids()[0]);
  ASSERT_NE(port, 0);
  auto sink = std::make_shared<collecting_sink>();
  (*c)->service().submit(greedy(golden.prompts[0]), sink);
  ASSERT_TRUE(sink->wait_tokens(1));
  const std::string cmd = std::string(CONVEYOR_STRANGER) + " " + host + " " + std::to_string(port);
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  ASSERT_TRUE(sink->wait());
  ASSERT_TRUE(sink->done->ok()) << sink->done->err().message;
  EXPECT_EQ(sink->tokens, golden.prompts[0].greedy);
  EXPECT_TRUE(health_of((*c)->service()).ready);
}

}  // namespace
}  // namespace conveyor::coordinator
