#pragma once
// The processes `conveyor launch` starts on this machine to bring up every stage worker where the
// placement puts it: the worker itself (local), a command template such as "ssh {host} {command}"
// run by /bin/sh (ssh), or one srun step for all stages (slurm). Plain functions, no CAF and no
// processes, so the exact command lines are unit-tested; worker_launcher runs them.
//
// The cluster token never appears on a command line (`ps` shows those to every user): local workers
// get it in their environment, ssh workers on stdin (`--token-stdin`, which ssh forwards), and an
// srun step in its environment, which srun exports to its tasks.
#include <string>
#include <string_view>
#include <vector>

#include "conveyor/base/result.hpp"

namespace conveyor::coordinator {

/// Where one stage's worker runs.
struct worker_site {
  std::string host_name = "localhost";  ///< for progress lines and errors
  std::string address = "127.0.0.1";    ///< the worker binds and advertises this address
  std::string visible_devices;          ///< its CUDA_VISIBLE_DEVICES; empty = leave unset
};

enum class launch_method { local, ssh, slurm };

struct launch_settings {
  launch_method method = launch_method::local;
  std::string executable;   ///< the conveyor binary on the hosts
  std::string coordinator;  ///< HOST:PORT the workers join
  std::string ssh_template = "ssh {host} {command}";
  std::string srun_command = "srun";
  int threads = 0;                 ///< --threads of every worker
  double join_timeout_s = 5;       ///< how long a worker keeps trying to reach the coordinator
  /// local: the --address of workers whose site names none (`serve`: the coordinator's own address,
  /// so that their UCX listeners are on that interface only, not on every one); empty = none.
  std::string default_address;
};

/// One process to start here.
struct process_spec {
  std::vector<std::string> argv;  ///< argv[0] is the program (an absolute path)
  std::vector<std::string> env;   ///< "NAME=value" entries on top of ours
  std::string stdin_text;         ///< written to its stdin, which stays open for its life; empty = none
  std::vector<int> stages;        ///< the stages it brings up
  std::string label;              ///< "host w1 (10.0.0.2) stage 0", for messages
};

/// The processes that start `sites` (one per stage, in stage order) with `settings`.
result<std::vector<process_spec>> worker_processes(const launch_settings& settings,
                                                   const std::vector<worker_site>& sites, const std::string& token);

/// For each site, how many sites (itself included) share one of its GPUs: the same host and
/// overlapping CUDA_VISIBLE_DEVICES, where an empty list means every GPU of the host. Workers that
/// size their KV cache from free memory split it by this.
std::vector<int> gpu_sharers(const std::vector<worker_site>& sites);

/// `s` as one POSIX shell word: 'it'\''s'.
std::string shell_quote(std::string_view s);

/// Replaces {host}, {address}, {name} and {command} in `tmpl` (values inserted as they are given);
/// an unknown {placeholder} is an error that names it.
result<std::string> expand_template(std::string_view tmpl, const std::vector<std::pair<std::string, std::string>>& values);

/// The --placement value of `conveyor worker --slurm`: "name@address/gpus;..." in stage order.
std::string encode_sites(const std::vector<worker_site>& sites);
/// Its inverse; errors name the malformed entry.
result<std::vector<worker_site>> decode_sites(std::string_view text);

}  // namespace conveyor::coordinator
