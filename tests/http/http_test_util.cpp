#include "http_test_util.hpp"

#include <fstream>
#include <regex>
#include <sstream>

#include "conveyor/service/local_inference_service.hpp"
#include "tokenizer_test_util.hpp"

namespace conveyor::http::testing {

namespace fs = std::filesystem;

std::filesystem::path make_model_dir_with_tokenizer() {
  const fs::path src = fs::path(CONVEYOR_FIXTURES) / "tiny-llama";
  auto dir = tokenizer::testing::make_temp_dir("http-model");
  for (const char* f : {"config.json", "generation_config.json", "model.safetensors"}) {
    fs::create_symlink(fs::absolute(src / f), dir / f);
  }
  tokenizer::testing::write_file(dir / "tokenizer.json", tokenizer::testing::tiny_byte_level_json().dump());
  tokenizer::testing::write_file(dir / "tokenizer_config.json",
                                 R"({"chat_template": "{{ '<|start_header_id|>' + message['role'] }}",
                                     "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"})");
  return dir;
}

gateway_fixture::~gateway_fixture() {
  if (gateway.server) gateway.server->stop();
  gateway.server.reset();
  service.reset();
  if (!dir.empty()) fs::remove_all(dir);
}

std::unique_ptr<gateway_fixture> start_gateway(bool with_tokenizer, http_server_options options) {
  return start_gateway(with_tokenizer, std::move(options), service::local_service_options{});
}

std::unique_ptr<gateway_fixture> start_gateway(bool with_tokenizer, http_server_options options,
                                               service::local_service_options so) {
  auto f = std::make_unique<gateway_fixture>();
  f->dir = make_model_dir_with_tokenizer();
  if (!with_tokenizer) {
    fs::remove(f->dir / "tokenizer.json");
    fs::remove(f->dir / "tokenizer_config.json");
  }
  so.threads = 1;
  auto s = service::make_local_inference_service(f->dir.string(), so);
  if (!s) throw std::runtime_error(s.err().message);
  f->service = std::move(*s);
  options.listen = "127.0.0.1:0";
  if (options.model_name.empty()) options.model_name = "tiny-llama";
  std::string note;
  auto g = start_http_gateway(*f->service, f->dir.string(), options, note);
  if (!g) throw std::runtime_error(g.err().message);
  f->gateway = std::move(*g);
  return f;
}

std::vector<std::string> sse_events(const std::string& body) {
  std::vector<std::string> out;
  std::istringstream in(body);
  std::string line, data;
  while (std::getline(in, line)) {
    if (line.rfind("data: ", 0) == 0) data += line.substr(6);
    if (line.empty() && !data.empty()) {
      out.push_back(data);
      data.clear();
    }
  }
  if (!data.empty()) out.push_back(data);
  return out;
}

std::string check_prometheus(const std::string& page, std::map<std::string, double>& values) {
  static const std::regex sample(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*"(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*")*\})? (-?[0-9.]+(?:e[-+]?[0-9]+)?|NaN|\+Inf|-Inf)$)");
  static const std::regex type_line(R"(^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|summary|untyped)$)");
  std::map<std::string, std::string> types;
  std::istringstream in(page);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    std::smatch m;
    if (line.rfind("# HELP ", 0) == 0) continue;
    if (line.rfind("# TYPE ", 0) == 0) {
      if (!std::regex_match(line, m, type_line)) return "line " + std::to_string(n) + ": bad TYPE line: " + line;
      if (types.count(m[1])) return "line " + std::to_string(n) + ": second TYPE for " + m[1].str();
      types[m[1]] = m[2];
      continue;
    }
    if (line.empty() || line[0] == '#') return "line " + std::to_string(n) + ": unexpected: " + line;
    if (!std::regex_match(line, m, sample)) return "line " + std::to_string(n) + ": not a sample: " + line;
    std::string name = m[1];
    std::string family = name;
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string sfx = suffix;
      if (!types.count(family) && name.size() > sfx.size() && name.compare(name.size() - sfx.size(), sfx.size(), sfx) == 0) {
        family = name.substr(0, name.size() - sfx.size());
      }
    }
    if (!types.count(family)) return "line " + std::to_string(n) + ": sample before its TYPE: " + name;
    if (types[family] == "counter" && family.size() >= 6 && family.compare(family.size() - 6, 6, "_total") != 0) {
      return "counter " + family + " does not end in _total";
    }
    values[name + m[2].str()] = std::stod(m[3].str() == "+Inf" ? "inf" : m[3].str());
  }
  return "";
}

std::vector<golden_case> tiny_llama_goldens() {
  std::ifstream in(fs::path(CONVEYOR_FIXTURES) / "tiny-llama" / "golden.json");
  auto j = nlohmann::json::parse(in);
  std::vector<golden_case> out;
  for (const auto& p : j["prompts"]) {
    out.push_back({p["input_ids"].get<std::vector<std::int32_t>>(), p["greedy"].get<std::vector<std::int32_t>>()});
  }
  return out;
}

}  // namespace conveyor::http::testing
