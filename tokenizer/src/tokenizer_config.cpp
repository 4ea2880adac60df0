#include "tokenizer_config.hpp"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace conveyor::tokenizer {

namespace {

using json = nlohmann::json;

/// nullopt when the file does not exist.
result<std::optional<json>> read_json(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::optional<json>();
  std::ifstream in(path);
  if (!in) return make_error(errc::io, "cannot read " + path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return make_error(errc::bad_format, path.string() + " is not a JSON object");
  return std::optional<json>(std::move(j));
}

std::string token_text(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string()) return j["content"].get<std::string>();
  return "";
}

void read_ids(const json& j, const char* bos_key, const char* eos_key, dir_config& c) {
  if (!c.bos_id && j.contains(bos_key) && j[bos_key].is_number_integer()) c.bos_id = j[bos_key].get<std::int32_t>();
  if (!c.eos_ids.empty() || !j.contains(eos_key)) return;
  if (j[eos_key].is_number_integer()) c.eos_ids.push_back(j[eos_key].get<std::int32_t>());
  if (j[eos_key].is_array()) {
    for (const auto& x : j[eos_key]) {
      if (x.is_number_integer()) c.eos_ids.push_back(x.get<std::int32_t>());
    }
  }
}

}  // namespace

result<dir_config> read_dir_config(const std::string& model_dir) {
  const std::filesystem::path dir(model_dir);
  dir_config c;
  CONVEYOR_TRY_ASSIGN(tc, read_json(dir / "tokenizer_config.json"));
  if (tc) {
    const json& j = *tc;
    if (j.contains("add_bos_token") && j["add_bos_token"].is_boolean()) c.add_bos = j["add_bos_token"].get<bool>();
    if (j.contains("add_eos_token") && j["add_eos_token"].is_boolean()) c.add_eos = j["add_eos_token"].get<bool>();
    if (j.contains("bos_token")) c.bos_token = token_text(j["bos_token"]);
    if (j.contains("eos_token")) c.eos_token = token_text(j["eos_token"]);
    if (j.contains("chat_template")) {
      const json& t = j["chat_template"];
      if (t.is_string()) c.chat_template = t.get<std::string>();
      if (t.is_array()) {
        for (const auto& e : t) {
          if (e.value("name", std::string()) == "default" && e.contains("template") && e["template"].is_string()) {
            c.chat_template = e["template"].get<std::string>();
          }
        }
      }
    }
    if (j.contains("added_tokens_decoder") && j["added_tokens_decoder"].is_object()) {
      for (const auto& [key, v] : j["added_tokens_decoder"].items()) {
        added_token t;
        try {
          t.id = std::stoi(key);
        } catch (...) {
          return make_error(errc::bad_format, "tokenizer_config.json: added_tokens_decoder key \"" + key + "\" is not an id");
        }
        t.content = token_text(v);
        t.special = v.value("special", false);
        t.lstrip = v.value("lstrip", false);
        t.rstrip = v.value("rstrip", false);
        if (!t.content.empty()) c.added.push_back(std::move(t));
      }
    }
  }
  CONVEYOR_TRY_ASSIGN(gc, read_json(dir / "generation_config.json"));
  if (gc) read_ids(*gc, "bos_token_id", "eos_token_id", c);
  CONVEYOR_TRY_ASSIGN(mc, read_json(dir / "config.json"));
  if (mc) read_ids(*mc, "bos_token_id", "eos_token_id", c);
  return c;
}

special_tokens resolve_specials(const dir_config& config, const native_specials& native,
                                const std::function<std::optional<std::int32_t>(const std::string&)>& lookup,
                                const std::function<std::string(std::int32_t)>& text_of) {
  special_tokens s;
  s.chat_template = config.chat_template;
  if (!config.bos_token.empty()) s.bos_id = lookup(config.bos_token);
  if (!s.bos_id) s.bos_id = native.bos_id;
  if (!s.bos_id) s.bos_id = config.bos_id;
  if (s.bos_id) s.bos_token = text_of(*s.bos_id);
  auto add_eos = [&](std::optional<std::int32_t> id) {
    if (id && std::find(s.eos_ids.begin(), s.eos_ids.end(), *id) == s.eos_ids.end()) s.eos_ids.push_back(*id);
  };
  if (!config.eos_token.empty()) add_eos(lookup(config.eos_token));
  add_eos(native.eos_id);
  for (auto id : config.eos_ids) add_eos(id);
  if (!s.eos_ids.empty()) s.eos_token = text_of(s.eos_ids.front());
  s.add_bos = config.add_bos.value_or(native.add_bos) && s.bos_id.has_value();
  s.add_eos = config.add_eos.value_or(native.add_eos) && !s.eos_ids.empty();
  return s;
}

}  // namespace conveyor::tokenizer
