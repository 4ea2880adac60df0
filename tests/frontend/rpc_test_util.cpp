#include "rpc_test_util.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "conveyor/service/local_inference_service.hpp"

namespace conveyor::testing {

std::string fixture_path(const std::string& fixture) { return std::string(CONVEYOR_FIXTURES) + "/" + fixture; }

std::vector<std::string> fixture_list() {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(CONVEYOR_FIXTURES)) {
    if (std::filesystem::exists(e.path() / "golden.json")) names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<golden_case> load_golden_json(const std::string& fixture) {
  std::ifstream in(fixture_path(fixture) + "/golden.json");
  const auto doc = nlohmann::json::parse(in);
  std::vector<golden_case> out;
  for (const auto& p : doc.at("prompts")) {
    out.push_back({p.at("input_ids").get<std::vector<std::int32_t>>(), p.at("greedy").get<std::vector<std::int32_t>>()});
  }
  return out;
}

local_server::~local_server() {
  if (server) server->stop();  // before the service: the server's calls hold the service's sinks
  server.reset();
  service.reset();
}

std::unique_ptr<local_server> start_local_server(const std::string& fixture, frontend::rpc_server_options options,
                                                int stages) {
  service::local_service_options so;
  so.stages = stages;
  so.threads = 1;  // the build machine is shared; tiny models don't need more
  return start_local_server(fixture, std::move(options), so);
}

std::unique_ptr<local_server> start_local_server(const std::string& fixture, frontend::rpc_server_options options,
                                                service::local_service_options so) {
  auto svc = service::make_local_inference_service(fixture_path(fixture), so);
  if (!svc) {
    ADD_FAILURE() << "local service for " << fixture << ": " << svc.err().message;
    return nullptr;
  }
  auto s = std::make_unique<local_server>();
  s->service = std::move(*svc);
  auto server = frontend::start_rpc_server(*s->service, options);
  if (!server) {
    ADD_FAILURE() << "rpc server: " << server.err().message;
    return nullptr;
  }
  s->server = std::move(*server);
  return s;
}

std::unique_ptr<client::connection> connect_or_die(const std::string& address, client::connect_options options) {
  auto c = client::connect(address, options);
  if (!c) {
    ADD_FAILURE() << "connect " << address << ": " << c.err().message;
    return nullptr;
  }
  return std::move(*c);
}

generation_result run_generate(client::connection& c, const client::generate_request& request) {
  generation_result r;
  r.summary = c.generate(request, [&](std::span<const std::int32_t> ids) {
    r.tokens.insert(r.tokens.end(), ids.begin(), ids.end());
    ++r.batches;
    return true;
  });
  return r;
}

bool eventually(const std::function<bool()>& pred, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pred();
}

// ---- scripted_service ----

scripted_service::scripted_service(std::chrono::microseconds delay) : delay_(delay), thread_([this] { loop(); }) {}

scripted_service::~scripted_service() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::uint64_t scripted_service::submit(service::generate_request request, std::shared_ptr<service::token_sink> sink) {
  std::lock_guard lock(mu_);
  const auto id = next_id_++;
  jobs_.push_back({id, std::move(request), std::move(sink)});
  cv_.notify_all();
  return id;
}

void scripted_service::cancel(std::uint64_t id) {
  std::lock_guard lock(mu_);
  cancels_.push_back(id);
}

void scripted_service::health(std::function<void(service::health_report)> reply) {
  reply({true, {{0, 0, "ready", "scripted"}}});
}

void scripted_service::stats(std::function<void(service::stats_report)> reply) {
  service::stats_report s;
  s.requests_running = running.load();
  reply(s);
}

service::model_info scripted_service::info() const {
  return {"scripted", "none", 1000, 1, 1, 1, 1, 1, 0};
}

void scripted_service::loop() {
  for (;;) {
    job j;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (stopping_) {
        for (auto& q : jobs_) q.sink->on_done(make_error(errc::internal, "scripted service stopped"));
        return;
      }
      j = std::move(jobs_.front());
      jobs_.pop_front();
    }
    ++running;
    const auto start = std::chrono::steady_clock::now();
    bool was_cancelled = false;
    int i = 0;
    for (; i < j.request.max_new_tokens; ++i) {
      {
        std::lock_guard lock(mu_);
        if (std::find(cancels_.begin(), cancels_.end(), j.id) != cancels_.end() || stopping_) {
          was_cancelled = true;
          break;
        }
      }
      const std::int32_t id = i % 1000;
      j.sink->on_tokens(std::span<const std::int32_t>(&id, 1));
      if (delay_.count() > 0) std::this_thread::sleep_for(delay_);
    }
    --running;
    if (was_cancelled) ++cancelled;
    service::generate_summary s;
    s.prompt_tokens = static_cast<int>(j.request.prompt.size());
    s.completion_tokens = i;
    s.finish_reason = was_cancelled ? "cancelled" : "length";
    s.total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    j.sink->on_done(s);
  }
}

}  // namespace conveyor::testing
