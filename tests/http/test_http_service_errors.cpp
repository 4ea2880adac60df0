// Errors the serving side decides (not the gateway): admission control's "overloaded" and a deadline
// the scheduler enforces reach an HTTP client as 503 + Retry-After and 504, in OpenAI's error shape,
// and are counted by kind on /metrics. Real HTTP over loopback against the in-process engine.
#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "http_test_util.hpp"

namespace conveyor::http {
namespace {

using json = nlohmann::json;

httplib::Client client_of(const testing::gateway_fixture& f) {
  httplib::Client c("127.0.0.1", f.gateway.server->port());
  c.set_read_timeout(60, 0);
  return c;
}

/// OpenAI's shape: {"error": {"message": str, "type": str, "param": null|str, "code": null|str}}.
void expect_openai_error(const std::string& body, const std::string& type, const std::string& code) {
  json e = json::parse(body, nullptr, false);
  ASSERT_TRUE(e.is_object() && e.contains("error")) << body;
  const auto& err = e["error"];
  EXPECT_EQ(err.size(), 4u) << body;
  EXPECT_TRUE(err["message"].is_string() && !err["message"].get<std::string>().empty()) << body;
  EXPECT_EQ(err["type"], type) << body;
  EXPECT_TRUE(err.contains("param")) << body;
  EXPECT_EQ(err["code"], code) << body;
}

std::map<std::string, double> scrape(httplib::Client& c) {
  auto r = c.Get("/metrics");
  EXPECT_TRUE(r);
  std::map<std::string, double> v;
  if (r) EXPECT_EQ(testing::check_prometheus(r->body, v), "") << r->body;
  return v;
}

// One sequence per step and job tickets on: while one request runs, the next cannot start at once,
// so the scheduler turns it away (errc::overloaded) — a server-wide cap, answered 503, not 429.
TEST(GatewayServiceErrors, ServiceOverloadIs503WithRetryAfter) {
  service::local_service_options so;
  so.max_seqs_per_step = 1;
  so.policy.use_job_ticket = true;
  so.step_delay_us = 2000;  // 400 steps hold the only slot for > 0.8 s
  auto f = testing::start_gateway(false, {}, so);
  auto c = client_of(*f);
  const auto before = scrape(c);
  auto long_one = std::async(std::launch::async, [&] {
    auto c2 = client_of(*f);
    return c2.Post("/v1/completions", json{{"prompt", {1}}, {"max_tokens", 400}, {"ignore_eos", true}}.dump(),
                   "application/json");
  });
  std::optional<httplib::Result> rejected;
  for (int i = 0; i < 200 && !rejected; ++i) {  // until the long one holds the slot
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    auto r = c.Post("/v1/completions", json{{"prompt", {1, 2}}, {"max_tokens", 1}}.dump(), "application/json");
    ASSERT_TRUE(r);
    if (r->status != 200) rejected.emplace(std::move(r));
  }
  ASSERT_TRUE(rejected.has_value()) << "no rejection while a request held the only batch slot";
  EXPECT_EQ((*rejected)->status, 503) << (*rejected)->body;
  EXPECT_EQ((*rejected)->get_header_value("Retry-After"), "1");
  EXPECT_EQ((*rejected)->get_header_value("Content-Type"), "application/json");
  expect_openai_error((*rejected)->body, "server_error", "overloaded");
  EXPECT_NE((*rejected)->body.find("use_job_ticket"), std::string::npos) << "the reason is named";
  // Streaming too: the status line waits for the first output, so the rejection is a 503, not 200
  // and an error event.
  auto streamed = c.Post("/v1/completions", json{{"prompt", {1, 2}}, {"max_tokens", 1}, {"stream", true}}.dump(),
                         "application/json");
  ASSERT_TRUE(streamed);
  EXPECT_EQ(streamed->status, 503) << streamed->body;
  EXPECT_EQ(streamed->get_header_value("Retry-After"), "1");
  expect_openai_error(streamed->body, "server_error", "overloaded");
  EXPECT_EQ(long_one.get()->status, 200) << "an accepted request is never dropped";
  const auto after = scrape(c);
  const std::string k = "conveyor_request_finish_total{reason=\"rejected_overloaded\"}";
  EXPECT_GE(after.count(k) ? after.at(k) : 0.0, (before.count(k) ? before.at(k) : 0.0) + 2);
}

// serving.response_timeout_s expires the request inside the scheduler (the gateway has no timeout of
// its own here): errc::deadline_exceeded is 504 with code "timeout", like the gateway's own deadline.
TEST(GatewayServiceErrors, ServiceDeadlineIs504) {
  service::local_service_options so;
  so.policy.response_timeout_s = 0.2;
  so.step_delay_us = 2000;  // 400 tokens take > 0.8 s
  auto f = testing::start_gateway(false, {}, so);
  auto c = client_of(*f);
  const auto before = scrape(c);
  auto r = c.Post("/v1/completions", json{{"prompt", {1}}, {"max_tokens", 400}, {"ignore_eos", true}}.dump(),
                  "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 504) << r->body;
  EXPECT_TRUE(r->get_header_value("Retry-After").empty());
  expect_openai_error(r->body, "server_error", "timeout");
  EXPECT_NE(r->body.find("deadline"), std::string::npos) << r->body;
  // Streaming: tokens came before the deadline passed, so the status line went out and the error is
  // an event.
  auto s = c.Post("/v1/completions",
                  json{{"prompt", {1}}, {"max_tokens", 400}, {"ignore_eos", true}, {"stream", true}}.dump(),
                  "application/json");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->status, 200);
  auto events = testing::sse_events(s->body);
  ASSERT_GE(events.size(), 2u) << s->body;
  EXPECT_EQ(events.back(), "[DONE]");
  expect_openai_error(events[events.size() - 2], "server_error", "timeout");
  const auto after = scrape(c);
  const std::string k = "conveyor_request_finish_total{reason=\"deadline\"}";
  EXPECT_EQ(after.count(k) ? after.at(k) : 0.0, (before.count(k) ? before.at(k) : 0.0) + 2);
}

}  // namespace
}  // namespace conveyor::http
