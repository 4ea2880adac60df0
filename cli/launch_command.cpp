// conveyor launch FILE.toml: the coordinator in this process and every stage worker where the
// deployment places it: on this machine, through the ssh command template, or as one srun step.
// Start-up progress goes to stderr per host and stage; then it serves like `conveyor serve` until
// SIGINT or SIGTERM, and stops every process it started, on every host.
#include <cstdio>

#include "cluster_serving.hpp"
#include "command.hpp"
#include "conveyor/placement/memory_estimate.hpp"
#include "conveyor/placement/placement.hpp"
#include "conveyor/placement/plan_report.hpp"
#include "deployment_args.hpp"

namespace conveyor::cli {

namespace {

int fail(const std::string& message) {
  std::fprintf(stderr, "conveyor launch: %s\n", message.c_str());
  return 1;
}

coordinator::launch_method method_of(config::launch_method m) {
  switch (m) {
    case config::launch_method::ssh:
      return coordinator::launch_method::ssh;
    case config::launch_method::slurm:
      return coordinator::launch_method::slurm;
    case config::launch_method::local:
      break;
  }
  return coordinator::launch_method::local;
}

}  // namespace

int launch_main(const args& argv) {
  auto parsed = parse_file_and_flags(argv, {"http"});
  if (!parsed) return fail(parsed.err().message);
  auto loaded = load_deployment_and_model(parsed->first, parsed->second);
  if (!loaded) return fail(loaded.err().message);
  const auto& d = loaded->deployment;
  auto plan = placement::place(d, loaded->model);
  if (!plan) return fail(plan.err().message);
  // The same table as `conveyor plan`, and the same refusal when it does not fit. The coordinator's
  // host may hold only config.json: then the memory is checked by each worker as it loads.
  if (auto tensors = placement::read_tensor_shapes(d.model.dir)) {
    const auto memory = placement::estimate_memory(*plan, d, loaded->model, *tensors);
    std::fprintf(stderr, "%s", placement::format_plan(*plan, memory, d, loaded->model).c_str());
    if (auto fit = placement::check_fit(memory, *plan); !fit.ok()) return fail(fit.err().message);
  } else {
    std::fprintf(stderr, "conveyor launch: no memory estimate (%s)\n", tensors.err().message.c_str());
  }

  // Workers connect to cluster.listen's host: a wildcard says where to listen, not where to connect.
  const std::string& listen = d.cluster.listen.host;
  if (d.launch.method != config::launch_method::local && (listen == "0.0.0.0" || listen == "::")) {
    return fail("cluster.listen = \"" + config::to_string(d.cluster.listen) +
                "\": workers on other hosts connect to this address, so give this host's own address, not a "
                "wildcard");
  }
  auto options = cluster_options_of(d);
  if (!options) return fail(options.err().message);
  for (const auto& s : plan->stages) {
    const auto& h = plan->hosts[s.host];
    options->sites.push_back({h.name, h.address, plan->uses_gpus ? placement::visible_devices(s.gpus) : ""});
  }
  options->launch = method_of(d.launch.method);
  options->ssh_template = d.launch.ssh_command;
  options->srun_command = d.launch.srun_command;
  options->remote_executable = d.launch.executable;
  return serve_cluster("conveyor launch", d, *options, parsed->second.get("http"));
}

}  // namespace conveyor::cli
