#include "conveyor/engine/memory_plan.hpp"

#include <algorithm>
#include <cstdio>

#include "conveyor/engine/kv_cache.hpp"

namespace conveyor::engine {

namespace {
std::string gib(std::size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1ull << 30));
  return buf;
}
std::string percent(double fraction) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g%%", fraction * 100);
  return buf;
}
}  // namespace

std::size_t estimate_weight_bytes(std::size_t w, const model_config& c, stage_range range,
                                  const weight_quant_options& quant) {
  const std::size_t f32 = 4;
  const std::size_t h = c.hidden_size, f = c.intermediate_size, v = c.vocab_size;
  const std::size_t q = static_cast<std::size_t>(c.num_heads) * c.head_dim;
  const std::size_t kv = static_cast<std::size_t>(c.num_kv_heads) * c.head_dim;
  const bool quantized = quant.kind != kernels::weight_quant::none;
  // A rows × cols matrix of the linear layers, as stage_weights stores it.
  auto matrix = [&](std::size_t rows, std::size_t cols, bool quantize) {
    return quantize ? kernels::quantized_matrix_bytes(rows, cols) : rows * cols * w;
  };
  std::size_t per_layer = matrix(q + 2 * kv, h, quantized) + matrix(h, q, quantized) + matrix(2 * f, h, quantized) +
                          matrix(h, f, quantized);  // qkv, o, gate_up, down
  per_layer += 2 * h * f32;                         // two norms
  if (c.qkv_bias) per_layer += (q + 2 * kv) * f32;
  if (c.o_bias) per_layer += h * f32;
  if (c.mlp_bias) per_layer += (2 * f + h) * f32;
  std::size_t bytes = per_layer * static_cast<std::size_t>(range.num_layers());
  if (range.has_embedding) bytes += v * h * w;  // never quantized
  if (range.has_head) {
    const bool head_q = quantized && quant.lm_head;
    // A tied head shares the embedding only when the same stage holds both and it is not quantized.
    const bool shared = c.tie_word_embeddings && range.has_embedding && !head_q;
    bytes += h * f32 + (shared ? 0 : matrix(v, h, head_q));
  }
  return bytes;
}

std::size_t estimate_weight_bytes(const kernels::backend& backend, const model_config& c, stage_range range,
                                  const weight_quant_options& quant) {
  return estimate_weight_bytes(kernels::dtype_size(backend.caps().weight_dtype), c, range, quant);
}

std::size_t estimate_workspace_bytes(const kernels::backend& backend, const model_config& c, stage_range range,
                                     const executor_options& o) {
  // Mirrors stage_executor::create's buffers.
  const std::size_t act = kernels::dtype_size(backend.caps().act_dtype);
  const std::size_t t = o.max_step_tokens, h = c.hidden_size, f = c.intermediate_size;
  const std::size_t qkv_w = static_cast<std::size_t>(c.num_heads + 2 * c.num_kv_heads) * c.head_dim;
  const std::size_t attn_w = static_cast<std::size_t>(c.num_heads) * c.head_dim;
  std::size_t bytes = 3 * t * h * act;
  if (range.num_layers() > 0) bytes += t * (qkv_w + attn_w + 3 * f) * act;
  if (range.has_head) bytes += t * (h + static_cast<std::size_t>(c.vocab_size)) * act;
  const std::size_t max_ctx = std::max(c.max_position_embeddings, o.kv_block_size);
  const std::size_t table = static_cast<std::size_t>(o.max_seqs) * ((max_ctx + o.kv_block_size - 1) / o.kv_block_size);
  bytes += (4 * t + 2 * static_cast<std::size_t>(o.max_seqs) + 1 + table) * sizeof(std::int32_t);
  // Each allocation may be rounded up to the allocator's granularity.
  constexpr std::size_t per_alloc_slack = 2u << 20;
  return bytes + 12 * per_alloc_slack;
}

std::string memory_plan::describe() const {
  return "KV cache " + std::to_string(kv_blocks) + " blocks (" + gib(kv_bytes) + ") after weights " +
         gib(weight_bytes) + " and workspace " + gib(workspace_bytes) + ", of " + gib(free_bytes) + " free (" +
         gib(total_bytes) + " total)";
}

result<memory_plan> plan_memory(kernels::backend& backend, const model_config& config,
                                const std::vector<stage_range>& ranges, const executor_options& options,
                                const memory_plan_options& po) {
  if (!(po.kv_fraction > 0.0 && po.kv_fraction <= 1.0)) {
    return make_error(errc::invalid_argument, "the KV cache's memory fraction must be in (0, 1]");
  }
  if (options.kv_block_size < 1) return make_error(errc::invalid_argument, "the KV block size must be positive");
  memory_plan p;
  backend.memory_info(&p.free_bytes, &p.total_bytes);
  std::size_t per_block = 0;
  for (const auto& r : ranges) {
    p.weight_bytes += estimate_weight_bytes(backend, config, r, options.quant);
    p.workspace_bytes += estimate_workspace_bytes(backend, config, r, options);
    per_block += kv_pools::bytes_per_block(backend, r.num_layers(), options.kv_block_size, config.num_kv_heads,
                                           config.head_dim);
  }
  const std::size_t fixed = p.weight_bytes + p.workspace_bytes;
  const std::string where = backend.caps().name + " memory";
  if (fixed > p.free_bytes) {
    return make_error(errc::out_of_memory, "the model does not fit in " + where + ": weights need " +
                                               gib(p.weight_bytes) + " and the step workspace " +
                                               gib(p.workspace_bytes) + ", only " + gib(p.free_bytes) + " is free");
  }
  if (per_block == 0) {  // a stage without layers holds no KV
    p.kv_blocks = std::max(po.min_blocks, 1);
    return p;
  }
  const double budget = static_cast<double>(p.free_bytes - fixed) * po.kv_fraction;
  const double fit = budget / static_cast<double>(per_block);
  long long blocks = static_cast<long long>(fit);
  if (po.max_blocks > 0) blocks = std::min<long long>(blocks, po.max_blocks);
  blocks = std::min<long long>(blocks, 1 << 30);
  if (blocks < po.min_blocks) {
    return make_error(errc::out_of_memory,
                      "the KV cache does not fit in " + where + ": " + std::to_string(po.min_blocks) +
                          " blocks of " + std::to_string(options.kv_block_size) + " tokens need " +
                          gib(per_block * static_cast<std::size_t>(po.min_blocks)) + ", but after weights (" +
                          gib(p.weight_bytes) + ") and workspace (" + gib(p.workspace_bytes) + ") " +
                          percent(po.kv_fraction) + " of the free " +
                          gib(p.free_bytes - fixed) + " holds " + std::to_string(std::max(0LL, blocks)));
  }
  p.kv_blocks = static_cast<int>(blocks);
  p.kv_bytes = per_block * static_cast<std::size_t>(blocks);
  return p;
}

}  // namespace conveyor::engine
