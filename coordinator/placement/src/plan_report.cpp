#include "conveyor/placement/plan_report.hpp"

#include <algorithm>
#include <cstdio>
#include <vector>

namespace conveyor::placement {

namespace {

/// Left-aligned columns, two spaces apart.
class table {
 public:
  void row(std::vector<std::string> cells) { rows_.push_back(std::move(cells)); }
  std::string str() const {
    std::vector<std::size_t> width;
    for (const auto& r : rows_) {
      width.resize(std::max(width.size(), r.size()), 0);
      for (std::size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
    }
    std::string out;
    for (const auto& r : rows_) {
      std::string line;
      for (std::size_t i = 0; i < r.size(); ++i) {
        line += r[i];
        if (i + 1 < r.size()) line += std::string(width[i] - r[i].size() + 2, ' ');
      }
      out += line + "\n";
    }
    return out;
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

std::string layers_of(const stage_placement& s) {
  const int n = s.num_layers();
  return std::to_string(s.first_layer) + "-" + std::to_string(s.last_layer - 1) + " (" + std::to_string(n) +
         (n == 1 ? " layer)" : " layers)");
}

}  // namespace

std::string format_plan(const placement_plan& plan, const memory_estimate& memory, const config::deployment& d,
                        const engine::model_config& model) {
  std::string out;
  out += "model: " + d.model.dir + " (" + model.model_type + ", " + std::to_string(model.num_layers) + " layers, " +
         std::string(config::to_string(d.model.dtype)) + " on " + std::string(config::to_string(d.model.device)) + ")\n";
  out += "parallel: " + std::string(config::to_string(d.parallel.type)) + ", " + std::to_string(plan.stages.size()) +
         " stages × tp " + std::to_string(plan.tp) + "; " + std::to_string(plan.workers.size()) + " workers";
  if (plan.uses_gpus) out += " of " + std::to_string(plan.gpus_per_worker) + " GPUs";
  out += " on " + std::to_string(plan.hosts.size()) + (plan.hosts.size() == 1 ? " host" : " hosts") + "; launch " +
         std::string(config::to_string(d.launch.method)) + "\n\n";

  table stages;
  stages.row({"stage", "host", "address", "worker", "CUDA_VISIBLE_DEVICES", "layers", "weights/rank", "KV/rank"});
  for (std::size_t k = 0; k < plan.stages.size(); ++k) {
    const auto& s = plan.stages[k];
    const auto& h = plan.hosts[s.host];
    stages.row({std::to_string(s.stage), h.name, h.address, std::to_string(s.worker),
                plan.uses_gpus ? visible_devices(s.gpus) : "(cpu)", layers_of(s),
                format_bytes(memory.stages[k].weight_bytes), format_bytes(memory.stages[k].kv_bytes)});
  }
  out += stages.str();

  out += "\nmemory per " + std::string(plan.uses_gpus ? "GPU" : "stage process") + ": weights + KV cache for " +
         std::to_string(memory.kv_tokens) + " tokens per stage (" + memory.kv_basis +
         "); the step workspace and libraries come on top\n";
  table devices;
  devices.row({"host", plan.uses_gpus ? "GPU" : "process", "stages", "weights", "KV cache", "total", "capacity"});
  for (const auto& dm : memory.devices) {
    std::string stage_list;
    for (int s : dm.stages) stage_list += (stage_list.empty() ? "" : ",") + std::to_string(s);
    std::string capacity = "unknown";
    if (dm.capacity_gib > 0) {
      const double cap = dm.capacity_gib * double(1ull << 30);
      char pct[32];
      std::snprintf(pct, sizeof pct, "%.0f%%", 100.0 * static_cast<double>(dm.total()) / cap);
      capacity = format_bytes(static_cast<std::uint64_t>(cap)) + " (" + pct + " used" +
                 (static_cast<double>(dm.total()) > cap ? ", DOES NOT FIT)" : ")");
    } else if (plan.uses_gpus) {
      capacity = "unknown (set placement.hosts[].gpu_memory_gib to check)";
    } else {
      capacity = "host memory";
    }
    devices.row({plan.hosts[dm.host].name, dm.gpu >= 0 ? std::to_string(dm.gpu) : "stage " + stage_list, stage_list,
                 format_bytes(dm.weight_bytes), format_bytes(dm.kv_bytes), format_bytes(dm.total()), capacity});
  }
  out += devices.str();
  for (const auto& n : plan.notes) out += "note: " + n + "\n";
  return out;
}

}  // namespace conveyor::placement
