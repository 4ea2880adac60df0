#include "batch_lines.hpp"

#include <cmath>
#include <limits>

#include "conveyor/service/batch_runner.hpp"
#include "conveyor/tokenizer/tokenizer.hpp"

namespace conveyor::service::batch_detail {

namespace {

using json = nlohmann::json;

error bad(std::int64_t line_no, const std::string& what) {
  return make_error(errc::invalid_argument, "line " + std::to_string(line_no) + ": " + what);
}

result<std::vector<std::int32_t>> int_list(const json& v, const char* key, std::int64_t line_no) {
  if (!v.is_array()) return bad(line_no, std::string(key) + " must be an array of token ids");
  std::vector<std::int32_t> out;
  for (const auto& x : v) {
    if (!x.is_number_integer() || x.get<std::int64_t>() < std::numeric_limits<std::int32_t>::min() ||
        x.get<std::int64_t>() > std::numeric_limits<std::int32_t>::max()) {
      return bad(line_no, std::string(key) + " must hold integers, got " + x.dump());
    }
    out.push_back(static_cast<std::int32_t>(x.get<std::int64_t>()));
  }
  return out;
}

result<generate_request> request_of(const json& o, std::int64_t line_no, const tokenizer::tokenizer* tok) {
  generate_request r;
  bool has_prompt = false, has_max = false;
  for (const auto& [key, v] : o.items()) {
    auto number = [&](double& out, double lo) -> status {
      if (!v.is_number() || !(v.get<double>() >= lo) || !std::isfinite(v.get<double>())) {
        return bad(line_no, key + " must be a number >= " + std::to_string(static_cast<int>(lo)) + ", got " + v.dump());
      }
      out = v.get<double>();
      return ok_status();
    };
    auto integer = [&](std::int64_t& out, std::int64_t lo, std::int64_t hi) -> status {
      if (!v.is_number_integer() || v.get<std::int64_t>() < lo || v.get<std::int64_t>() > hi) {
        return bad(line_no, key + " must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                                "], got " + v.dump());
      }
      out = v.get<std::int64_t>();
      return ok_status();
    };
    double d = 0;
    std::int64_t i = 0;
    if (key == "id") {
      continue;
    } else if (key == "prompt_ids") {
      CONVEYOR_TRY_ASSIGN(ids, int_list(v, "prompt_ids", line_no));
      r.prompt = std::move(ids);
      if (has_prompt) return bad(line_no, "give prompt_ids or prompt, not both");
      has_prompt = true;
    } else if (key == "prompt") {
      if (has_prompt) return bad(line_no, "give prompt_ids or prompt, not both");
      has_prompt = true;
      if (!v.is_string()) return bad(line_no, "prompt must be a string");
      if (!tok) return bad(line_no, "prompt is text but the model directory has no tokenizer: give prompt_ids");
      auto ids = tok->encode(v.get<std::string>());
      if (!ids) return bad(line_no, "prompt: " + ids.err().message);
      r.prompt = std::move(*ids);
    } else if (key == "max_tokens" || key == "max_new_tokens") {
      if (has_max) return bad(line_no, "give max_tokens or max_new_tokens, not both");
      has_max = true;
      CONVEYOR_TRY(integer(i, 1, std::numeric_limits<std::int32_t>::max()));
      r.max_new_tokens = static_cast<int>(i);
    } else if (key == "temperature") {
      CONVEYOR_TRY(number(d, 0));
      r.sampling.temperature = static_cast<float>(d);
    } else if (key == "top_k") {
      CONVEYOR_TRY(integer(i, 0, std::numeric_limits<std::int32_t>::max()));
      r.sampling.top_k = static_cast<int>(i);
    } else if (key == "top_p") {
      CONVEYOR_TRY(number(d, 0));
      r.sampling.top_p = static_cast<float>(d);
    } else if (key == "seed") {
      CONVEYOR_TRY(integer(i, 0, std::numeric_limits<std::int64_t>::max()));
      r.sampling.seed = static_cast<std::uint64_t>(i);
    } else if (key == "stop_ids") {
      CONVEYOR_TRY_ASSIGN(ids, int_list(v, "stop_ids", line_no));
      r.stop_ids = std::move(ids);
    } else if (key == "ignore_eos") {
      if (!v.is_boolean()) return bad(line_no, "ignore_eos must be true or false");
      r.ignore_eos = v.get<bool>();
    } else if (key == "deadline_s") {
      CONVEYOR_TRY(number(r.deadline_s, 0));
    } else {
      return bad(line_no, "unknown key \"" + key +
                              "\" (allowed: id, prompt_ids, prompt, max_tokens, max_new_tokens, temperature, top_k, "
                              "top_p, seed, stop_ids, ignore_eos, deadline_s)");
    }
  }
  if (!has_prompt) return bad(line_no, "no prompt: give prompt_ids (or prompt with a tokenizer)");
  return r;
}

}  // namespace

parsed_line parse_line(std::string_view text, std::int64_t line_no, const tokenizer::tokenizer* tok) {
  parsed_line out;
  out.id = line_no;
  json o = json::parse(text, nullptr, false);
  if (o.is_discarded() || !o.is_object()) {
    out.request = bad(line_no, "not a JSON object");
    return out;
  }
  if (auto it = o.find("id"); it != o.end()) {
    if (!it->is_string() && !it->is_number_integer()) {
      out.request = bad(line_no, "id must be a string or an integer, got " + it->dump());
      return out;
    }
    out.id = *it;
  }
  out.request = request_of(o, line_no, tok);
  return out;
}

std::string result_line(const nlohmann::json& id, const std::vector<std::int32_t>& tokens, const generate_summary& s,
                        const tokenizer::tokenizer* tok) {
  // Ordered: the id first, as in the input, so a person reading the file finds it.
  nlohmann::ordered_json o;
  o["id"] = id;
  o["tokens"] = tokens;
  if (tok) o["text"] = tok->decode(tokens);
  o["finish_reason"] = s.finish_reason;
  o["prompt_tokens"] = s.prompt_tokens;
  o["completion_tokens"] = s.completion_tokens;
  o["first_token_s"] = s.first_token_s;
  o["total_s"] = s.total_s;
  return o.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string error_line(const nlohmann::json& id, const error& e) {
  nlohmann::ordered_json o;
  o["id"] = id;
  o["error"] = {{"code", std::string(errc_name(e.code))}, {"message", e.message}};
  return o.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::optional<nlohmann::json> id_of_result(std::string_view line) {
  json o = json::parse(line, nullptr, false);
  if (o.is_discarded() || !o.is_object()) return std::nullopt;
  auto it = o.find("id");
  if (it == o.end()) return std::nullopt;
  return *it;
}

}  // namespace conveyor::service::batch_detail
