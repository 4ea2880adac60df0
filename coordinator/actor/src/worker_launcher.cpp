#include "conveyor/coordinator/worker_launcher.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
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
  return spawn(full, env, nullptr, false);
}

result<pid_t> worker_launcher::launch(const process_spec& spec) {
  return spawn(spec.argv, spec.env, spec.stdin_text.empty() ? nullptr : &spec.stdin_text, true);
}

result<pid_t> worker_launcher::spawn(const std::vector<std::string>& args, const std::vector<std::string>& env,
                                     const std::string* stdin_text, bool own_group) {
  std::vector<std::string> full = args;
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
  sigaddset(&stops, SIGPIPE);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &stops);
  short flags = POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF;
  child c;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  int theirs = -1;
  if (stdin_text != nullptr) {
    // A socket, not a pipe: writing to it after the child died must not raise SIGPIPE here.
    int pair[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
      posix_spawnattr_destroy(&attr);
      posix_spawn_file_actions_destroy(&actions);
      return make_error(errc::io, std::string("cannot make a socket for a worker's stdin: ") + std::strerror(errno));
    }
    c.stdin_fd = pair[0];
    theirs = pair[1];
    posix_spawn_file_actions_adddup2(&actions, theirs, 0);
  }
  if (own_group) {
    // A process group of its own, so that stopping it reaches what it started (ssh or ip-netns-exec
    // under /bin/sh, the tasks of an srun stand-in), and a terminal's Ctrl-C reaches only us.
    flags |= POSIX_SPAWN_SETPGROUP;
    posix_spawnattr_setpgroup(&attr, 0);
    c.group = true;
  }
  posix_spawnattr_setflags(&attr, flags);
  const int rc = posix_spawn(&c.pid, full[0].c_str(), &actions, &attr, argv.data(), envp.data());
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&actions);
  if (theirs >= 0) ::close(theirs);
  if (rc != 0) {
    if (c.stdin_fd >= 0) ::close(c.stdin_fd);
    return make_error(errc::io, "cannot start " + full[0] + ": " + std::strerror(rc));
  }
  if (stdin_text != nullptr) {
    const char* p = stdin_text->data();
    std::size_t left = stdin_text->size();
    while (left > 0) {
      const ssize_t n = ::send(c.stdin_fd, p, left, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;  // it died already; poll_exit reports how
      p += n;
      left -= static_cast<std::size_t>(n);
    }
  }
  children_.push_back(c);
  return c.pid;
}

void worker_launcher::reap(child& c, bool block) {
  if (c.reaped) return;
  const pid_t r = ::waitpid(c.pid, &c.status, block ? 0 : WNOHANG);
  if (r == c.pid || (r < 0 && errno == ECHILD)) c.reaped = true;
}

namespace {
std::string how_it_ended(int status) {
  return WIFEXITED(status)     ? "exited with status " + std::to_string(WEXITSTATUS(status))
         : WIFSIGNALED(status) ? "was killed by signal " + std::to_string(WTERMSIG(status))
                               : "ended";
}
}  // namespace

std::optional<worker_launcher::exit_report> worker_launcher::poll_exit() {
  for (std::size_t i = 0; i < children_.size(); ++i) {
    auto& c = children_[i];
    reap(c, false);
    if (!c.reaped || c.reported) continue;
    c.reported = true;
    return exit_report{i, how_it_ended(c.status)};
  }
  return std::nullopt;
}

std::optional<std::string> worker_launcher::ended(pid_t pid) {
  for (auto it = children_.rbegin(); it != children_.rend(); ++it) {
    if (it->pid != pid) continue;
    reap(*it, false);
    if (!it->reaped) return std::nullopt;
    it->reported = true;
    return how_it_ended(it->status);
  }
  return std::nullopt;
}

std::vector<pid_t> worker_launcher::pids() const {
  std::vector<pid_t> out;
  for (const auto& c : children_) out.push_back(c.pid);
  return out;
}

void worker_launcher::stop_all(std::chrono::milliseconds grace) {
  auto wait_all = [&](std::chrono::steady_clock::time_point until) {
    for (;;) {
      bool all = true;
      for (auto& c : children_) {
        reap(c, false);
        all = all && c.reaped;
      }
      if (all || std::chrono::steady_clock::now() >= until) return all;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  };
  const auto now = std::chrono::steady_clock::now();
  bool done = wait_all(now + grace);
  // Closing their stdin tells workers behind ssh that we are gone (ssh forwards the end of input).
  for (auto& c : children_) {
    if (c.stdin_fd >= 0) ::close(c.stdin_fd);
    c.stdin_fd = -1;
  }
  if (!done && grace.count() > 0) done = wait_all(std::chrono::steady_clock::now() + std::chrono::milliseconds(500));
  if (!done) {
    for (auto& c : children_) {
      if (!c.reaped) ::kill(c.group ? -c.pid : c.pid, SIGTERM);
    }
    done = wait_all(std::chrono::steady_clock::now() + std::chrono::seconds(grace.count() > 0 ? 1 : 0));
  }
  for (auto& c : children_) {
    if (c.reaped) continue;
    ::kill(c.group ? -c.pid : c.pid, SIGKILL);
    reap(c, true);
  }
  children_.clear();
}

}  // namespace conveyor::coordinator
