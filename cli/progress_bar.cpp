#include "progress_bar.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <numeric>

namespace conveyor::cli {

progress_bar::progress_bar(std::string prefix, bool quiet, std::chrono::milliseconds plain_every)
    : prefix_(std::move(prefix)), quiet_(quiet), tty_(isatty(STDERR_FILENO) != 0), plain_every_(plain_every) {}

void progress_bar::update(std::int64_t done, std::int64_t total, const std::string& note) {
  if (quiet_) return;
  const auto now = std::chrono::steady_clock::now();
  const bool last = done >= total;
  const auto every = tty_ ? std::chrono::milliseconds(100) : plain_every_;
  if (!last && shown_.time_since_epoch().count() != 0 && now - shown_ < every) return;
  shown_ = now;
  constexpr int width = 30;
  const int filled = total > 0 ? static_cast<int>(width * std::min(done, total) / total) : width;
  std::string bar(filled, '#');
  bar.append(width - filled, '-');
  // "\r" + "\033[K": back to the start of the line and clear it, so a shorter note leaves no tail.
  std::fprintf(stderr, "%s%s: [%s] %lld/%lld  %s%s", tty_ ? "\r\033[K" : "", prefix_.c_str(), bar.c_str(),
               static_cast<long long>(done), static_cast<long long>(total), note.c_str(), tty_ ? "" : "\n");
  open_ = tty_;
  if (last) finish();
  std::fflush(stderr);
}

void progress_bar::finish() {
  if (!open_) return;
  std::fputc('\n', stderr);
  std::fflush(stderr);
  open_ = false;
}

startup_progress::startup_progress(std::string prefix, int stages)
    : prefix_(prefix), bar_(std::move(prefix) + ": start-up"), step_(static_cast<std::size_t>(stages), 0) {}

void startup_progress::operator()(const std::string& line) {
  static constexpr const char* steps[] = {"started", "loading", "loaded", "wired", "ready"};
  std::smatch m;
  bool failed = false;
  if (std::regex_search(line, m, stage_line_)) {
    const auto k = static_cast<std::size_t>(std::stoul(m[1].str()));
    failed = m[2] == "failed";
    for (int i = 0; i < 5; ++i) {
      if (k < step_.size() && m[2] == steps[i]) step_[k] = std::max(step_[k], i + 1);
    }
  } else if (line.rfind("all ", 0) == 0 && line.find(" ready") != std::string::npos) {
    for (auto& s : step_) s = 5;
  }
  if (!bar_.on_terminal() || failed) {
    bar_.finish();
    std::fprintf(stderr, "%s: %s\n", prefix_.c_str(), line.c_str());
    return;
  }
  const int total = 5 * static_cast<int>(step_.size());
  bar_.update(std::accumulate(step_.begin(), step_.end(), 0), total, line);
}

std::function<void(const std::string&)> startup_progress_printer(std::string prefix, int stages) {
  auto p = std::make_shared<startup_progress>(std::move(prefix), stages);
  return [p](const std::string& line) { (*p)(line); };
}

}  // namespace conveyor::cli
