// TOML text → deployment: one function per section, each listing its keys with their rules. To add
// a key: a field in deployment.hpp, one `read` line here, a line in describe.cpp, a comment in configs/.
#include "conveyor/config/deployment_loader.hpp"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "resolve.hpp"
#include "toml_reader.hpp"

namespace conveyor::config {
namespace {

using detail::parse_context;
using detail::table_reader;
namespace rules = detail::rules;

std::string check_ucx_tls(std::string_view v) {
  if (v == "auto" || v == "tcp" || v == "shm") return {};
  // Otherwise a raw UCX_TLS list: "tcp,cma,posix", or "^ib" (UCX's syntax for "all but").
  const std::string_view list = v.substr(0, 1) == "^" ? v.substr(1) : v;
  bool token_empty = true;
  bool ok = true;
  for (char c : list) {
    if (c == ',') {
      ok = ok && !token_empty;
      token_empty = true;
    } else if (std::isalnum(static_cast<unsigned char>(c)) || c == '_') {
      token_empty = false;
    } else {
      ok = false;
    }
  }
  if (ok && !token_empty) return {};
  return "must be \"auto\", \"tcp\", \"shm\" or a UCX_TLS list of transport names such as \"tcp,cma,posix\"";
}

std::string check_ssh_command(std::string_view v) {
  if (v.find("{command}") == std::string_view::npos) {
    return "must contain {command} (the worker's command line), e.g. \"ssh -p 2222 {host} {command}\"";
  }
  for (std::size_t open = v.find('{'); open != std::string_view::npos; open = v.find('{', open + 1)) {
    const std::size_t close = v.find('}', open);
    const std::string_view name = close == std::string_view::npos ? v.substr(open) : v.substr(open, close - open + 1);
    if (name != "{host}" && name != "{address}" && name != "{name}" && name != "{command}") {
      return "has " + std::string(name) + ": the placeholders are {host} (= {address}), {name} and {command}";
    }
  }
  return {};
}

std::string check_host_string(std::string_view v) {
  std::string why = check_host(v);
  return why.empty() ? why : "must be a hostname or IP address without a port (" + why + ")";
}

void read_model(table_reader& r, model_section& m) {
  r.read("dir", m.dir);
  r.read_choice("dtype", m.dtype, {{"f32", model_dtype::f32}, {"bf16", model_dtype::bf16}});
  r.read_choice("device", m.device, {{"cpu", device_kind::cpu}, {"cuda", device_kind::cuda}});
  r.read_choice("quantization", m.quantization,
                {{"none", weight_quantization::none}, {"int8", weight_quantization::int8}, {"fp8", weight_quantization::fp8}});
  r.read("quantize_lm_head", m.quantize_lm_head);
  r.read("draft", m.draft);
  r.read("draft_layers", m.draft_layers, rules::draft_layers);
  r.read("spec_k", m.spec_k, rules::spec_k);
  bool invariant = false;
  if (r.read("batch_invariant", invariant)) m.batch_invariant = invariant;
  r.read("ngram_min", m.ngram_min, rules::ngram_n);
  r.read("ngram_max", m.ngram_max, rules::ngram_n);
  r.read("ngram_corpus", m.ngram_corpus);
}

void read_parallel(table_reader& r, parallel_section& p) {
  r.read_choice("type", p.type,
                {{"pp", parallel_type::pp},
                 {"tp", parallel_type::tp},
                 {"pptp", parallel_type::pptp},
                 {"custom", parallel_type::custom}});
  r.read("stages", p.stages, rules::stages);
  r.read("tp", p.tp, rules::tp);
  r.read("chunks", p.chunks, rules::chunks);
  r.read("layers", p.layers, rules::layer_count, /*unique=*/false);
}

void read_host(table_reader& r, host_entry& h) {
  // A forgotten address must not quietly become loopback on what is meant to be another machine.
  if (!r.has("address"))
    r.missing("address", "give the address workers on this host bind to, e.g. \"10.0.0.2\"");
  const bool has_address = r.read("address", h.address, check_host_string);
  if (!r.read("name", h.name) && has_address) h.name = h.address;
  r.read("gpus", h.gpus, rules::host_gpus);
  r.read("gpu_memory_gib", h.gpu_memory_gib, rules::gpu_memory_gib);
}

void read_placement(table_reader& r, placement_section& p, parse_context& ctx) {
  if (const toml::array* hosts = r.table_array("hosts")) {
    p.hosts.clear();
    for (std::size_t i = 0; i < hosts->size(); ++i) {
      table_reader hr(*hosts->get(i)->as_table(), r.path() + ".hosts[" + std::to_string(i) + "]", ctx);
      host_entry h;
      read_host(hr, h);
      hr.finish();
      p.hosts.push_back(std::move(h));
    }
  } else {
    // No hosts table to read, but its keys must still be known for "did you mean".
    parse_context scratch;
    const toml::table empty;
    table_reader hr(empty, r.path() + ".hosts[0]", scratch);
    host_entry ignored;
    read_host(hr, ignored);
    ctx.known.insert(ctx.known.end(), scratch.known.begin(), scratch.known.end());
  }
  r.read("nproc_per_node", p.nproc_per_node, rules::gpus_per_worker);
  r.read("parallel_level", p.parallel_level, rules::gpus_per_worker);
  r.read("device_ids", p.device_ids, rules::device_id, /*unique=*/true);
}

void read_transport(table_reader& r, transport_section& t) {
  r.read("ucx_tls", t.ucx_tls, check_ucx_tls);
  r.read("max_frame_bytes", t.max_frame_bytes, rules::max_frame_bytes);
}

void read_cluster(table_reader& r, cluster_section& c) {
  r.read("listen", c.listen);
  r.read("token", c.token);
  r.read("token_file", c.token_file);
  r.read("heartbeat_interval_s", c.heartbeat_interval_s, rules::seconds);
  r.read("heartbeat_timeout_s", c.heartbeat_timeout_s, rules::seconds);
  r.read("recover_stages", c.recover_stages);
  r.read("max_stage_restarts", c.max_stage_restarts, rules::max_stage_restarts);
}

void read_frontend(table_reader& r, frontend_section& f) {
  r.read("rpc_listen", f.rpc_listen);
  endpoint http;
  if (r.read("http_listen", http)) f.http_listen = http;
}

void read_serving(table_reader& r, serving_section& s) {
  r.read_choice("batching", s.batching,
                {{"continuous", batching_mode::continuous},
                 {"dynamic", batching_mode::dynamic},
                 {"static", batching_mode::fixed}});
  r.read("max_batch_size", s.max_batch_size, rules::max_batch_size);
  r.read("max_batch_delay_ms", s.max_batch_delay_ms, rules::max_batch_delay_ms);
  r.read("max_batch_tokens", s.max_batch_tokens, rules::max_batch_tokens);
  r.read("job_queue_size", s.job_queue_size, rules::job_queue_size);
  r.read("max_queued_tokens", s.max_queued_tokens, rules::max_queued_tokens);
  r.read("use_job_ticket", s.use_job_ticket);
  r.read("prefix_caching", s.prefix_caching);
  r.read("queued_steps", s.queued_steps);
  r.read("response_timeout_s", s.response_timeout_s, rules::seconds);
  r.read("startup_timeout_s", s.startup_timeout_s, rules::seconds);
  r.read("min_workers", s.min_workers, rules::workers);
  r.read("max_workers", s.max_workers, rules::workers);
  r.read("kv_block_size", s.kv_block_size, rules::kv_block_size);
  r.read("kv_blocks", s.kv_blocks, rules::kv_blocks);
  r.read("kv_memory_fraction", s.kv_memory_fraction, rules::fraction);
  r.read("max_context", s.max_context, rules::max_context);
  r.read("warm_up", s.warm_up);
  r.read("warm_up_batches", s.warm_up_batches, rules::max_batch_size, /*unique=*/true);
}

void read_launch(table_reader& r, launch_section& l) {
  r.read_choice(
      "method", l.method,
      {{"local", launch_method::local}, {"ssh", launch_method::ssh}, {"slurm", launch_method::slurm}});
  r.read("ssh_command", l.ssh_command, check_ssh_command);
  r.read("srun_command", l.srun_command);
  r.read("executable", l.executable, {}, /*allow_empty=*/true);
}

template <class Section, class Read>
void read_section(table_reader& top, std::string_view name, Section& section, parse_context& ctx, Read read) {
  // An absent table is read as an empty one, so that its keys are known to "did you mean".
  static const toml::table empty;
  const toml::table* t = top.table(name);
  table_reader r(t != nullptr ? *t : empty, std::string(name), ctx);
  read(r, section);
  r.finish();
}

// Other spellings users bring from torchrun, TorchServe, vLLM and friends (normalized: lower case,
// no '_' or '-'), so the message can point to our key.
constexpr std::pair<std::string_view, std::string_view> known_aliases[] = {
    {"pipelineparallelsize", "parallel.stages"},
    {"pipelineparallel", "parallel.stages"},
    {"ppsize", "parallel.stages"},
    {"tensorparallelsize", "parallel.tp"},
    {"tensorparallel", "parallel.tp"},
    {"tpsize", "parallel.tp"},
    {"microbatches", "parallel.chunks"},
    {"parallellevel", "placement.parallel_level"},
    {"nprocpernode", "placement.nproc_per_node"},
    {"deviceids", "placement.device_ids"},
    {"batchsize", "serving.max_batch_size"},
    {"maxbatchdelay", "serving.max_batch_delay_ms"},
    {"responsetimeout", "serving.response_timeout_s"},
    {"startuptimeout", "serving.startup_timeout_s"},
    {"minworkers", "serving.min_workers"},
    {"maxworkers", "serving.max_workers"},
    {"jobqueuesize", "serving.job_queue_size"},
    {"usejobticket", "serving.use_job_ticket"},
    {"enableprefixcaching", "serving.prefix_caching"},  // vLLM's --enable-prefix-caching
    {"cudagraphcapturesizes", "serving.warm_up_batches"},  // vLLM's cudagraph_capture_sizes
    {"devicetype", "model.device"},
    {"modeldir", "model.dir"},
    {"modelpath", "model.dir"},
};

std::string normalized(std::string_view word) {
  std::string out;
  for (char c : word) {
    if (c != '_' && c != '-') out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

// "did you mean" for an unknown key: first a near spelling in the same table, then the same name in
// another table (a key put under the wrong header), then a known alias.
std::string suggestion(const parse_context::unknown_key& u, const std::vector<std::string>& known) {
  const std::string leaf = u.path.substr(u.path.rfind('.') == std::string::npos ? 0 : u.path.rfind('.') + 1);
  std::vector<std::string> same_section;
  for (const auto& k : known) {
    const auto dot = k.rfind('.');
    const std::string section = dot == std::string::npos ? "" : k.substr(0, dot);
    const std::string k_leaf = dot == std::string::npos ? k : k.substr(dot + 1);
    if (section == u.section) same_section.push_back(k_leaf);
    if (section != u.section && normalized(k_leaf) == normalized(leaf)) return k;
  }
  if (std::string near = detail::closest(leaf, same_section); !near.empty()) {
    const auto dot = u.path.rfind('.');
    return dot == std::string::npos ? near : u.path.substr(0, dot + 1) + near;
  }
  for (const auto& [alias, key] : known_aliases) {
    if (normalized(leaf) == alias) return std::string(key);
  }
  return {};
}

void report_unknown(parse_context& ctx) {
  for (const auto& u : ctx.unknown) {
    std::vector<std::string> allowed;
    for (const auto& k : ctx.known) {
      const auto dot = k.rfind('.');
      const std::string section = dot == std::string::npos ? "" : k.substr(0, dot);
      const std::string leaf = dot == std::string::npos ? k : k.substr(dot + 1);
      if (section == u.section && std::find(allowed.begin(), allowed.end(), leaf) == allowed.end()) {
        allowed.push_back(leaf);
      }
    }
    std::string line = detail::format_position(u.position) + ": " + u.path + ": unknown key";
    if (std::string s = suggestion(u, ctx.known); !s.empty()) line += "; did you mean " + s + "?";
    // "placement.hosts[0].gpu" is in an array of tables: show its header as [[placement.hosts]].
    const bool in_array = u.path.size() > u.section.size() && u.path[u.section.size()] == '[';
    line += u.section.empty() ? " (allowed tables: "
            : in_array        ? " (allowed in [[" + u.section + "]]: "
                              : " (allowed in [" + u.section + "]: ";
    for (std::size_t i = 0; i < allowed.size(); ++i) line += (i == 0 ? "" : ", ") + allowed[i];
    ctx.diags.add(line + ")");
  }
}

}  // namespace

result<deployment> parse_deployment(std::string_view text, std::string_view source_name) {
  toml::table doc;
  try {
    doc = toml::parse(text, source_name);
  } catch (const toml::parse_error& e) {
    const source_position pos{std::string(source_name), static_cast<int>(e.source().begin.line),
                              static_cast<int>(e.source().begin.column)};
    return make_error(errc::bad_format,
                      detail::format_position(pos) + ": not valid TOML: " + std::string(e.description()));
  }

  deployment d;
  parse_context ctx;
  ctx.source = std::string(source_name);
  ctx.out = &d;
  table_reader top(doc, "", ctx);
  read_section(top, "model", d.model, ctx, read_model);
  read_section(top, "parallel", d.parallel, ctx, read_parallel);
  read_section(top, "placement", d.placement, ctx,
               [&](table_reader& r, placement_section& p) { read_placement(r, p, ctx); });
  read_section(top, "transport", d.transport, ctx, read_transport);
  read_section(top, "cluster", d.cluster, ctx, read_cluster);
  read_section(top, "frontend", d.frontend, ctx, read_frontend);
  read_section(top, "serving", d.serving, ctx, read_serving);
  read_section(top, "launch", d.launch, ctx, read_launch);
  top.finish();
  report_unknown(ctx);
  if (!ctx.diags.empty()) return ctx.diags.to_error(errc::invalid_argument);

  detail::resolve_defaults(d);
  CONVEYOR_TRY(check_deployment(d));
  return d;
}

result<deployment> load_deployment(const std::string& path) {
  // A directory opens and reads as empty, which would quietly mean "all defaults".
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return make_error(errc::invalid_argument, path + ": is a directory, not a deployment file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const bool exists = std::filesystem::exists(path);
    return make_error(exists ? errc::io : errc::not_found,
                      path + (exists ? ": cannot read the deployment file" : ": no such deployment file"));
  }
  std::ostringstream text;
  text << in.rdbuf();
  CONVEYOR_TRY_ASSIGN(d, parse_deployment(text.str(), path));

  // Paths in a config are relative to the config, not to wherever the command happens to run.
  const std::filesystem::path base = std::filesystem::path(path).parent_path();
  for (std::string* p : {&d.model.dir, &d.model.draft, &d.model.ngram_corpus, &d.cluster.token_file}) {
    if (p == &d.model.draft && *p == "ngram") continue;  // the n-gram proposer, not a directory
    if (!p->empty() && std::filesystem::path(*p).is_relative()) {
      *p = (base / *p).lexically_normal().string();
    }
  }
  return d;
}

}  // namespace conveyor::config
