#include "openai_request.hpp"

#include <cmath>
#include <random>

#include <nlohmann/json.hpp>

#include "conveyor/tokenizer/chat_template.hpp"

namespace conveyor::http {

namespace {

using json = nlohmann::json;
using parsed = std::variant<completion_request, api_error>;

constexpr int kMaxStopStrings = 16;
constexpr int kMaxStopIds = 1024;
constexpr int kChatDefaultMaxTokens = 1024;  // chat without max_tokens: the rest of the context, at most this

std::string type_name(const json& j) { return j.type_name(); }

/// Reads an optional number field within [lo, hi].
std::optional<api_error> number(const json& body, const char* key, double lo, double hi, double& out) {
  if (!body.contains(key) || body[key].is_null()) return std::nullopt;
  if (!body[key].is_number()) return bad_request(key, std::string(key) + " must be a number, got " + type_name(body[key]));
  const double v = body[key].get<double>();
  if (!(v >= lo && v <= hi)) {
    return bad_request(key, std::string(key) + " must be in [" + json(lo).dump() + ", " + json(hi).dump() + "], got " +
                                body[key].dump());
  }
  out = v;
  return std::nullopt;
}

std::optional<api_error> integer(const json& body, const char* key, std::int64_t lo, std::int64_t hi, std::int64_t& out) {
  if (!body.contains(key) || body[key].is_null()) return std::nullopt;
  if (!body[key].is_number_integer()) {
    return bad_request(key, std::string(key) + " must be an integer, got " + body[key].dump());
  }
  const auto v = body[key].get<std::int64_t>();
  if (v < lo || v > hi) {
    return bad_request(key, std::string(key) + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                                "], got " + std::to_string(v));
  }
  out = v;
  return std::nullopt;
}

std::optional<api_error> boolean(const json& body, const char* key, bool& out) {
  if (!body.contains(key) || body[key].is_null()) return std::nullopt;
  if (!body[key].is_boolean()) return bad_request(key, std::string(key) + " must be true or false, got " + body[key].dump());
  out = body[key].get<bool>();
  return std::nullopt;
}

std::optional<api_error> ids_of(const json& arr, const char* param, std::vector<std::int32_t>& out) {
  for (const auto& x : arr) {
    if (!x.is_number_integer()) return bad_request(param, std::string(param) + " holds a non-integer: " + x.dump());
    const auto v = x.get<std::int64_t>();
    if (v < INT32_MIN || v > INT32_MAX) return bad_request(param, std::string(param) + " holds " + x.dump());
    out.push_back(static_cast<std::int32_t>(v));
  }
  return std::nullopt;
}

std::optional<api_error> encode(const request_context& ctx, const std::string& text, bool add_special,
                                std::vector<std::int32_t>& out, const char* param) {
  if (ctx.tok == nullptr) {
    return bad_request(param, "the served model has no tokenizer (no tokenizer.json or tokenizer.model in its "
                              "directory): send the prompt as token ids");
  }
  auto r = ctx.tok->encode(text, {.add_special = add_special});
  if (!r) return bad_request(param, r.err().message);
  out = std::move(*r);
  return std::nullopt;
}

/// "prompt": a string, an array of ids, or a one-element array of either.
std::optional<api_error> completion_prompt(const json& body, const request_context& ctx, std::vector<std::int32_t>& ids) {
  if (!body.contains("prompt")) return bad_request("prompt", "prompt is required");
  json p = body["prompt"];
  if (p.is_array() && p.size() == 1 && (p[0].is_string() || p[0].is_array())) p = p[0];
  if (p.is_string()) return encode(ctx, p.get<std::string>(), true, ids, "prompt");
  if (p.is_array() && (p.empty() || p[0].is_number())) return ids_of(p, "prompt", ids);
  if (p.is_array()) {
    return bad_request("prompt", "batched prompts (" + std::to_string(p.size()) +
                                     ") are not supported: send one request per prompt");
  }
  return bad_request("prompt", "prompt must be a string or an array of token ids, got " + type_name(p));
}

std::optional<api_error> chat_prompt(const json& body, const request_context& ctx, completion_request& r) {
  if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty()) {
    return bad_request("messages", "messages must be a non-empty array of {role, content}");
  }
  if (ctx.tok == nullptr) {
    return bad_request("messages", "chat needs a tokenizer; the served model's directory has none "
                                   "(use /v1/completions with token ids)");
  }
  std::vector<tokenizer::chat_message> messages;
  for (std::size_t i = 0; i < body["messages"].size(); ++i) {
    const json& m = body["messages"][i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      return bad_request(where, where + " needs a string role");
    }
    tokenizer::chat_message cm{m["role"].get<std::string>(), ""};
    const json content = m.value("content", json());
    if (content.is_string()) {
      cm.content = content.get<std::string>();
    } else if (content.is_array()) {  // [{"type": "text", "text": ...}, ...]
      for (const auto& part : content) {
        if (!part.is_object() || part.value("type", std::string()) != "text" || !part.contains("text") ||
            !part["text"].is_string()) {
          return bad_request(where + ".content", "only text content parts are supported");
        }
        cm.content += part["text"].get<std::string>();
      }
    } else if (!content.is_null()) {
      return bad_request(where + ".content", where + ".content must be a string or an array of text parts");
    }
    messages.push_back(std::move(cm));
  }
  auto rendered = tokenizer::render_chat(*ctx.tok, messages);
  if (!rendered) return bad_request("messages", rendered.err().message);
  r.generate.stop_ids = rendered->stop_ids;
  return encode(ctx, rendered->prompt, false, r.generate.prompt, "messages");
}

std::optional<api_error> stops(const json& body, const request_context& ctx, completion_request& r) {
  if (body.contains("stop") && !body["stop"].is_null()) {
    json s = body["stop"];
    if (s.is_string()) s = json::array({s});
    if (!s.is_array() || static_cast<int>(s.size()) > kMaxStopStrings) {
      return bad_request("stop", "stop must be a string or an array of at most " + std::to_string(kMaxStopStrings) + " strings");
    }
    for (const auto& x : s) {
      if (!x.is_string() || x.get<std::string>().empty()) return bad_request("stop", "stop strings must be non-empty strings");
      r.stop_strings.push_back(x.get<std::string>());
    }
    if (!r.stop_strings.empty() && ctx.tok == nullptr) {
      return bad_request("stop", "stop strings need a tokenizer; use stop_token_ids");
    }
  }
  if (body.contains("stop_token_ids") && !body["stop_token_ids"].is_null()) {
    if (!body["stop_token_ids"].is_array() || static_cast<int>(body["stop_token_ids"].size()) > kMaxStopIds) {
      return bad_request("stop_token_ids", "stop_token_ids must be an array of at most " + std::to_string(kMaxStopIds) + " ids");
    }
    if (auto e = ids_of(body["stop_token_ids"], "stop_token_ids", r.generate.stop_ids)) return e;
  }
  for (auto id : r.generate.stop_ids) {
    if (id < 0 || id >= ctx.vocab_size) {
      return bad_request("stop_token_ids", "stop token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                               std::to_string(ctx.vocab_size) + ")");
    }
  }
  return std::nullopt;
}

/// Fields we don't implement are accepted only at their neutral values, so a client never gets
/// silently different semantics.
std::optional<api_error> unsupported_fields(const json& body) {
  auto neutral = [](const json& v, const json& ok) {
    if (v.is_null() || v == ok) return true;
    if (v.is_number() && ok.is_number()) return v.get<double>() == ok.get<double>();
    if (v.is_number() && ok.is_boolean()) return v.get<double>() == 0.0 && !ok.get<bool>();  // logprobs: 0
    return false;
  };
  for (const auto& [key, ok] : {std::pair<const char*, json>{"n", 1}, {"best_of", 1}, {"echo", false}, {"logprobs", false},
                                {"top_logprobs", 0}, {"presence_penalty", 0}, {"frequency_penalty", 0}, {"suffix", ""}}) {
    if (body.contains(key) && !neutral(body[key], ok)) {
      return bad_request(key, std::string(key) + " = " + body[key].dump() + " is not supported (only " + ok.dump() + ")",
                         "unsupported_value");
    }
  }
  return std::nullopt;
}

}  // namespace

