#include "deployment_args.hpp"

#include "conveyor/config/deployment_loader.hpp"

namespace conveyor::cli {

result<std::pair<std::string, flags>> parse_file_and_flags(const std::vector<std::string>& argv,
                                                           std::set<std::string> extra,
                                                           const std::set<std::string>& switches) {
  std::string file;
  std::vector<std::string> rest = argv;
  if (!rest.empty() && rest.front().rfind("--", 0) != 0) {
    file = rest.front();
    rest.erase(rest.begin());
  }
  for (const char* name : deployment_flags) extra.insert(name);
  CONVEYOR_TRY_ASSIGN(f, flags::parse(rest, extra, switches));
  if (auto c = f.get("config")) {
    if (!file.empty() && *c != file) {
      return make_error(errc::invalid_argument, "two deployment files: " + file + " and --config " + *c);
    }
    file = *c;
  }
  if (file.empty()) return make_error(errc::invalid_argument, "no deployment file: give FILE.toml (configs/ holds examples)");
  return std::pair<std::string, flags>(file, std::move(f));
}

result<loaded_deployment> load_deployment_and_model(const std::string& file, const flags& f) {
  loaded_deployment out;
  out.file = file;
  CONVEYOR_TRY_ASSIGN(d, config::load_deployment(file));
  config::overrides ov;
  ov.model = f.get("model");
  ov.listen = f.get("listen");
  for (auto [name, slot] : {std::pair{"stages", &ov.stages}, {"chunks", &ov.chunks}, {"tp", &ov.tp}}) {
    if (!f.has(name)) continue;
    CONVEYOR_TRY_ASSIGN(v, f.get_int(name, 1, 1, 1 << 16));
    *slot = static_cast<int>(v);
  }
  CONVEYOR_TRY(config::apply_overrides(d, ov));
  if (d.model.dir.empty()) {
    return make_error(errc::invalid_argument, file + ": no model: set model.dir or pass --model DIR");
  }
  CONVEYOR_TRY_ASSIGN(model, engine::load_model_config(d.model.dir));
  CONVEYOR_TRY(config::validate_against_model(d, model.num_layers, model.num_heads, model.num_kv_heads,
                                              model.max_position_embeddings));
  out.deployment = std::move(d);
  out.model = std::move(model);
  return out;
}

}  // namespace conveyor::cli
