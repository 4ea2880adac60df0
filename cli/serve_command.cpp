// conveyor serve: the coordinator, its stage-worker processes and the Cap'n Proto RPC frontend, from
// a deployment TOML file (--config) or defaults, with the most used keys as flags.
#include <cstdio>

#include "cluster_serving.hpp"
#include "command.hpp"
#include "conveyor/config/deployment_loader.hpp"
#include "conveyor/engine/model_config.hpp"
#include "flags.hpp"

namespace conveyor::cli {

namespace {

int fail(const std::string& message) {
  std::fprintf(stderr, "conveyor serve: %s\n", message.c_str());
  return 1;
}

}  // namespace

int serve_main(const args& argv) {
  auto f = flags::parse(argv, {"config", "model", "stages", "chunks", "tp", "listen", "http"});
  if (!f) return fail(f.err().message);
  auto dep = f->has("config") ? config::load_deployment(*f->get("config"))
                              : config::parse_deployment("", "<defaults>");
  if (!dep) return fail(dep.err().message);
  config::overrides ov;
  ov.model = f->get("model");
  ov.listen = f->get("listen");
  for (auto [name, slot] : {std::pair{"stages", &ov.stages}, {"chunks", &ov.chunks}, {"tp", &ov.tp}}) {
    if (!f->has(name)) continue;
    auto v = f->get_int(name, 1, 1, 1 << 16);
    if (!v) return fail(v.err().message);
    *slot = static_cast<int>(*v);
  }
  if (auto st = config::apply_overrides(*dep, ov); !st.ok()) return fail(st.err().message);
  if (dep->model.dir.empty()) return fail("no model: set model.dir in the config or pass --model DIR");
  auto model = engine::load_model_config(dep->model.dir);
  if (!model) return fail(model.err().message);
  if (auto st = config::validate_against_model(*dep, model->num_layers, model->num_heads, model->num_kv_heads,
                                               model->max_position_embeddings);
      !st.ok()) {
    return fail(st.err().message);
  }
  auto options = cluster_options_of(*dep);
  if (!options) return fail(options.err().message);
  return serve_cluster("conveyor serve", *dep, *options, f->get("http"));
}

}  // namespace conveyor::cli