std::variant<completion_request, api_error> parse_completion_request(const std::string& text, bool chat,
                                                                      const request_context& ctx) {
  json body = json::parse(text, nullptr, false);
  if (body.is_discarded()) return bad_request("", "the request body is not valid JSON", "invalid_json");
  if (!body.is_object()) return bad_request("", "the request body must be a JSON object", "invalid_json");
  if (body.contains("model") && !body["model"].is_null()) {
    if (!body["model"].is_string() || body["model"].get<std::string>() != ctx.model_name) {
      return api_error{404, "invalid_request_error",
                       "the model " + body["model"].dump() + " does not exist; this server serves \"" + ctx.model_name + "\"",
                       "model", "model_not_found"};
    }
  }
  if (auto e = unsupported_fields(body)) return *e;
  completion_request r;
  r.chat = chat;
  if (auto e = chat ? chat_prompt(body, ctx, r) : completion_prompt(body, ctx, r.generate.prompt)) return *e;
  if (r.generate.prompt.empty()) return bad_request(chat ? "messages" : "prompt", "the prompt is empty");
  for (auto id : r.generate.prompt) {
    if (id < 0 || id >= ctx.vocab_size) {
      return bad_request("prompt", "token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                       std::to_string(ctx.vocab_size) + ")");
    }
  }
  const auto prompt_len = static_cast<std::int64_t>(r.generate.prompt.size());
  if (prompt_len >= ctx.max_context) {
    return bad_request(chat ? "messages" : "prompt",
                       "the prompt has " + std::to_string(prompt_len) + " tokens; this model's context is " +
                           std::to_string(ctx.max_context) + " tokens",
                       "context_length_exceeded");
  }
  std::int64_t max_tokens = chat ? std::min<std::int64_t>(ctx.max_context - prompt_len, kChatDefaultMaxTokens) : 16;
  if (auto e = integer(body, "max_tokens", 1, INT32_MAX, max_tokens)) return *e;
  if (chat) {
    if (auto e = integer(body, "max_completion_tokens", 1, INT32_MAX, max_tokens)) return *e;
  }
  if (prompt_len + max_tokens > ctx.max_context) {
    return bad_request("max_tokens",
                       "this model's context is " + std::to_string(ctx.max_context) + " tokens; the prompt (" +
                           std::to_string(prompt_len) + ") plus max_tokens (" + std::to_string(max_tokens) +
                           ") exceeds it",
                       "context_length_exceeded");
  }
  r.generate.max_new_tokens = static_cast<int>(max_tokens);
  double temperature = 1.0, top_p = 1.0, timeout = 0.0;
  std::int64_t top_k = 0, seed = -1;
  if (auto e = number(body, "temperature", 0.0, 2.0, temperature)) return *e;
  if (auto e = number(body, "top_p", 1e-9, 1.0, top_p)) return *e;
  if (auto e = integer(body, "top_k", -1, INT32_MAX, top_k)) return *e;
  if (auto e = integer(body, "seed", INT64_MIN, INT64_MAX, seed)) return *e;
  if (auto e = number(body, "timeout", 0.0, 1e6, timeout)) return *e;
  r.generate.sampling.temperature = static_cast<float>(temperature);
  r.generate.sampling.top_p = static_cast<float>(top_p);
  r.generate.sampling.top_k = top_k < 0 ? 0 : static_cast<int>(top_k);
  if (body.contains("seed") && !body["seed"].is_null()) {
    r.generate.sampling.seed = static_cast<std::uint64_t>(seed);
  } else {
    // No seed: a fresh one per request, as OpenAI samples differently each time.
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    r.generate.sampling.seed = rng();
  }
  r.timeout_s = timeout;
  r.generate.deadline_s = timeout;
  if (auto e = boolean(body, "ignore_eos", r.generate.ignore_eos)) return *e;
  if (auto e = boolean(body, "stream", r.stream)) return *e;
  if (auto e = boolean(body, "skip_special_tokens", r.skip_special_tokens)) return *e;
  if (body.contains("stream_options") && body["stream_options"].is_object()) {
    if (auto e = boolean(body["stream_options"], "include_usage", r.include_usage)) return *e;
  }
  if (auto e = stops(body, ctx, r)) return *e;
  // The tokenizer's end-of-sequence ids (generation_config.json may list several) end a completion
  // like the model's own EOS does.
  if (ctx.tok != nullptr && !r.generate.ignore_eos) {
    for (auto id : ctx.tok->specials().eos_ids) {
      if (id >= 0 && id < ctx.vocab_size) r.generate.stop_ids.push_back(id);
    }
  }
  return r;
}

}  // namespace conveyor::http
