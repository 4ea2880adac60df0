#pragma once
// Progress of long jobs on stderr (weights loading into the stages of a cluster, a batch file): on
// a terminal one bar redrawn in place, when stderr is a file or a pipe plain lines that a log keeps.
#include <chrono>
#include <cstdint>
#include <functional>
#include <regex>
#include <string>
#include <vector>

namespace conveyor::cli {

class progress_bar {
 public:
  /// `prefix` starts every line ("conveyor batch"). Off a terminal a line is printed at most once
  /// per `plain_every` (and always for the last update, done == total), since a log is not a display.
  explicit progress_bar(std::string prefix, bool quiet = false,
                        std::chrono::milliseconds plain_every = std::chrono::seconds(10));
  progress_bar(const progress_bar&) = delete;
  progress_bar& operator=(const progress_bar&) = delete;
  ~progress_bar() { finish(); }

  /// `note` follows the bar ("3 errors  250 tok/s").
  void update(std::int64_t done, std::int64_t total, const std::string& note);
  /// Ends the bar's line on a terminal (further output starts on a fresh line).
  void finish();
  bool on_terminal() const { return tty_; }

 private:
  std::string prefix_;
  bool quiet_, tty_;
  bool open_ = false;  ///< a bar is drawn and its line not ended
  std::chrono::milliseconds plain_every_;
  std::chrono::steady_clock::time_point shown_{};
};

/// Start-up of a cluster from the coordinator's progress lines ("stage 1: loading: loading layers
/// 2..3", "host w1 (10.0.0.2) stage 0: wired", "all 2 stages ready"): on a terminal one bar of the
/// steps every stage has passed (started, loading, loaded, wired, ready); else every line as it
/// comes, as `conveyor launch` has always printed them.
class startup_progress {
 public:
  startup_progress(std::string prefix, int stages);
  void operator()(const std::string& line);

 private:
  std::string prefix_;
  progress_bar bar_;
  std::vector<int> step_;  ///< per stage: 0 = nothing yet .. 5 = ready
  std::regex stage_line_{R"(stage (\d+): (started|loading|loaded|wired|ready|failed))"};
};

/// A startup_progress for cluster_options::on_progress (which must be copyable).
std::function<void(const std::string&)> startup_progress_printer(std::string prefix, int stages);

}  // namespace conveyor::cli
