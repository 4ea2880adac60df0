// Checks that relate keys to each other, and the defaults derived from other keys. Every message leads
// with the position of the key set last (the one a user most likely just changed) and names the other
// key with its own position, so both places can be found.
#include <algorithm>
#include <initializer_list>
#include <set>
#include <tuple>

#include "conveyor/config/deployment_loader.hpp"
#include "diagnostics.hpp"
#include "resolve.hpp"
#include "rules.hpp"

namespace conveyor::config {
namespace {

using detail::diagnostics;
using detail::is_set;
using detail::quoted;
using detail::where;

// Default < anything in a file (later lines later) < a flag.
std::tuple<int, int, int> recency(const deployment& d, std::string_view key) {
  auto it = d.origins.find(key);
  if (it == d.origins.end()) return {0, 0, 0};
  if (it->second.line == 0) return {2, 0, 0};
  return {1, it->second.line, it->second.column};
}

/// A message about several keys, led by the position of the latest of them.
class about {
 public:
  about(const deployment& d, std::initializer_list<std::string_view> keys) : d_(d) {
    std::string_view latest = *keys.begin();
    for (auto k : keys) {
      if (recency(d, k) > recency(d, latest)) latest = k;
    }
    lead_ = where(d, latest);
  }
  /// "key = value", with "(position)" when it is not the lead's position.
  std::string kv(std::string_view key, const std::string& value) const {
    std::string pos = where(d_, key);
    return std::string(key) + " = " + value + (pos == lead_ ? "" : " (" + pos + ")");
  }
  std::string line(const std::string& body) const { return lead_ + ": " + body; }

