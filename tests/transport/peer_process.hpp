#pragma once
// Runs transport_peer as a separate OS process and exchanges worker addresses with it over pipes.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "conveyor/transport/ucx_context.hpp"

namespace conveyor::transport::test {

inline std::string to_hex(const worker_address& a) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (auto b : a) {
    auto v = static_cast<unsigned>(b);
    s += digits[v >> 4];
    s += digits[v & 15];
  }
  return s;
}

inline worker_address from_hex(const std::string& s) {
  worker_address a;
  for (std::size_t i = 0; i + 1 < s.size(); i += 2) a.push_back(static_cast<std::byte>(std::stoi(s.substr(i, 2), nullptr, 16)));
  return a;
}

/// A child process running the transport_peer helper.
class peer_process {
 public:
  explicit peer_process(const std::vector<std::string>& args) {
    int to_child[2], from_child[2];
    if (::pipe(to_child) != 0 || ::pipe(from_child) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(to_child[0], 0);
      ::dup2(from_child[1], 1);
      ::close(to_child[1]);
      ::close(from_child[0]);
      std::vector<char*> argv;
      std::string exe = CONVEYOR_TRANSPORT_PEER;
      argv.push_back(exe.data());
      std::vector<std::string> copy = args;
      for (auto& a : copy) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(exe.c_str(), argv.data());
      ::_exit(127);
    }
    ::close(to_child[0]);
    ::close(from_child[1]);
    in_ = ::fdopen(to_child[1], "w");
    out_ = ::fdopen(from_child[0], "r");
  }
  ~peer_process() {
    kill();
    if (in_) std::fclose(in_);
    if (out_) std::fclose(out_);
  }

  /// The child's worker address (its first output line).
  worker_address address() {
    std::string line;
    int c;
    while (out_ && (c = std::fgetc(out_)) != EOF && c != '\n') line += static_cast<char>(c);
    return from_hex(line);
  }
  /// Gives the child our address; it connects after reading it.
  void send_address(const worker_address& a) {
    std::fprintf(in_, "%s\n", to_hex(a).c_str());
    std::fflush(in_);
  }
  void kill() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }
  /// Waits for the child to exit; its exit code, or -1 when killed by a signal.
  int wait() {
    int st = 0;
    ::waitpid(pid_, &st, 0);
    pid_ = -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  FILE* in_ = nullptr;
  FILE* out_ = nullptr;
};

}  // namespace conveyor::transport::test
