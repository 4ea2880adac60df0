#include "conveyor/placement/memory_estimate.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "conveyor/engine/checkpoint.hpp"
#include "conveyor/engine/safetensors.hpp"
#include "conveyor/engine/tensor_parallel.hpp"

namespace conveyor::placement {

namespace {

namespace fs = std::filesystem;

/// Which part of a stage a tensor belongs to, and the share of it one TP rank holds.
struct tensor_role {
  enum class kind { layer, embedding, head, final_norm, other } what = kind::other;
  int layer = -1;
  double share = 1.0;  ///< fraction one rank holds
  bool row_parallel = false;  ///< o_proj / down_proj: a rank keeps every row, a slice of the columns
};

tensor_role role_of(const std::string& name, const engine::model_config& c, const engine::tp_layout& tp) {
  tensor_role r;
  if (name == "model.embed_tokens.weight") return {tensor_role::kind::embedding, -1, 1.0};
  if (name == "lm_head.weight") return {tensor_role::kind::head, -1, 1.0};
  if (name == "model.norm.weight") return {tensor_role::kind::final_norm, -1, 1.0};
  const std::string prefix = "model.layers.";
  if (name.compare(0, prefix.size(), prefix) != 0) return r;
  const std::size_t dot = name.find('.', prefix.size());
  if (dot == std::string::npos) return r;
  try {
    r.layer = std::stoi(name.substr(prefix.size(), dot - prefix.size()));
  } catch (...) {
    return r;
  }
  r.what = tensor_role::kind::layer;
  const std::string rest = name.substr(dot + 1);
  auto has = [&](const char* part) { return rest.find(part) != std::string::npos; };
  const bool bias = rest.size() >= 5 && rest.compare(rest.size() - 5, 5, ".bias") == 0;
  const double heads = static_cast<double>(tp.heads) / c.num_heads;
  const double kv = static_cast<double>(tp.kv_heads) / c.num_kv_heads;
  const double ffn = c.intermediate_size > 0 ? static_cast<double>(tp.ffn) / c.intermediate_size : 1.0;
  if (has("q_proj")) r.share = heads;
  else if (has("k_proj") || has("v_proj")) r.share = kv;
  else if (has("gate_proj") || has("up_proj")) r.share = ffn;
  else if (has("o_proj")) r.share = bias ? 1.0 : heads;      // row-parallel: rank 0 adds the bias
  else if (has("down_proj")) r.share = bias ? 1.0 : ffn;
  r.row_parallel = has("o_proj") || has("down_proj");
  return r;
}

}  // namespace

std::string format_bytes(std::uint64_t bytes) {
  char buf[32];
  const double b = static_cast<double>(bytes);
  if (b >= double(1ull << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", b / double(1ull << 30));
  else if (b >= double(1ull << 20)) std::snprintf(buf, sizeof buf, "%.1f MiB", b / double(1ull << 20));
  else std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  return buf;
}

result<std::vector<tensor_shape>> read_tensor_shapes(const std::string& model_dir) {
  // checkpoint::open validates the directory and the index (every shard present) first.
  if (auto ckpt = engine::checkpoint::open(model_dir); !ckpt) return ckpt.err();
  std::vector<std::string> files;
  const fs::path index = fs::path(model_dir) / "model.safetensors.index.json";
  std::error_code ec;
  if (fs::exists(index, ec)) {
    std::ifstream in(index);
    std::stringstream text;
    text << in.rdbuf();
    const auto j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
    for (const auto& [tensor, file] : j.at("weight_map").items()) {  // checked by checkpoint::open
      const std::string name = file.get<std::string>();
      if (std::find(files.begin(), files.end(), name) == files.end()) files.push_back(name);
    }
  } else {
    files.push_back("model.safetensors");
  }
  std::vector<tensor_shape> out;
  for (const auto& name : files) {
    CONVEYOR_TRY_ASSIGN(file, engine::safetensors_file::open((fs::path(model_dir) / name).string()));
    for (const auto& t : file.tensors()) out.push_back({t.name, t.shape});
  }
  return out;
}

memory_estimate estimate_memory(const placement_plan& plan, const config::deployment& d,
                                const engine::model_config& c, const std::vector<tensor_shape>& tensors) {
  memory_estimate m;
  const bool gpu = plan.uses_gpus;
  const std::uint64_t matrix_bytes = d.model.dtype == config::model_dtype::bf16 ? 2 : 4;
  const std::uint64_t kv_elem = matrix_bytes;  // the KV cache is kept in the compute dtype
  auto layout = engine::make_tp_layout(c, 0, plan.tp);
  engine::tp_layout tp = layout ? *layout : engine::tp_layout{0, 1, c.num_heads, 0, c.num_kv_heads, 0, 0, c.intermediate_size};

  // KV slots per stage: a fixed pool when kv_blocks is set, else the configured batch × context.
  const auto& s = d.serving;
  if (s.kv_blocks > 0) {
    m.kv_tokens = static_cast<std::int64_t>(s.kv_blocks) * s.kv_block_size;
    m.kv_basis = "serving.kv_blocks = " + std::to_string(s.kv_blocks) + " × kv_block_size " + std::to_string(s.kv_block_size);
  } else {
    const std::int64_t context = s.max_context > 0 ? s.max_context : c.max_position_embeddings;
    const std::int64_t blocks_per_seq = (context + s.kv_block_size - 1) / s.kv_block_size;
    m.kv_tokens = blocks_per_seq * s.kv_block_size * s.max_batch_size;
    m.kv_basis = "serving.max_batch_size " + std::to_string(s.max_batch_size) + " sequences × " +
                 std::to_string(context) + " tokens (serving.max_context)";
  }

  // Quantized matrices (model.quantization): one byte per element + a float32 scale per row of a rank.
  const bool quantized = d.model.quantization != config::weight_quantization::none;
  const bool head_q = quantized && d.model.quantize_lm_head;
  auto numel_of = [](const tensor_shape& t) {
    std::uint64_t numel = 1;
    for (auto dim : t.shape) numel *= static_cast<std::uint64_t>(std::max<std::int64_t>(dim, 0));
    return numel;
  };
  auto quantized_bytes = [&](const tensor_shape& t, const tensor_role& r) {
    const double rows = static_cast<double>(t.shape[0]) * (r.row_parallel ? 1.0 : r.share);
    return static_cast<std::uint64_t>(static_cast<double>(numel_of(t)) * r.share + 0.5) +
           static_cast<std::uint64_t>(rows + 0.5) * 4;
  };
  auto plain_bytes = [&](const tensor_shape& t, const tensor_role& r) {
    const std::uint64_t elem = t.shape.size() >= 2 ? matrix_bytes : 4;
    return static_cast<std::uint64_t>(static_cast<double>(numel_of(t)) * r.share + 0.5) * elem;
  };
  const bool has_lm_head = std::any_of(tensors.begin(), tensors.end(), [](const tensor_shape& t) { return t.name == "lm_head.weight"; });
  m.stages.resize(plan.stages.size());
  for (std::size_t k = 0; k < plan.stages.size(); ++k) {
    const auto& sp = plan.stages[k];
    const bool first = sp.stage == 0;
    const bool last = k + 1 == plan.stages.size();
    std::uint64_t bytes = 0;
    for (const auto& t : tensors) {
      const auto r = role_of(t.name, c, tp);
      const bool matrix = t.shape.size() >= 2;
      switch (r.what) {
        case tensor_role::kind::layer:
          if (r.layer >= sp.first_layer && r.layer < sp.last_layer) {
            bytes += quantized && matrix ? quantized_bytes(t, r) : plain_bytes(t, r);
          }
          break;
        case tensor_role::kind::embedding:
          // Never quantized. A tied head reads it too: shared on a stage that holds both (unless the
          // head is quantized: then it is a second, quantized copy); a last stage of its own without
          // lm_head.weight loads it again.
          if (first) bytes += plain_bytes(t, r);
          if (last && c.tie_word_embeddings && (head_q || !has_lm_head)) {
            if (head_q) bytes += quantized_bytes(t, r);
            else if (!first) bytes += plain_bytes(t, r);
          }
          break;
        case tensor_role::kind::head:
          if (last && !c.tie_word_embeddings) bytes += head_q ? quantized_bytes(t, r) : plain_bytes(t, r);
          break;
        case tensor_role::kind::final_norm:
          if (last) bytes += plain_bytes(t, r);
          break;
        case tensor_role::kind::other: break;
      }
    }
    m.stages[k].weight_bytes = bytes;
    m.stages[k].kv_bytes = 2ull * static_cast<std::uint64_t>(sp.num_layers()) * static_cast<std::uint64_t>(m.kv_tokens) *
                           static_cast<std::uint64_t>(tp.kv_heads) * static_cast<std::uint64_t>(c.head_dim) * kv_elem;
  }

  // Devices: each GPU of each host (several stages may share one), or each stage's process on cpu.
  std::map<std::pair<int, int>, std::size_t> index;
  for (std::size_t k = 0; k < plan.stages.size(); ++k) {
    const auto& sp = plan.stages[k];
    const std::vector<int> gpus = gpu && !sp.gpus.empty() ? sp.gpus : std::vector<int>{-1 - sp.stage};
    for (int g : gpus) {
      auto key = std::make_pair(sp.host, g);
      auto it = index.find(key);
      if (it == index.end()) {
        device_memory dm;
        dm.host = sp.host;
        dm.gpu = g < 0 ? -1 : g;
        dm.capacity_gib = gpu ? plan.hosts[sp.host].gpu_memory_gib : 0;
        it = index.emplace(key, m.devices.size()).first;
        m.devices.push_back(dm);
      }
      auto& dm = m.devices[it->second];
      dm.stages.push_back(sp.stage);
      dm.weight_bytes += m.stages[k].weight_bytes;
      dm.kv_bytes += m.stages[k].kv_bytes;
    }
  }
  return m;
}

status check_fit(const memory_estimate& m, const placement_plan& plan) {
  std::string lines;
  for (const auto& dm : m.devices) {
    if (dm.capacity_gib <= 0) continue;
    const auto capacity = static_cast<std::uint64_t>(dm.capacity_gib * double(1ull << 30));
    if (dm.total() <= capacity) continue;
    const auto& h = plan.hosts[dm.host];
    std::string stages;
    for (int s : dm.stages) stages += (stages.empty() ? "" : ", ") + std::to_string(s);
    lines += std::string(lines.empty() ? "" : "\n") + "host " + h.name + " GPU " + std::to_string(dm.gpu) + " (stage " +
             stages + ") needs " + format_bytes(dm.total()) + " (weights " + format_bytes(dm.weight_bytes) +
             " + KV cache " + format_bytes(dm.kv_bytes) + ") but has " + format_bytes(capacity) +
             (dm.weight_bytes > capacity
                  ? ": the weights alone do not fit; add pipeline stages or raise parallel.tp"
                  : ": lower serving.max_batch_size or serving.max_context (or set serving.kv_blocks), or add stages");
  }
  if (lines.empty()) return ok_status();
  return make_error(errc::out_of_memory, "the deployment does not fit in GPU memory:\n" + lines);
}

}  // namespace conveyor::placement
