// The deployment as start-up log lines: every key, its value, and where the value came from.
#include <utility>
#include <vector>

#include "conveyor/config/deployment_loader.hpp"
#include "diagnostics.hpp"

namespace conveyor::config {
namespace {

using detail::quoted;

std::string num(double v) { return detail::format_number(v); }
std::string ints(const std::vector<int>& v) { return detail::format_ints(v); }

std::string sv(std::string_view v) { return quoted(v); }

}  // namespace

std::string describe(const deployment& d) {
  std::vector<std::pair<std::string, std::string>> kv;
  auto add = [&](std::string key, std::string value) { kv.emplace_back(std::move(key), std::move(value)); };
  add("model.dir", d.model.dir.empty() ? "(not set)" : sv(d.model.dir));
  add("model.dtype", sv(to_string(d.model.dtype)));
  add("model.device", sv(to_string(d.model.device)));
  add("model.quantization", sv(to_string(d.model.quantization)));
  add("model.quantize_lm_head", d.model.quantize_lm_head ? "true" : "false");
  add("model.draft", d.model.draft.empty() ? "(the model itself)" : sv(d.model.draft));
  add("model.draft_layers", d.model.draft_layers == 0 ? "0 (all)" : std::to_string(d.model.draft_layers));
  add("model.spec_k", d.model.spec_k == 0 ? "0 (no speculative decoding)" : std::to_string(d.model.spec_k));
  add("model.batch_invariant", std::string(batch_invariant(d.model) ? "true" : "false") +
                                   (d.model.batch_invariant ? "" : d.model.spec_k > 0 ? " (spec_k > 0)" : " (spec_k = 0)"));
  add("model.ngram_min", std::to_string(d.model.ngram_min));
  add("model.ngram_max", std::to_string(d.model.ngram_max));
  add("model.ngram_corpus", d.model.ngram_corpus.empty() ? "(none)" : sv(d.model.ngram_corpus));
  add("parallel.type", sv(to_string(d.parallel.type)));
  add("parallel.stages", std::to_string(d.parallel.stages));
  add("parallel.tp", std::to_string(d.parallel.tp));
  add("parallel.chunks", std::to_string(d.parallel.chunks));
  add("parallel.layers", d.parallel.layers.empty() ? "(even split)" : ints(d.parallel.layers));
  for (std::size_t i = 0; i < d.placement.hosts.size(); ++i) {
    const auto& h = d.placement.hosts[i];
    const std::string k = "placement.hosts[" + std::to_string(i) + "].";
    add(k + "name", sv(h.name));
    add(k + "address", sv(h.address));
    add(k + "gpus", h.gpus == 0 ? "0 (count at launch)" : std::to_string(h.gpus));
    add(k + "gpu_memory_gib", h.gpu_memory_gib == 0 ? "0 (unknown)" : num(h.gpu_memory_gib));
  }
  add("placement.nproc_per_node",
      d.placement.nproc_per_node == 0 ? "(not set)" : std::to_string(d.placement.nproc_per_node));
  add("placement.parallel_level",
      d.placement.parallel_level == 0 ? "(not set)" : std::to_string(d.placement.parallel_level));
  add("placement.device_ids", d.placement.device_ids.empty() ? "(all)" : ints(d.placement.device_ids));
  add("transport.ucx_tls", sv(d.transport.ucx_tls));
  add("transport.max_frame_bytes", std::to_string(d.transport.max_frame_bytes));
  add("cluster.listen", sv(to_string(d.cluster.listen)));
  // Never the token itself: these lines go to logs.
  add("cluster.token", d.cluster.token.empty()
                           ? "(not set)"
                           : "(hidden, " + std::to_string(d.cluster.token.size()) + " chars)");
  add("cluster.token_file", d.cluster.token_file.empty() ? "(not set)" : sv(d.cluster.token_file));
  add("cluster.heartbeat_interval_s", num(d.cluster.heartbeat_interval_s));
  add("cluster.heartbeat_timeout_s", num(d.cluster.heartbeat_timeout_s));
  add("cluster.recover_stages", d.cluster.recover_stages ? "true" : "false");
  add("cluster.max_stage_restarts", std::to_string(d.cluster.max_stage_restarts));
  add("frontend.rpc_listen", sv(to_string(d.frontend.rpc_listen)));
  add("frontend.http_listen", d.frontend.http_listen ? sv(to_string(*d.frontend.http_listen)) : "(off)");
  const auto& s = d.serving;
  add("serving.batching", sv(to_string(s.batching)));
  add("serving.max_batch_size", std::to_string(s.max_batch_size));
  add("serving.max_batch_delay_ms", std::to_string(s.max_batch_delay_ms));
  add("serving.max_batch_tokens", std::to_string(s.max_batch_tokens));
  add("serving.job_queue_size", std::to_string(s.job_queue_size));
  add("serving.max_queued_tokens",
      s.max_queued_tokens == 0 ? "0 (no cap)" : std::to_string(s.max_queued_tokens));
  add("serving.use_job_ticket", s.use_job_ticket ? "true" : "false");
  add("serving.prefix_caching", s.prefix_caching ? "true" : "false");
  add("serving.queued_steps", s.queued_steps ? "true" : "false");
  add("serving.response_timeout_s", num(s.response_timeout_s));
  add("serving.startup_timeout_s", num(s.startup_timeout_s));
  add("serving.min_workers", std::to_string(s.min_workers));
  add("serving.max_workers", std::to_string(s.max_workers));
  add("serving.kv_block_size", std::to_string(s.kv_block_size));
  add("serving.kv_blocks", s.kv_blocks == 0 ? "0 (cuda: from kv_memory_fraction; cpu: 512)" : std::to_string(s.kv_blocks));
  add("serving.kv_memory_fraction", num(s.kv_memory_fraction));
  add("serving.max_context", s.max_context == 0 ? "0 (the model's limit)" : std::to_string(s.max_context));
  add("serving.warm_up", s.warm_up ? "true" : "false");
  {
    const std::vector<int> w = warm_up_batches(d);
    add("serving.warm_up_batches", w.empty() ? std::string("[] (none)")
                                             : ints(w) + (s.warm_up_batches.empty() ? " (the device's default)" : ""));
  }
  add("launch.method", sv(to_string(d.launch.method)));
  add("launch.ssh_command", sv(d.launch.ssh_command));
  add("launch.srun_command", sv(d.launch.srun_command));
  add("launch.executable", d.launch.executable.empty() ? "(this binary)" : sv(d.launch.executable));

  std::string out;
  for (const auto& [key, value] : kv) {
    out += key + " = " + value + "  (" + detail::where(d, key) + ")\n";
  }
  return out;
}

}  // namespace conveyor::config
