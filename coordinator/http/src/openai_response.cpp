#include "openai_response.hpp"

#include <ctime>
#include <random>

#include <nlohmann/json.hpp>

namespace conveyor::http {

namespace {

using json = nlohmann::json;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json usage_json(const usage_counts& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

json base(const response_header& h, const char* object) {
  return {{"id", h.id}, {"object", object}, {"created", h.created}, {"model", h.model}};
}

}  // namespace

response_header make_header(bool chat, const std::string& model) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  char hex[25];
  std::snprintf(hex, sizeof hex, "%016llx%08llx", static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(rng() & 0xFFFFFFFFu));
  return {std::string(chat ? "chatcmpl-" : "cmpl-") + hex, static_cast<std::int64_t>(std::time(nullptr)), model, chat};
}

std::string completion_body(const response_header& h, const std::string& text, std::span<const std::int32_t> ids,
                            const std::string& finish_reason, const usage_counts& usage) {
  json choice{{"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish_reason},
              {"token_ids", std::vector<std::int32_t>(ids.begin(), ids.end())}};
  if (h.chat) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    choice["text"] = text;
  }
  json j = base(h, h.chat ? "chat.completion" : "text_completion");
  j["choices"] = json::array({choice});
  j["usage"] = usage_json(usage);
  return dump(j);
}

std::string chunk_body(const response_header& h, const std::string& text, std::span<const std::int32_t> ids,
                       const char* finish_reason, bool with_role) {
  json choice{{"index", 0}, {"logprobs", nullptr},
              {"finish_reason", finish_reason ? json(finish_reason) : json()},
              {"token_ids", std::vector<std::int32_t>(ids.begin(), ids.end())}};
  if (h.chat) {
    json delta = json::object();
    if (with_role) delta["role"] = "assistant";
    if (with_role || !text.empty()) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  json j = base(h, h.chat ? "chat.completion.chunk" : "text_completion");
  j["choices"] = json::array({choice});
  return dump(j);
}

std::string usage_chunk_body(const response_header& h, const usage_counts& usage) {
  json j = base(h, h.chat ? "chat.completion.chunk" : "text_completion");
  j["choices"] = json::array();
  j["usage"] = usage_json(usage);
  return dump(j);
}

}  // namespace conveyor::http