 private:
  const deployment& d_;
  std::string lead_;
};

std::string str(int v) { return std::to_string(v); }
std::string str(double v) { return detail::format_number(v); }
std::string str(std::string_view v) { return quoted(v); }
std::string list(const std::vector<int>& v) { return detail::format_ints(v); }

void check_exclusive_keys(const deployment& d, diagnostics& out) {
  const auto& p = d.placement;
  if (is_set(d, "placement.nproc_per_node") && is_set(d, "placement.parallel_level")) {
    about a(d, {"placement.nproc_per_node", "placement.parallel_level"});
    out.add(a.line(a.kv("placement.nproc_per_node", str(p.nproc_per_node)) + " and " +
                   a.kv("placement.parallel_level", str(p.parallel_level)) +
                   " are both set: set only one; both give the GPUs per worker (parallel_level is "
                   "TorchServe's name for torchrun's nproc_per_node)"));
  }
  if (is_set(d, "serving.kv_blocks") && is_set(d, "serving.kv_memory_fraction")) {
    about a(d, {"serving.kv_blocks", "serving.kv_memory_fraction"});
    out.add(a.line(a.kv("serving.kv_blocks", str(d.serving.kv_blocks)) + " and " +
                   a.kv("serving.kv_memory_fraction", str(d.serving.kv_memory_fraction)) +
                   " are both set: set only one; kv_blocks fixes the KV cache size, kv_memory_fraction "
                   "sizes it from free memory"));
  }
  if (is_set(d, "cluster.token") && is_set(d, "cluster.token_file")) {
    about a(d, {"cluster.token", "cluster.token_file"});
    out.add(a.line(a.kv("cluster.token", "(hidden)") + " and " +
                   a.kv("cluster.token_file", str(d.cluster.token_file)) + " are both set: set only one"));
  }
}

void check_parallel(const deployment& d, diagnostics& out) {
  const auto& p = d.parallel;
  if (p.type == parallel_type::pp && p.tp > 1) {
    about a(d, {"parallel.type", "parallel.tp"});
    out.add(a.line(a.kv("parallel.type", "\"pp\"") + " contradicts " + a.kv("parallel.tp", str(p.tp)) +
                   ": \"pp\" has no tensor parallelism; use type = \"pptp\" for stages of TP groups, "
                   "or tp = 1"));
  }
  if (p.type == parallel_type::tp && p.stages > 1) {
    about a(d, {"parallel.type", "parallel.stages"});
    out.add(a.line(a.kv("parallel.type", "\"tp\"") + " contradicts " +
                   a.kv("parallel.stages", str(p.stages)) +
                   ": \"tp\" is a single stage; use type = \"pptp\" for several stages, or stages = 1"));
  }
  if (!p.layers.empty() && static_cast<int>(p.layers.size()) != p.stages) {
    about a(d, {"parallel.layers", "parallel.stages"});
    out.add(a.line(a.kv("parallel.layers", list(p.layers)) + " has " +
                   str(static_cast<int>(p.layers.size())) + " entries but " +
                   a.kv("parallel.stages", str(p.stages)) +
                   ": give one layer count per stage, or leave layers out to split evenly"));
  }
  const int per_worker = gpus_per_worker(d);
  if (per_worker % p.tp != 0) {
    const char* key =
        is_set(d, "placement.parallel_level") ? "placement.parallel_level" : "placement.nproc_per_node";
    about a(d, {key, "parallel.tp"});
    out.add(a.line(a.kv(key, str(per_worker)) + " is not a multiple of " + a.kv("parallel.tp", str(p.tp)) +
                   ": a tensor-parallel group never spans workers"));
  }
}

void check_hosts(const deployment& d, diagnostics& out) {
  const auto& hosts = d.placement.hosts;
  std::set<std::string> names;
  std::set<std::string> addresses;
  bool remote = false;
  for (std::size_t i = 0; i < hosts.size(); ++i) {
    const std::string key = "placement.hosts[" + std::to_string(i) + "]";
    if (!names.insert(hosts[i].name).second) {
      out.add(where(d, key + ".name") + ": " + key + ".name = " + str(hosts[i].name) +
              ": another host has this name; names must be unique");
    }
    if (!addresses.insert(hosts[i].address).second) {
      out.add(where(d, key + ".address") + ": " + key + ".address = " + str(hosts[i].address) +
              ": another host has this address; list each machine once");
    }
    remote = remote || !is_loopback(hosts[i].address);
  }
  const bool multi_host = hosts.size() > 1;
  if ((multi_host || remote) && is_loopback(d.cluster.listen.host)) {
    about a(d, {"cluster.listen", "placement.hosts"});
    out.add(a.line(a.kv("cluster.listen", str(to_string(d.cluster.listen))) +
                   " is a loopback address, but placement.hosts lists " +
                   (multi_host ? std::string("several hosts") : "host " + str(hosts[0].address)) +
                   ": workers on other machines could not reach the coordinator; listen on an address "
                   "they can reach"));
  }
  if (multi_host && d.transport.ucx_tls == "shm") {
    about a(d, {"transport.ucx_tls", "placement.hosts"});
    out.add(a.line(
        a.kv("transport.ucx_tls", "\"shm\"") + " cannot connect the " + str(static_cast<int>(hosts.size())) +
        " hosts of placement.hosts: shared memory works within one machine; use \"auto\" or \"tcp\""));
  }
  if (multi_host && d.launch.method == launch_method::local) {
    about a(d, {"launch.method", "placement.hosts"});
    out.add(a.line(a.kv("launch.method", "\"local\"") +
                   " can only start processes on this machine, but "
                   "placement.hosts lists " +
                   str(static_cast<int>(hosts.size())) + " hosts: use method = \"ssh\" or \"slurm\""));
  }
}

void check_quantization(const deployment& d, diagnostics& out) {
  const auto& m = d.model;
  if (m.quantization == weight_quantization::fp8 && m.device == device_kind::cpu) {
    about a(d, {"model.quantization", "model.device"});
    out.add(a.line(a.kv("model.quantization", "\"fp8\"") + " needs " + a.kv("model.device", "\"cuda\"") +
                   ": FP8 E4M3 weights are a GPU format (the CPU backend has only a reference emulation for "
                   "tests); use \"int8\" on the CPU"));
  }
  if (m.quantize_lm_head && m.quantization == weight_quantization::none) {
    about a(d, {"model.quantize_lm_head", "model.quantization"});
    out.add(a.line(a.kv("model.quantize_lm_head", "true") + " needs " +
                   a.kv("model.quantization", "\"int8\" or \"fp8\"") + ", but it is \"none\""));
  }
}

void check_ngram(const deployment& d, diagnostics& out) {
  const auto& m = d.model;
  if (m.ngram_min > m.ngram_max) {
    about a(d, {"model.ngram_min", "model.ngram_max"});
    out.add(a.line(a.kv("model.ngram_min", std::to_string(m.ngram_min)) + " is above " +
                   a.kv("model.ngram_max", std::to_string(m.ngram_max))));
  }
  if (!m.ngram_corpus.empty() && m.draft != "ngram") {
    about a(d, {"model.ngram_corpus", "model.draft"});
    out.add(a.line(a.kv("model.ngram_corpus", str(std::string_view(m.ngram_corpus))) + " needs " +
                   a.kv("model.draft", "\"ngram\"")));
  }
  if (m.draft == "ngram" && m.draft_layers > 0) {
    about a(d, {"model.draft_layers", "model.draft"});
    out.add(a.line(a.kv("model.draft_layers", str(m.draft_layers)) + " applies to a draft model, not to " +
                   a.kv("model.draft", "\"ngram\"")));
  }
}

void check_gpus(const deployment& d, diagnostics& out) {
  const auto& p = d.placement;
  if (d.model.device == device_kind::cpu) {
    if (!p.device_ids.empty()) {
      about a(d, {"placement.device_ids", "model.device"});
      out.add(a.line(a.kv("placement.device_ids", list(p.device_ids)) + " needs " +
                     a.kv("model.device", "\"cuda\"") + ", but the device is \"cpu\""));
    }
    return;
  }
  const int per_worker = gpus_per_worker(d);
  int total = 0;
  int largest = 0;
  bool all_known = true;
  bool ids_fit = true;
  for (std::size_t i = 0; i < p.hosts.size(); ++i) {
    const auto& h = p.hosts[i];
    if (h.gpus == 0) {
      all_known = false;
      continue;
    }
    int usable = h.gpus;
    if (!p.device_ids.empty()) {
      const int beyond = *std::max_element(p.device_ids.begin(), p.device_ids.end());
      if (beyond >= h.gpus) {
        const std::string gpus_key = "placement.hosts[" + std::to_string(i) + "].gpus";
        about a(d, {"placement.device_ids", gpus_key});
        out.add(a.line(a.kv("placement.device_ids", list(p.device_ids)) + " names GPU " + str(beyond) +
                       ", but host " + str(h.name) + " has " + a.kv(gpus_key, str(h.gpus)) + " (ids 0 to " +
                       str(h.gpus - 1) + ")"));
        ids_fit = false;
        continue;
      }
      usable = static_cast<int>(p.device_ids.size());
    }
    total += usable;
    largest = std::max(largest, usable);
  }
  if (!all_known || !ids_fit) return;  // unknown counts are checked at launch, by the planner
  const int needed = d.parallel.stages * d.parallel.tp;
  if (needed > total) {
    about a(d, {"parallel.stages", "parallel.tp"});
    out.add(a.line(a.kv("parallel.stages", str(d.parallel.stages)) + " × " +
                   a.kv("parallel.tp", str(d.parallel.tp)) + " needs " + str(needed) +
                   " GPUs, but placement.hosts offers " + str(total) +
                   ": add hosts or GPUs, or lower stages or tp"));
  } else if (per_worker > largest) {
    about a(d, {"parallel.tp", "placement.hosts"});
    out.add(a.line("a worker needs " + str(per_worker) + " GPUs (" + a.kv("parallel.tp", str(d.parallel.tp)) +
                   "), but no host of placement.hosts has more than " + str(largest) +
                   " usable: a worker's GPUs must be on one host"));
  }
}

void check_serving(const deployment& d, diagnostics& out) {
  const auto& s = d.serving;
  if (s.min_workers > s.max_workers) {
    about a(d, {"serving.min_workers", "serving.max_workers"});
    out.add(a.line(a.kv("serving.min_workers", str(s.min_workers)) + " is more than " +
                   a.kv("serving.max_workers", str(s.max_workers)) + ": need min_workers <= max_workers"));
  }
  if (s.max_batch_tokens < s.max_batch_size) {
    about a(d, {"serving.max_batch_tokens", "serving.max_batch_size"});
    out.add(a.line(a.kv("serving.max_batch_tokens", str(s.max_batch_tokens)) + " is less than " +
                   a.kv("serving.max_batch_size", str(s.max_batch_size)) +
                   ": a decode step of a full batch takes one token per sequence"));
  }
  for (int b : s.warm_up_batches) {
    if (b > s.max_batch_size) {
      about a(d, {"serving.warm_up_batches", "serving.max_batch_size"});
      out.add(a.line(a.kv("serving.warm_up_batches", list(s.warm_up_batches)) + " has " + str(b) +
                     ", more than " + a.kv("serving.max_batch_size", str(s.max_batch_size)) +
                     ": a warm-up step holds at most a full batch"));
      break;
    }
  }
  if (!s.warm_up && !s.warm_up_batches.empty()) {
    about a(d, {"serving.warm_up", "serving.warm_up_batches"});
    out.add(a.line(a.kv("serving.warm_up", "false") + " contradicts " +
                   a.kv("serving.warm_up_batches", list(s.warm_up_batches)) +
                   ": leave warm_up_batches out to turn the warm-up off, or warm_up on to run them"));
  }
  if (s.kv_blocks > 0 && s.max_context > 0 &&
      static_cast<std::int64_t>(s.kv_blocks) * s.kv_block_size < s.max_context) {
    about a(d, {"serving.kv_blocks", "serving.kv_block_size", "serving.max_context"});
    out.add(a.line(a.kv("serving.kv_blocks", str(s.kv_blocks)) + " of " +
                   a.kv("serving.kv_block_size", str(s.kv_block_size)) +
                   " tokens cannot hold one sequence of " + a.kv("serving.max_context", str(s.max_context)) +
                   " tokens"));
  }
  const auto& c = d.cluster;
  if (c.heartbeat_timeout_s <= c.heartbeat_interval_s) {
    about a(d, {"cluster.heartbeat_timeout_s", "cluster.heartbeat_interval_s"});
    out.add(a.line(a.kv("cluster.heartbeat_timeout_s", str(c.heartbeat_timeout_s)) + " must be longer than " +
                   a.kv("cluster.heartbeat_interval_s", str(c.heartbeat_interval_s)) +
                   " (a few intervals, so one late heartbeat is not a death)"));
  }
}

void check_ports(const deployment& d, diagnostics& out) {
  struct listener {
    const char* key;
    endpoint e;
  };
  std::vector<listener> ls{{"cluster.listen", d.cluster.listen},
                           {"frontend.rpc_listen", d.frontend.rpc_listen}};
  if (d.frontend.http_listen) ls.push_back({"frontend.http_listen", *d.frontend.http_listen});
  for (std::size_t i = 0; i < ls.size(); ++i) {
    for (std::size_t j = i + 1; j < ls.size(); ++j) {
      // A wildcard address takes the port on every interface, so it clashes with any host.
      const auto wildcard = [](const endpoint& e) { return e.host == "0.0.0.0" || e.host == "::"; };
      const bool same_host = ls[i].e.host == ls[j].e.host || wildcard(ls[i].e) || wildcard(ls[j].e);
      if (ls[i].e.port != 0 && ls[i].e.port == ls[j].e.port && same_host) {
        about a(d, {ls[i].key, ls[j].key});
        out.add(a.line(a.kv(ls[i].key, str(to_string(ls[i].e))) + " and " +
                       a.kv(ls[j].key, str(to_string(ls[j].e))) +
                       " share a port: each listener needs its own"));
      }
    }
  }
}

}  // namespace

namespace detail {

void resolve_defaults(deployment& d) {
  if (!is_set(d, "model.dtype")) {
    d.model.dtype = d.model.device == device_kind::cuda ? model_dtype::bf16 : model_dtype::f32;
  }
  auto& p = d.parallel;
  if (!is_set(d, "parallel.type")) {
    p.type = p.stages > 1 && p.tp > 1 ? parallel_type::pptp
             : p.tp > 1               ? parallel_type::tp
                                      : parallel_type::pp;
  }
  // One microbatch per stage is the fewest that keeps every stage busy once the pipeline is full.
  if (!is_set(d, "parallel.chunks")) p.chunks = p.stages;
  if (d.placement.hosts.empty()) d.placement.hosts.push_back(host_entry{});
}

}  // namespace detail

status check_deployment(const deployment& d) {
  diagnostics out;
  check_exclusive_keys(d, out);
  check_parallel(d, out);
  check_hosts(d, out);
  check_gpus(d, out);
  check_quantization(d, out);
  check_ngram(d, out);
  check_serving(d, out);
  check_ports(d, out);
  if (out.empty()) return ok_status();
  return out.to_error(errc::invalid_argument);
}

}  // namespace conveyor::config
