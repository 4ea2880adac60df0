// Real HTTP over loopback (cpp-httplib's client) against the gateway in front of the in-process engine
// on the tiny-llama fixture: HF's greedy tokens through /v1/completions, SSE chunks that assemble to
// the same result, text and chat through a tokenizer, OpenAI error shapes and status codes, and a
// /metrics page that parses as Prometheus text and moves with traffic.
#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "http_test_util.hpp"

namespace conveyor::http {
namespace {

using json = nlohmann::json;
using testing::sse_events;
using testing::start_gateway;

httplib::Client client_of(const testing::gateway_fixture& f) {
  httplib::Client c("127.0.0.1", f.gateway.server->port());
  c.set_read_timeout(60, 0);
  return c;
}

json post(httplib::Client& c, const std::string& path, const json& body, int expect_status) {
  auto r = c.Post(path.c_str(), body.dump(), "application/json");
  EXPECT_TRUE(r) << "no response from " << path;
  if (!r) return {};
  EXPECT_EQ(r->status, expect_status) << r->body;
  return json::parse(r->body, nullptr, false);
}

class Gateway : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { fixture_ = start_gateway(true).release(); }
  static void TearDownTestSuite() { delete fixture_; }
  static testing::gateway_fixture* fixture_;
};
testing::gateway_fixture* Gateway::fixture_ = nullptr;

TEST_F(Gateway, CompletionsByIdsReproduceHfGreedyTokens) {
  auto c = client_of(*fixture_);
  for (const auto& g : testing::tiny_llama_goldens()) {
    json r = post(c, "/v1/completions",
                  {{"model", "tiny-llama"}, {"prompt", g.prompt}, {"max_tokens", 24}, {"temperature", 0}, {"ignore_eos", true}},
                  200);
    EXPECT_EQ(r["object"], "text_completion");
    EXPECT_EQ(r["choices"][0]["token_ids"].get<std::vector<std::int32_t>>(), g.greedy);
    EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
    EXPECT_EQ(r["usage"]["prompt_tokens"], g.prompt.size());
    EXPECT_EQ(r["usage"]["completion_tokens"], 24);
    EXPECT_EQ(r["usage"]["total_tokens"], g.prompt.size() + 24);
  }
}

TEST_F(Gateway, StreamedChunksAssembleToTheSameTokens) {
  auto c = client_of(*fixture_);
  const auto g = testing::tiny_llama_goldens()[1];
  auto r = c.Post("/v1/completions",
                  json{{"prompt", g.prompt}, {"max_tokens", 24}, {"temperature", 0}, {"ignore_eos", true},
                       {"stream", true}, {"stream_options", {{"include_usage", true}}}}
                      .dump(),
                  "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
  auto events = sse_events(r->body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::vector<std::int32_t> ids;
  std::string finish;
  for (std::size_t i = 0; i + 1 < events.size(); ++i) {
    json e = json::parse(events[i]);
    if (e["choices"].empty()) {  // the usage chunk
      EXPECT_EQ(e["usage"]["completion_tokens"], 24);
      continue;
    }
    for (auto id : e["choices"][0]["token_ids"]) ids.push_back(id);
    if (!e["choices"][0]["finish_reason"].is_null()) finish = e["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(ids, g.greedy);
  EXPECT_EQ(finish, "length");
}

TEST_F(Gateway, TextPromptsGoThroughTheTokenizer) {
  auto c = client_of(*fixture_);
  json r = post(c, "/v1/completions", {{"prompt", "hello world"}, {"max_tokens", 8}, {"temperature", 0}, {"ignore_eos", true}}, 200);
  EXPECT_EQ(r["usage"]["prompt_tokens"], 6);  // BOS + hello + Ġwo + r l d
  // The text is what the tokenizer makes of the ids (ids above 305 are not in its vocabulary).
  auto ids = r["choices"][0]["token_ids"].get<std::vector<std::int32_t>>();
  EXPECT_EQ(r["choices"][0]["text"], fixture_->gateway.tokenizer->decode(ids));
  // The same prompt as ids gives the same tokens.
  auto prompt = *fixture_->gateway.tokenizer->encode("hello world");
  json r2 = post(c, "/v1/completions", {{"prompt", prompt}, {"max_tokens", 8}, {"temperature", 0}, {"ignore_eos", true}}, 200);
  EXPECT_EQ(r2["choices"][0]["token_ids"], r["choices"][0]["token_ids"]);
}

TEST_F(Gateway, ChatUsesTheModelsFormatAndStreamsDeltas) {
  auto c = client_of(*fixture_);
  json body{{"model", "tiny-llama"},
            {"messages", json::array({{{"role", "system"}, {"content", "be brief"}}, {{"role", "user"}, {"content", "hello"}}})},
            {"max_tokens", 6},
            {"temperature", 0}};
  json r = post(c, "/v1/chat/completions", body, 200);
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["choices"][0]["message"]["role"], "assistant");
  EXPECT_TRUE(r["choices"][0]["message"]["content"].is_string());
  // BOS, two turns of header + content + eot, and the assistant header: the Llama 3 layout.
  EXPECT_GT(r["usage"]["prompt_tokens"].get<int>(), 12);
  body["stream"] = true;
  auto s = c.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(s);
  auto events = sse_events(s->body);
  ASSERT_GE(events.size(), 3u);
  json first = json::parse(events[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  std::string content;
  for (std::size_t i = 0; i + 1 < events.size(); ++i) {
    json e = json::parse(events[i]);
    content += e["choices"][0]["delta"].value("content", "");
  }
  EXPECT_EQ(content, r["choices"][0]["message"]["content"]);
  EXPECT_EQ(events.back(), "[DONE]");
}

TEST_F(Gateway, ErrorsHaveOpenAIsShapeAndStatus) {
  auto c = client_of(*fixture_);
  auto expect_error = [&](const std::string& path, const std::string& body, int status, const std::string& param,
                          const std::string& code) {
    auto r = c.Post(path.c_str(), body, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, status) << body << " -> " << r->body;
    json e = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(e.contains("error")) << r->body;
    EXPECT_TRUE(e["error"]["message"].is_string());
    EXPECT_TRUE(e["error"]["type"].is_string());
    if (!param.empty()) EXPECT_EQ(e["error"]["param"], param) << r->body;
    if (!code.empty()) EXPECT_EQ(e["error"]["code"], code) << r->body;
  };
  expect_error("/v1/completions", "{not json", 400, "", "invalid_json");
  expect_error("/v1/completions", R"({"prompt": [1, 5000]})", 400, "prompt", "invalid_value");
  expect_error("/v1/completions", R"({"prompt": []})", 400, "prompt", "");
  expect_error("/v1/completions", R"({"max_tokens": 3})", 400, "prompt", "");
  expect_error("/v1/completions", R"({"prompt": [1], "max_tokens": 0})", 400, "max_tokens", "");
  expect_error("/v1/completions", R"({"prompt": [1], "max_tokens": 600})", 400, "max_tokens", "context_length_exceeded");
  expect_error("/v1/completions", R"({"prompt": [1], "temperature": -1})", 400, "temperature", "");
  expect_error("/v1/completions", R"({"prompt": [1], "n": 2})", 400, "n", "unsupported_value");
  expect_error("/v1/completions", R"({"prompt": [1], "stop_token_ids": [99999]})", 400, "stop_token_ids", "");
  expect_error("/v1/completions", R"({"prompt": [1], "model": "gpt-4"})", 404, "model", "model_not_found");
  expect_error("/v1/chat/completions", R"({"messages": []})", 400, "messages", "");
  expect_error("/v1/chat/completions", R"({"messages": [{"content": "x"}]})", 400, "messages[0]", "");
  auto r = c.Get("/v1/nothing");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  EXPECT_TRUE(json::parse(r->body).contains("error"));
  // Neutral values of fields we don't implement are fine.
  post(c, "/v1/completions", {{"prompt", {1}}, {"max_tokens", 1}, {"n", 1}, {"logprobs", 0}, {"presence_penalty", 0.0}}, 200);
}

TEST_F(Gateway, HealthReadyAndModels) {
  auto c = client_of(*fixture_);
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  auto ready = c.Get("/ready");
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->status, 200);
  json rj = json::parse(ready->body);
  EXPECT_TRUE(rj["ready"].get<bool>());
  EXPECT_EQ(rj["stages"].size(), 1u);
  auto m = c.Get("/v1/models");
  ASSERT_TRUE(m);
  json mj = json::parse(m->body);
  EXPECT_EQ(mj["object"], "list");
  EXPECT_EQ(mj["data"][0]["id"], "tiny-llama");
  EXPECT_EQ(mj["data"][0]["max_model_len"], 512);
  EXPECT_EQ(mj["data"][0]["tokenizer"], "byte_level_bpe");
}

TEST_F(Gateway, MetricsParseAsPrometheusTextAndMoveWithTraffic) {
  auto c = client_of(*fixture_);
  auto scrape = [&] {
    auto r = c.Get("/metrics");
    EXPECT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->get_header_value("Content-Type").rfind("text/plain; version=0.0.4", 0), 0u);
    std::map<std::string, double> v;
    EXPECT_EQ(testing::check_prometheus(r->body, v), "") << r->body;
    return v;
  };
  auto before = scrape();
  post(c, "/v1/completions", {{"prompt", {1, 2, 3}}, {"max_tokens", 5}, {"temperature", 0}, {"ignore_eos", true}}, 200);
  auto after = scrape();
  for (const char* name :
       {"conveyor_requests_running", "conveyor_requests_waiting", "conveyor_requests_finished_total",
        "conveyor_requests_failed_total", "conveyor_tokens_generated_total", "conveyor_kv_blocks_total",
        "conveyor_kv_blocks_free", "conveyor_kv_cache_usage_ratio", "conveyor_time_to_first_token_seconds_count",
        "conveyor_inter_token_latency_seconds_count", "conveyor_e2e_request_latency_seconds_count",
        "conveyor_request_queue_time_seconds_count", "conveyor_generation_tokens_total", "conveyor_prompt_tokens_total",
        "conveyor_service_stats_up", "conveyor_http_active_requests", "conveyor_stage_busy_seconds_total{stage=\"0\"}",
        "conveyor_stage_idle_seconds_total{stage=\"0\"}"}) {
    EXPECT_TRUE(after.count(name)) << name;
  }
  EXPECT_EQ(after["conveyor_service_stats_up"], 1);
  EXPECT_EQ(after["conveyor_time_to_first_token_seconds_count"] - before["conveyor_time_to_first_token_seconds_count"], 1);
  EXPECT_EQ(after["conveyor_inter_token_latency_seconds_count"] - before["conveyor_inter_token_latency_seconds_count"], 4);
  EXPECT_EQ(after["conveyor_generation_tokens_total"] - before["conveyor_generation_tokens_total"], 5);
  EXPECT_EQ(after["conveyor_tokens_generated_total"] - before["conveyor_tokens_generated_total"], 5);
  EXPECT_EQ(after["conveyor_requests_finished_total"] - before["conveyor_requests_finished_total"], 1);
  EXPECT_EQ(after["conveyor_time_to_first_token_seconds_bucket{le=\"+Inf\"}"],
            after["conveyor_time_to_first_token_seconds_count"]);
  EXPECT_GT(after["conveyor_stage_busy_seconds_total{stage=\"0\"}"], 0);
  EXPECT_GE(after["conveyor_http_requests_total{route=\"/v1/completions\",code=\"200\"}"], 1);
}

TEST(GatewayLimits, OverloadIs429AndADeadlineIs504) {
  http_server_options o;
  o.max_active_requests = 1;
  auto f = start_gateway(false, o);
  auto c = client_of(*f);
  // A long request holds the only slot while the second arrives.
  auto long_one = std::async(std::launch::async, [&] {
    auto c2 = client_of(*f);
    return c2.Post("/v1/completions", json{{"prompt", {1}}, {"max_tokens", 400}, {"ignore_eos", true}}.dump(),
                   "application/json");
  });
  std::optional<httplib::Result> second;
  for (int i = 0; i < 200; ++i) {  // until the long one is surely in
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    auto r = c.Post("/v1/completions", json{{"prompt", {1}}, {"max_tokens", 1}}.dump(), "application/json");
    if (r && r->status == 429) {
      second.emplace(std::move(r));
      break;
    }
  }
  ASSERT_TRUE(second.has_value()) << "no 429 while a request held the only slot";
  EXPECT_EQ((*second)->get_header_value("Retry-After"), "1");
  EXPECT_EQ(json::parse((*second)->body)["error"]["code"], "overloaded");
  EXPECT_EQ(long_one.get()->status, 200);
  // A deadline far shorter than 400 tokens take.
  auto r = c.Post("/v1/completions", json{{"prompt", {1}}, {"max_tokens", 400}, {"ignore_eos", true}, {"timeout", 0.05}}.dump(),
                  "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 504) << r->body;
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "timeout");
  // Without a tokenizer: text prompts and chat are refused with a reason.
  auto t = c.Post("/v1/completions", R"({"prompt": "hello"})", "application/json");
  ASSERT_TRUE(t);
  EXPECT_EQ(t->status, 400);
  auto ch = c.Post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}]})", "application/json");
  ASSERT_TRUE(ch);
  EXPECT_EQ(ch->status, 400);
  EXPECT_NE(ch->body.find("tokenizer"), std::string::npos);
}

TEST(GatewayBind, ExactlyTheConfiguredAddressAndClearErrors) {
  auto f = start_gateway(false);
  EXPECT_EQ(f->gateway.server->address(), "127.0.0.1:" + std::to_string(f->gateway.server->port()));
  // The same port again fails to bind (no SO_REUSEPORT sharing), with the address in the message.
  http_server_options o;
  o.listen = f->gateway.server->address();
  auto again = start_http_server(*f->service, nullptr, o);
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.err().message.find(o.listen), std::string::npos);
  o.listen = "not-an-address";
  auto bad = start_http_server(*f->service, nullptr, o);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.err().code, errc::invalid_argument);
}

}  // namespace
}  // namespace conveyor::http
