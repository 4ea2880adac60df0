#pragma once
// Starts the processes that bring up stage workers (the workers themselves, ssh-style commands, or
// an srun step) and reaps them. No CAF here: the coordinator notices a worker's death through the
// actor monitor; this class owns the local processes and their stdin.
#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "conveyor/base/result.hpp"
#include "conveyor/coordinator/launch_spec.hpp"

namespace conveyor::coordinator {

class worker_launcher {
 public:
  /// `executable` is the conveyor binary (normally /proc/self/exe).
  explicit worker_launcher(std::string executable) : executable_(std::move(executable)) {}
  ~worker_launcher();
  worker_launcher(const worker_launcher&) = delete;
  worker_launcher& operator=(const worker_launcher&) = delete;

  /// Starts `conveyor worker` with `args` and extra `env` entries ("NAME=value", e.g. the cluster
  /// token, which stays out of the command line that `ps` shows); returns its pid.
  result<pid_t> launch(const std::vector<std::string>& args, const std::vector<std::string>& env = {});
  /// Starts `spec` in a process group of its own (so stopping it reaches what it started, such as
  /// ssh under /bin/sh). With spec.stdin_text, its stdin is a socket that receives the text and
  /// stays open until stop_all: a worker reading it sees the end when we go away.
  result<pid_t> launch(const process_spec& spec);

  /// A process that has exited: its index in launch order and how it ended ("exited with status 1",
  /// "killed by signal 9"). Each exit is reported once.
  struct exit_report {
    std::size_t index = 0;
    std::string how;
  };
  std::optional<exit_report> poll_exit();
  /// How process `pid` (one this launcher started) ended, once it has; nothing while it runs.
  std::optional<std::string> ended(pid_t pid);

  /// Waits up to `grace` for every process to exit, closes their stdin, then stops the rest
  /// (SIGTERM to their groups, SIGKILL a second later) and reaps them.
  void stop_all(std::chrono::milliseconds grace);
  std::vector<pid_t> pids() const;

 private:
  struct child {
    pid_t pid = 0;
    int stdin_fd = -1;  ///< our end of its stdin; -1 = none
    bool group = false; ///< leads a process group of its own
    bool reaped = false;
    bool reported = false;
    int status = 0;
  };
  result<pid_t> spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                      const std::string* stdin_text, bool own_group);
  void reap(child& c, bool block);

  std::string executable_;
  std::vector<child> children_;
};

}  // namespace conveyor::coordinator
