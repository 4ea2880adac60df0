#pragma once
// Helpers of the RPC frontend tests: a real server over the in-process engine on 127.0.0.1 (port 0),
// fixtures' golden prompts, and a scripted service for streaming and cancellation without a model.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "conveyor/client/client.hpp"
#include "conveyor/frontend/rpc_server.hpp"
#include "conveyor/service/inference_service.hpp"
#include "conveyor/service/local_inference_service.hpp"

namespace conveyor::testing {

struct golden_case {
  std::vector<std::int32_t> prompt;
  std::vector<std::int32_t> greedy;  ///< HF's 24 greedy tokens
};

/// tests/fixtures/NAME/golden.json's prompts.
std::vector<golden_case> load_golden_json(const std::string& fixture);
std::string fixture_path(const std::string& fixture);
std::vector<std::string> fixture_list();

/// A local_inference_service over a fixture and an rpc_server in front of it.
struct local_server {
  std::unique_ptr<service::inference_service> service;
  std::unique_ptr<frontend::rpc_server> server;
  std::string address() const { return server->address(); }
  ~local_server();
};
std::unique_ptr<local_server> start_local_server(const std::string& fixture, frontend::rpc_server_options options = {},
                                                int stages = 1);
/// The same over a service with these options (serving policy, KV pool, batch size).
std::unique_ptr<local_server> start_local_server(const std::string& fixture, frontend::rpc_server_options options,
                                                service::local_service_options service_options);

/// Connects or fails the test.
std::unique_ptr<client::connection> connect_or_die(const std::string& address, client::connect_options options = {});

/// Tokens and outcome of one generate through the client.
struct generation_result {
  std::vector<std::int32_t> tokens;
  int batches = 0;
  result<client::generate_summary> summary = make_error(errc::internal, "not run");
};
generation_result run_generate(client::connection& c, const client::generate_request& request);

/// Polls `pred` until it holds or `timeout` passes; returns whether it held.
bool eventually(const std::function<bool()>& pred, std::chrono::milliseconds timeout = std::chrono::seconds(10));

/// A service without a model: each request streams `max_new_tokens` ids (i % 1000, one per
/// on_tokens call, as fast as possible, or `delay` apart) from one worker thread, and counts cancels.
/// health() and stats() reply on the caller's thread (the frontend must cope with that too).
class scripted_service final : public service::inference_service {
 public:
  explicit scripted_service(std::chrono::microseconds delay = {});
  ~scripted_service() override;
  std::uint64_t submit(service::generate_request request, std::shared_ptr<service::token_sink> sink) override;
  void cancel(std::uint64_t id) override;
  void health(std::function<void(service::health_report)> reply) override;
  void stats(std::function<void(service::stats_report)> reply) override;
  service::model_info info() const override;

  std::atomic<int> cancelled{0};  ///< requests that ended because of cancel()
  std::atomic<int> running{0};

 private:
  struct job {
    std::uint64_t id;
    service::generate_request request;
    std::shared_ptr<service::token_sink> sink;
  };
  void loop();

  std::chrono::microseconds delay_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<job> jobs_;
  std::vector<std::uint64_t> cancels_;
  std::uint64_t next_id_ = 1;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace conveyor::testing
