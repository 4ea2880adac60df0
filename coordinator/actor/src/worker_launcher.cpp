#include "conveyor/coordinator/worker_launcher.hpp"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

extern char** environ;

namespace conveyor::coordinator {

worker_launcher::~worker_launcher() { stop_all(std::chrono::milliseconds(0)); }

result<pid_t> worker_launcher::launch(const std::vector<std::string>& args, const std::vector<std::string>& env) {
  std::vector<std::string> full = {executable_, "worker"};
  full.insert(full.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : full) argv.push_back(a.data());
  argv.push_back(nullptr);
  // Our entries first and the inherited ones without the names we set, so ours win.
  std::vector<std::string> env_strings(env.begin(), env.end());
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    const std::string name = entry.substr(0, entry.find('='));
    bool overridden = false;
    for (const auto& mine : env) overridden = overridden || mine.compare(0, name.size() + 1, name + "=") == 0;
    if (!overridden) env_strings.push_back(entry);
  }
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  // The server blocks SIGINT/SIGTERM to sigwait for them; a worker gets a clean mask and default
  // handlers so it can still be stopped by a signal.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, stops;
  sigemptyset(&none);
  sigemptyset(&stops);
  sigaddset(&stops, SIGINT);
  sigaddset(&stops, SIGTERM);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &stops);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, executable_.c_str(), nullptr, &attr, argv.data(), envp.data());
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return make_error(errc::io, "cannot start " + executable_ + " worker: " + std::strerror(rc));
  pids_.push_back(pid);
  return pid;
}

void worker_launcher::stop_all(std::chrono::milliseconds grace) {
  const auto until = std::chrono::steady_clock::now() + grace;
  for (pid_t pid : pids_) {
    int status = 0;
    for (;;) {
      const pid_t r = ::waitpid(pid, &status, WNOHANG);
      if (r == pid || (r < 0 && errno == ECHILD)) break;
      if (std::chrono::steady_clock::now() >= until) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  pids_.clear();
}

}  // namespace conveyor::coordinator
