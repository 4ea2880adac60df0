// conveyor batch: an offline JSONL file of requests through the in-process service or a cluster, as
// the deployment says, at full throughput; results in input order, resumable (see
// coordinator/service/include/conveyor/service/batch_runner.hpp for both formats).
#include <chrono>
#include <cstdio>
#include <future>
#include <memory>
#include <optional>
#include <string>

#include "cluster_serving.hpp"
#include "command.hpp"
#include "conveyor/config/deployment_loader.hpp"
#include "conveyor/coordinator/cluster.hpp"
#include "conveyor/engine/model_config.hpp"
#include "conveyor/service/batch_runner.hpp"
#include "conveyor/tokenizer/tokenizer.hpp"
#include "flags.hpp"
#include "progress_bar.hpp"
#include "serving_options.hpp"

namespace conveyor::cli {

namespace {

int fail(const std::string& message) {
  std::fprintf(stderr, "conveyor batch: %s\n", message.c_str());
  return 1;
}

/// A bar on a terminal, else a line every 10 seconds (progress_bar).
class progress_printer {
 public:
  explicit progress_printer(bool quiet) : bar_("conveyor batch", quiet) {}

  void operator()(const service::batch_progress& p) {
    char note[128];
    std::snprintf(note, sizeof note, "%lld errors  %lld retries  %.0f tok/s", static_cast<long long>(p.errors),
                  static_cast<long long>(p.retries), p.elapsed_s > 0 ? p.tokens / p.elapsed_s : 0.0);
    bar_.update(p.done, p.total - p.skipped, note);
  }

 private:
  progress_bar bar_;
};

/// One line of what the engine did (the KV cache, preemptions, steps, stage time): where a batch
/// ran slower than its steps should take, this says why (a preempting KV cache, idle stages).
std::string engine_summary(service::inference_service& svc) {
  auto reply = std::make_shared<std::promise<service::stats_report>>();
  auto got = reply->get_future();
  svc.stats([reply](service::stats_report r) { reply->set_value(std::move(r)); });
  if (got.wait_for(std::chrono::seconds(10)) != std::future_status::ready) return "engine: no stats (timed out)";
  const service::stats_report r = got.get();
  std::string out = "engine: KV cache " + std::to_string(r.kv_blocks_total) + " blocks, " +
                    std::to_string(r.preemptions) + " preemptions";
  for (std::size_t k = 0; k < r.stage_steps.size(); ++k) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "; stage %zu (at its last heartbeat): %lld steps, busy %.2f s, idle %.2f s", k,
                  static_cast<long long>(r.stage_steps[k]), k < r.stage_busy_s.size() ? r.stage_busy_s[k] : 0.0,
                  k < r.stage_idle_s.size() ? r.stage_idle_s[k] : 0.0);
    out += buf;
  }
  if (r.steps_queued_ahead > 0) out += "; " + std::to_string(r.steps_queued_ahead) + " steps queued ahead";
  return out;
}

}  // namespace

int batch_main(const args& argv) {
  auto f = flags::parse(argv, {"config", "input", "output", "model", "engine", "threads", "window", "quiet"}, {"quiet"});
  if (!f) return fail(f.err().message);
  auto config_file = f->get("config");
  auto input = f->get("input");
  auto output = f->get("output");
  if (!config_file || !input || !output) {
    return fail("usage: conveyor batch --config FILE.toml --input prompts.jsonl --output results.jsonl "
                "[--model DIR] [--engine auto|local|cluster] [--threads N] [--window N] [--quiet]");
  }
  auto dep = config::load_deployment(*config_file);
  if (!dep) return fail(dep.err().message);
  config::overrides ov;
  ov.model = f->get("model");
  if (auto st = config::apply_overrides(*dep, ov); !st.ok()) return fail(st.err().message);
  if (dep->model.dir.empty()) return fail("no model: set model.dir in the config or pass --model DIR");
  auto model = engine::load_model_config(dep->model.dir);
  if (!model) return fail(model.err().message);
  if (auto st = config::validate_against_model(*dep, model->num_layers, model->num_heads, model->num_kv_heads,
                                               model->max_position_embeddings);
      !st.ok()) {
    return fail(st.err().message);
  }
  auto threads = f->get_int("threads", 0, 0, 4096);
  if (!threads) return fail(threads.err().message);
  const std::string engine = f->get("engine").value_or("auto");
  if (engine != "auto" && engine != "local" && engine != "cluster") {
    return fail("--engine must be auto, local or cluster, got \"" + engine + "\"");
  }
  // In this process when one CPU process can run the deployment; else the cluster it describes.
  const bool one_process = dep->parallel.tp == 1 && dep->model.device == config::device_kind::cpu;
  if (engine == "local" && !one_process) {
    return fail("--engine local runs on the CPU without tensor parallelism; " + *config_file +
                " asks for model.device = \"" + std::string(config::to_string(dep->model.device)) +
                "\" and parallel.tp = " + std::to_string(dep->parallel.tp));
  }
  const bool local = engine == "local" || (engine == "auto" && one_process && dep->parallel.stages == 1);

  const auto& s = dep->serving;
  const int default_window = s.max_batch_size * dep->parallel.chunks +
                             std::min(s.max_batch_size, s.job_queue_size > 0 ? s.job_queue_size : s.max_batch_size);
  auto window = f->get_int("window", default_window, 1, 1 << 20);
  if (!window) return fail(window.err().message);
  service::batch_options bo;
  bo.window = static_cast<int>(*window);
  auto tok = tokenizer::load_tokenizer(dep->model.dir);
  if (tok) {
    bo.tokenizer = tok->get();
  } else if (tok.err().code != errc::not_found) {
    std::fprintf(stderr, "conveyor batch: no tokenizer (%s): lines need prompt_ids\n", tok.err().message.c_str());
  }
  progress_printer printer(f->has("quiet"));
  bo.on_progress = [&](const service::batch_progress& p) { printer(p); };

  std::unique_ptr<service::inference_service> local_service;
  std::unique_ptr<coordinator::cluster> cluster;
  service::inference_service* svc = nullptr;
  if (local) {
    auto made = service::make_local_inference_service(dep->model.dir,
                                                      local_service_options_of(*dep, static_cast<int>(*threads)));
    if (!made) return fail(made.err().message);
    local_service = std::move(*made);
    svc = local_service.get();
  } else {
    auto options = cluster_options_of(*dep);
    if (!options) return fail(options.err().message);
    options->worker_threads = static_cast<int>(*threads);
    std::fprintf(stderr, "conveyor batch: starting %d stage workers for %s\n", options->stages,
                 options->model_dir.c_str());
    options->on_progress = startup_progress_printer("conveyor batch", options->stages);
    auto started = coordinator::cluster::start(*options);
    if (!started) return fail(started.err().message);
    cluster = std::move(*started);
    svc = &cluster->service();
  }
  auto done = service::run_batch(*svc, *input, *output, bo);
  if (done) std::fprintf(stderr, "conveyor batch: %s\n", engine_summary(*svc).c_str());
  if (cluster) cluster->shutdown();
  if (!done) return fail(done.err().message);
  std::fprintf(stderr, "conveyor batch: %lld lines (%lld done before, %lld errors, %lld retries) in %.1f s, %.0f tok/s -> %s\n",
               static_cast<long long>(done->total), static_cast<long long>(done->skipped),
               static_cast<long long>(done->errors), static_cast<long long>(done->retries), done->elapsed_s,
               done->elapsed_s > 0 ? done->tokens / done->elapsed_s : 0.0, output->c_str());
  return done->errors > 0 ? 3 : 0;
}

}  // namespace conveyor::cli
