// Offline batch serving over the in-process service: results equal per-request generation, come
// out in input order with an error line for each bad line, survive an interrupted run, and no line
// is lost when admission control turns requests away.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "conveyor/service/batch_runner.hpp"
#include "conveyor/service/local_inference_service.hpp"
#include "scheduler_fixture.hpp"

namespace conveyor::service {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

class batch_runner_test : public ::testing::Test {
 protected:
  void SetUp() override {
    golden_ = conveyor::testing::load_golden("tiny-llama");
    dir_ = fs::temp_directory_path() / ("conveyor_batch_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    input_ = (dir_ / "prompts.jsonl").string();
    output_ = (dir_ / "results.jsonl").string();
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<inference_service> make_service(const serving_policy& policy = {}, int max_seqs = 8) {
    local_service_options o;
    o.threads = 1;
    o.max_seqs_per_step = max_seqs;
    o.policy = policy;
    auto svc = make_local_inference_service(golden_.dir, o);
    EXPECT_TRUE(svc.ok()) << svc.err().message;
    return std::move(svc).value();
  }

  /// `n` greedy requests cycling through the golden prompts, ids "r0", "r1", ...
  void write_input(int n, const std::vector<std::string>& extra = {}) {
    std::ofstream in(input_);
    for (int i = 0; i < n; ++i) {
      json line{{"id", "r" + std::to_string(i)},
                {"prompt_ids", golden_.prompts[i % 4].input_ids},
                {"max_tokens", 24},
                {"ignore_eos", true}};
      in << line.dump() << "\n";
    }
    for (const auto& e : extra) in << e << "\n";
  }

  std::vector<json> read_output() {
    std::ifstream out(output_);
    std::vector<json> lines;
    std::string text;
    while (std::getline(out, text)) lines.push_back(json::parse(text));
    return lines;
  }

  conveyor::testing::golden_fixture golden_;
  fs::path dir_;
  std::string input_, output_;
};

TEST_F(batch_runner_test, results_come_in_input_order_with_bad_lines_reported) {
  write_input(10, {R"({"id": "bad-json", )", R"({"id": "no-prompt", "max_tokens": 3})",
                   R"({"id": "typo", "prompt_ids": [1, 2], "max_tokns": 3})",
                   R"({"id": "text", "prompt": "hello"})", R"({"id": "range", "prompt_ids": [99999]})", "",
                   R"({"id": "r0", "prompt_ids": [1]})"});
  auto svc = make_service();
  int progress_calls = 0;
  batch_options o;
  o.window = 4;
  o.on_progress = [&](const batch_progress&) { ++progress_calls; };
  auto p = run_batch(*svc, input_, output_, o);
  ASSERT_TRUE(p.ok()) << p.err().message;
  EXPECT_EQ(p->total, 16);
  EXPECT_EQ(p->done, 16);
  EXPECT_EQ(p->errors, 6);
  EXPECT_EQ(p->tokens, 10 * 24);
  EXPECT_GT(progress_calls, 0);
  auto lines = read_output();
  ASSERT_EQ(lines.size(), 16u);
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(lines[i]["id"], "r" + std::to_string(i));
    EXPECT_EQ(lines[i]["tokens"].get<std::vector<std::int32_t>>(), golden_.prompts[i % 4].greedy) << "line " << i;
    EXPECT_EQ(lines[i]["finish_reason"], "length");
    EXPECT_EQ(lines[i]["completion_tokens"], 24);
  }
  auto error_of = [&](int i) { return lines[i]["error"]["message"].get<std::string>(); };
  EXPECT_EQ(lines[10]["id"], 11) << "unparsable: the line number stands in for the id";
  EXPECT_NE(error_of(10).find("line 11: not a JSON object"), std::string::npos) << error_of(10);
  EXPECT_NE(error_of(11).find("no prompt"), std::string::npos) << error_of(11);
  EXPECT_NE(error_of(12).find("unknown key \"max_tokns\""), std::string::npos) << error_of(12);
  EXPECT_NE(error_of(13).find("no tokenizer"), std::string::npos) << error_of(13);
  EXPECT_EQ(lines[14]["error"]["code"], "invalid_argument") << "the service's own check";
  EXPECT_NE(error_of(14).find("vocabulary"), std::string::npos) << error_of(14);
  EXPECT_NE(error_of(15).find("already used by line 1"), std::string::npos) << error_of(15);
}

TEST_F(batch_runner_test, a_rerun_skips_finished_ids_and_completes_the_rest) {
  write_input(8);
  {
    auto svc = make_service();
    ASSERT_TRUE(run_batch(*svc, input_, output_, {}).ok());
  }
  const auto full = read_output();
  // An interrupted run: the first 3 results, then half of the 4th line.
  {
    std::ifstream in(output_);
    std::stringstream kept;
    std::string line;
    for (int i = 0; i < 3 && std::getline(in, line); ++i) kept << line << "\n";
    std::getline(in, line);
    kept << line.substr(0, line.size() / 2);
    std::ofstream(output_, std::ios::trunc) << kept.str();
  }
  auto svc = make_service();
  auto p = run_batch(*svc, input_, output_, {});
  ASSERT_TRUE(p.ok()) << p.err().message;
  EXPECT_EQ(p->skipped, 3);
  EXPECT_EQ(p->done, 5);
  auto resumed = read_output();
  ASSERT_EQ(resumed.size(), full.size());
  for (std::size_t i = 0; i < full.size(); ++i) {
    EXPECT_EQ(resumed[i]["id"], full[i]["id"]);
    EXPECT_EQ(resumed[i]["tokens"], full[i]["tokens"]);
  }
  // Nothing left: a third run does nothing.
  auto again = run_batch(*svc, input_, output_, {});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->skipped, 8);
  EXPECT_EQ(again->done, 0);
  EXPECT_EQ(read_output().size(), 8u);
}

TEST_F(batch_runner_test, overloaded_lines_are_retried_not_dropped) {
  write_input(12);
  serving_policy policy;
  policy.use_job_ticket = true;  // with 2 slots, most submissions of a window of 8 are turned away
  auto svc = make_service(policy, 2);
  batch_options o;
  o.window = 8;
  o.overload_backoff_s = 0.005;
  auto p = run_batch(*svc, input_, output_, o);
  ASSERT_TRUE(p.ok()) << p.err().message;
  EXPECT_EQ(p->errors, 0);
  EXPECT_GT(p->retries, 0);
  auto lines = read_output();
  ASSERT_EQ(lines.size(), 12u);
  for (int i = 0; i < 12; ++i) {
    EXPECT_EQ(lines[i]["tokens"].get<std::vector<std::int32_t>>(), golden_.prompts[i % 4].greedy) << "line " << i;
  }
}

TEST_F(batch_runner_test, a_static_batch_tail_is_flushed) {
  write_input(5);  // batches of 4: the fifth request never fills a batch
  serving_policy policy;
  policy.batching = batching_mode::fixed;
  auto svc = make_service(policy, 4);
  auto p = run_batch(*svc, input_, output_, {});
  ASSERT_TRUE(p.ok()) << p.err().message;
  EXPECT_EQ(p->errors, 0);
  EXPECT_EQ(read_output().size(), 5u);
}

TEST_F(batch_runner_test, file_errors_are_errors) {
  auto svc = make_service();
  EXPECT_EQ(run_batch(*svc, (dir_ / "missing.jsonl").string(), output_, {}).err().code, errc::not_found);
  write_input(1);
  std::ofstream(output_) << "not a result line\n";
  auto r = run_batch(*svc, input_, output_, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.err().message.find("refusing to append"), std::string::npos) << r.err().message;
}

}  // namespace
}  // namespace conveyor::service
