#pragma once
// Starts stage-worker processes (`conveyor worker ...`) on this host and reaps them. No CAF here:
// the coordinator notices a worker's death through the actor monitor; this class only owns the pids.
#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "conveyor/base/result.hpp"

namespace conveyor::coordinator {

class worker_launcher {
 public:
  /// `executable` is the conveyor binary (normally /proc/self/exe).
  explicit worker_launcher(std::string executable) : executable_(std::move(executable)) {}
  ~worker_launcher();

  /// Starts `conveyor worker` with `args` and extra `env` entries ("NAME=value", e.g. the cluster
  /// token, which stays out of the command line that `ps` shows); returns its pid.
  result<pid_t> launch(const std::vector<std::string>& args, const std::vector<std::string>& env = {});
  /// Waits up to `grace` for every worker to exit, then kills the rest (SIGKILL) and reaps them.
  void stop_all(std::chrono::milliseconds grace);
  const std::vector<pid_t>& pids() const { return pids_; }

 private:
  std::string executable_;
  std::vector<pid_t> pids_;
};

}  // namespace conveyor::coordinator
