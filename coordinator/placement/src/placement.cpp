#include "conveyor/placement/placement.hpp"

#include <algorithm>
#include <limits>
#include <map>

#include "conveyor/config/deployment_loader.hpp"
#include "conveyor/engine/stage.hpp"

namespace conveyor::placement {

namespace {

/// "deploy.toml:12:3" for a key set in a file, "--stages" for a flag, "default" otherwise.
std::string where(const config::deployment& d, const std::string& key) {
  auto it = d.origins.find(key);
  if (it == d.origins.end()) return "default";
  const auto& p = it->second;
  if (p.line == 0) return p.source;
  return p.source + ":" + std::to_string(p.line) + ":" + std::to_string(p.column);
}

std::string per_worker_key(const config::deployment& d) {
  if (d.placement.parallel_level > 0) return "placement.parallel_level";
  if (d.placement.nproc_per_node > 0) return "placement.nproc_per_node";
  return "parallel.tp";
}

/// Usable GPU ids of a host, and how many workers fit on it (max() = not known, so no bound).
struct host_capacity {
  std::vector<int> usable;
  int workers = std::numeric_limits<int>::max();
  bool assumed = false;  ///< ids not given: assumed 0, 1, ... as far as needed
};

host_capacity capacity_of(const config::deployment& d, const config::host_entry& h, int per_worker) {
  host_capacity c;
  if (d.model.device != config::device_kind::cuda) return c;  // processes on a CPU host: no bound
  if (!d.placement.device_ids.empty()) {
    c.usable = d.placement.device_ids;
  } else if (h.gpus > 0) {
    for (int g = 0; g < h.gpus; ++g) c.usable.push_back(g);
  }
  // With gpus = 0 ("count at launch") the host is not bounded: the ids wrap around (TorchServe's
  // round-robin), or, with no ids at all, are assumed to exist.
  if (h.gpus > 0) c.workers = static_cast<int>(c.usable.size()) / per_worker;
  c.assumed = c.usable.empty();
  return c;
}

}  // namespace

std::string visible_devices(const std::vector<int>& gpus) {
  std::string s;
  for (std::size_t i = 0; i < gpus.size(); ++i) s += (i == 0 ? "" : ",") + std::to_string(gpus[i]);
  return s;
}

std::vector<std::vector<int>> round_robin(const std::vector<int>& usable, int per_worker, int workers) {
  std::vector<std::vector<int>> out(static_cast<std::size_t>(std::max(workers, 0)));
  if (usable.empty() || per_worker < 1) return out;
  const std::size_t n = usable.size();
  for (int w = 0; w < workers; ++w) {
    for (int i = 0; i < per_worker; ++i) {
      out[w].push_back(usable[(static_cast<std::size_t>(w) * per_worker + i) % n]);
    }
  }
  return out;
}

result<placement_plan> place(const config::deployment& d, const engine::model_config& model) {
  CONVEYOR_TRY(config::validate_against_model(d, model.num_layers, model.num_heads, model.num_kv_heads,
                                              model.max_position_embeddings));
  placement_plan plan;
  plan.hosts = d.placement.hosts;
  plan.tp = d.parallel.tp;
  plan.gpus_per_worker = config::gpus_per_worker(d);
  plan.uses_gpus = d.model.device == config::device_kind::cuda;
  if (plan.hosts.empty()) plan.hosts.push_back(config::host_entry{});
  const int stages = d.parallel.stages;
  const int per_worker = plan.gpus_per_worker;
  const std::string pw_key = per_worker_key(d);
  if (per_worker % plan.tp != 0) {  // the loader checks this too; a deployment built in code may not be checked
    return make_error(errc::invalid_argument, where(d, pw_key) + ": " + pw_key + " = " + std::to_string(per_worker) +
                                                  " is not a multiple of parallel.tp = " + std::to_string(plan.tp) +
                                                  ": a tensor-parallel group never spans workers");
  }
  const int stages_per_worker = per_worker / plan.tp;
  if (stages % stages_per_worker != 0) {
    return make_error(errc::invalid_argument,
                      where(d, "parallel.stages") + ": parallel.stages = " + std::to_string(stages) +
                          " does not fill workers of " + pw_key + " = " + std::to_string(per_worker) + " GPUs (" +
                          where(d, pw_key) + "), which hold " + std::to_string(stages_per_worker) +
                          " stages of tp " + std::to_string(plan.tp) + " each: make stages a multiple of " +
                          std::to_string(stages_per_worker) + ", or " + pw_key + " = " + std::to_string(plan.tp));
  }
  const int num_workers = stages / stages_per_worker;

  // How many workers each host takes: one at a time to every host with room, in order, so the
  // shares differ by at most one where capacity allows, and earlier hosts get the extra ones.
  std::vector<host_capacity> caps;
  for (const auto& h : plan.hosts) caps.push_back(capacity_of(d, h, per_worker));
  std::vector<int> share(plan.hosts.size(), 0);
  int left = num_workers;
  while (left > 0) {
    bool placed = false;
    for (std::size_t h = 0; h < plan.hosts.size() && left > 0; ++h) {
      if (share[h] < caps[h].workers) {
        ++share[h];
        --left;
        placed = true;
      }
    }
    if (placed) continue;
    std::string offer;
    for (std::size_t h = 0; h < plan.hosts.size(); ++h) {
      offer += (h == 0 ? "" : ", ") + plan.hosts[h].name + " fits " + std::to_string(caps[h].workers) + " (" +
               std::to_string(caps[h].usable.size()) + " usable GPUs)";
    }
    return make_error(errc::invalid_argument,
                      where(d, "parallel.stages") + ": the deployment needs " + std::to_string(num_workers) +
                          " workers of " + std::to_string(per_worker) +
                          " GPUs (" + std::to_string(stages) + " stages × tp " + std::to_string(plan.tp) +
                          "), but a worker's GPUs must be on one host and placement.hosts offer only " +
                          std::to_string(num_workers - left) + ": " + offer +
                          "; add hosts or GPUs, or lower parallel.stages, parallel.tp or " + pw_key);
  }

  engine::model_config shape = model;
  CONVEYOR_TRY_ASSIGN(ranges, d.parallel.layers.empty() ? engine::split_even(shape, stages)
                                                        : engine::split_explicit(shape, d.parallel.layers));
  int stage = 0;
  for (std::size_t h = 0; h < plan.hosts.size(); ++h) {
    if (share[h] == 0) {
      plan.notes.push_back("host " + plan.hosts[h].name + " (" + plan.hosts[h].address + ") runs no stage");
      continue;
    }
    std::vector<int> usable = caps[h].usable;
    if (plan.uses_gpus && caps[h].assumed) {
      for (int g = 0; g < share[h] * per_worker; ++g) usable.push_back(g);
      plan.notes.push_back("host " + plan.hosts[h].name + ": gpus = 0 and no placement.device_ids, so GPUs 0.." +
                           std::to_string(usable.size() - 1) + " are assumed to exist");
    }
    const auto blocks = plan.uses_gpus ? round_robin(usable, per_worker, share[h])
                                       : std::vector<std::vector<int>>(static_cast<std::size_t>(share[h]));
    if (plan.uses_gpus && share[h] * per_worker > static_cast<int>(usable.size())) {
      plan.notes.push_back("host " + plan.hosts[h].name + ": " + std::to_string(share[h] * per_worker) +
                           " GPUs wanted but only ids " + visible_devices(usable) +
                           " are usable, so workers share GPUs (round-robin)");
    }
    for (const auto& block : blocks) {
      worker_placement w;
      w.host = static_cast<int>(h);
      w.gpus = block;
      for (int s = 0; s < stages_per_worker; ++s, ++stage) {
        stage_placement sp;
        sp.stage = stage;
        sp.worker = static_cast<int>(plan.workers.size());
        sp.host = static_cast<int>(h);
        if (!block.empty()) sp.gpus.assign(block.begin() + s * plan.tp, block.begin() + (s + 1) * plan.tp);
        sp.first_layer = ranges[stage].first_layer;
        sp.last_layer = ranges[stage].last_layer;
        w.stages.push_back(stage);
        plan.stages.push_back(std::move(sp));
      }
      plan.workers.push_back(std::move(w));
    }
  }
  return plan;
}

}  // namespace conveyor::placement
