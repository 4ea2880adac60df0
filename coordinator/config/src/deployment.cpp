#include "conveyor/config/deployment.hpp"

namespace conveyor::config {

int gpus_per_worker(const deployment& d) {
  if (d.placement.parallel_level > 0) return d.placement.parallel_level;
  if (d.placement.nproc_per_node > 0) return d.placement.nproc_per_node;
  return d.parallel.tp;
}

bool batch_invariant(const model_section& m) { return m.batch_invariant.value_or(m.spec_k > 0); }

std::vector<int> warm_up_batches(const deployment& d) {
  const serving_section& s = d.serving;
  if (!s.warm_up) return {};
  if (!s.warm_up_batches.empty()) return s.warm_up_batches;
  std::vector<int> v;
  if (d.model.device != device_kind::cuda) return v;
  for (int b = 1; b <= 64 && b <= s.max_batch_size; b *= 2) v.push_back(b);
  return v;
}

std::string ucx_tls_env(const transport_section& t) {
  if (t.ucx_tls == "auto") return {};
  // UCX's "sm" alias covers posix, sysv and cma; cma alone fails (STACK.md), so never narrow to it.
  if (t.ucx_tls == "shm") return "sm,self";
  if (t.ucx_tls == "tcp") return "tcp,self";
  return t.ucx_tls;
}

std::string_view to_string(model_dtype v) { return v == model_dtype::f32 ? "f32" : "bf16"; }
std::string_view to_string(device_kind v) { return v == device_kind::cpu ? "cpu" : "cuda"; }
std::string_view to_string(weight_quantization v) {
  return v == weight_quantization::int8 ? "int8" : v == weight_quantization::fp8 ? "fp8" : "none";
}

std::string_view to_string(parallel_type v) {
  switch (v) {
    case parallel_type::pp:
      return "pp";
    case parallel_type::tp:
      return "tp";
    case parallel_type::pptp:
      return "pptp";
    case parallel_type::custom:
      return "custom";
  }
  return "?";
}

std::string_view to_string(batching_mode v) {
  switch (v) {
    case batching_mode::continuous:
      return "continuous";
    case batching_mode::dynamic:
      return "dynamic";
    case batching_mode::fixed:
      return "static";
  }
  return "?";
}

std::string_view to_string(launch_method v) {
  switch (v) {
    case launch_method::local:
      return "local";
    case launch_method::ssh:
      return "ssh";
    case launch_method::slurm:
      return "slurm";
  }
  return "?";
}

}  // namespace conveyor::config
