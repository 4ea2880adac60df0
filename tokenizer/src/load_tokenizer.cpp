#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "conveyor/tokenizer/tokenizer.hpp"
#include "hf_tokenizer.hpp"
#include "sentencepiece_tokenizer.hpp"
#include "tokenizer_config.hpp"

namespace conveyor::tokenizer {

namespace {

using json = nlohmann::json;

result<json> read_tokenizer_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) return make_error(errc::not_found, "cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str(), nullptr, false);
  if (j.is_discarded()) return make_error(errc::bad_format, path + " is not valid JSON");
  return j;
}

result<std::unique_ptr<tokenizer>> build_hf(const std::string& path, const json& doc, const dir_config& config) {
  auto spec = parse_tokenizer_json(doc);
  if (!spec) {
    std::string m = spec.err().message;
    const std::string_view prefix = "tokenizer.json: ";
    if (m.rfind(prefix, 0) == 0) m = path + ": " + m.substr(prefix.size());
    return make_error(spec.err().code, m);
  }
  // tokenizer_config.json may know added tokens the tokenizer.json lacks (rare, but cheap to honour).
  for (const auto& a : config.added) {
    if (std::none_of(spec->added.begin(), spec->added.end(), [&](const added_token& x) { return x.id == a.id; })) {
      spec->added.push_back(a);
    }
  }
  const hf_spec& s = *spec;
  auto lookup = [&](const std::string& t) -> std::optional<std::int32_t> {
    for (const auto& a : s.added) {
      if (a.content == t) return a.id;
    }
    return s.model.id(t);
  };
  auto text_of = [&](std::int32_t id) -> std::string {
    for (const auto& a : s.added) {
      if (a.id == id) return a.content;
    }
    const std::string* p = s.model.piece(id);
    return p ? *p : std::string();
  };
  native_specials n;
  if (!s.prefix_specials.empty()) n.bos_id = lookup(s.prefix_specials.front());
  if (!s.suffix_specials.empty()) n.eos_id = lookup(s.suffix_specials.front());
  n.add_bos = n.bos_id.has_value();
  n.add_eos = n.eos_id.has_value();
  auto specials = resolve_specials(config, n, lookup, text_of);
  return make_hf_tokenizer(std::move(*spec), std::move(specials));
}

}  // namespace

result<std::unique_ptr<tokenizer>> load_tokenizer(const std::string& model_dir) {
  namespace fs = std::filesystem;
  const fs::path dir(model_dir);
  const std::string json_path = (dir / "tokenizer.json").string(), model_path = (dir / "tokenizer.model").string();
  std::error_code ec;
  const bool has_json = fs::exists(json_path, ec), has_model = fs::exists(model_path, ec);
  if (!has_json && !has_model) {
    return make_error(errc::not_found, model_dir + " has no tokenizer.json or tokenizer.model");
  }
  CONVEYOR_TRY_ASSIGN(config, read_dir_config(model_dir));
  std::optional<json> doc;
  if (has_json) {
    CONVEYOR_TRY_ASSIGN(d, read_tokenizer_json(json_path));
    doc = std::move(d);
  }
  // Byte-level files are ours alone; for Llama 2 style models, libsentencepiece is the reference and
  // the metaspace tokenizer.json only the fallback.
  if (doc && is_byte_level(*doc)) return build_hf(json_path, *doc, config);
  if (has_model) return load_sentencepiece(model_path, config);
  return build_hf(json_path, *doc, config);
}

result<std::unique_ptr<tokenizer>> load_tokenizer_json(const std::string& path) {
  CONVEYOR_TRY_ASSIGN(doc, read_tokenizer_json(path));
  return build_hf(path, doc, dir_config{});
}

}  // namespace conveyor::tokenizer
