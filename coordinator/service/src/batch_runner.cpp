// Runs a batch file: reads every line, skips ids the output already holds, keeps `window` requests
// in the service, retries what admission control turns away, and writes results in input order as
// soon as every earlier line is done, so an interrupted run leaves a valid prefix to resume from.
#include "conveyor/service/batch_runner.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "batch_lines.hpp"

namespace conveyor::service {

namespace {

using clock_type = std::chrono::steady_clock;
using json = nlohmann::json;

struct job {
  json id;
  result<generate_request> request = make_error(errc::internal, "not parsed");
  enum class state { pending, running, done, skipped } st = state::pending;
  std::string line;  ///< the result line once done
  double backoff_s = 0.0;
};

/// Completions from the service's threads, for the runner's thread.
struct completion_queue {
  struct item {
    std::size_t index;
    std::vector<std::int32_t> tokens;
    result<generate_summary> outcome;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<item> items;
};

class job_sink final : public token_sink {
 public:
  job_sink(std::shared_ptr<completion_queue> q, std::size_t index) : q_(std::move(q)), index_(index) {}
  void on_tokens(std::span<const std::int32_t> t) override { tokens_.insert(tokens_.end(), t.begin(), t.end()); }
  void on_done(result<generate_summary> s) override {
    {
      std::lock_guard lock(q_->mu);
      q_->items.push_back({index_, std::move(tokens_), std::move(s)});
    }
    q_->cv.notify_all();
  }

 private:
  std::shared_ptr<completion_queue> q_;  // shared: a failed run may return while requests still run
  std::size_t index_;
  std::vector<std::int32_t> tokens_;  // on_tokens and on_done come from one service thread, in order
};

/// Ids of complete lines already in `path`; cuts a last line an interrupted run left half written.
result<std::set<std::string>> finished_ids(const std::string& path) {
  std::set<std::string> ids;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return ids;
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(errc::io, "cannot read the output " + path + " to resume from it");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  const auto complete = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
  if (complete < text.size()) {
    std::filesystem::resize_file(path, complete, ec);
    if (ec) return make_error(errc::io, "cannot cut the half-written last line of " + path + ": " + ec.message());
  }
  std::size_t start = 0, line_no = 0;
  while (start < complete) {
    const auto end = text.find('\n', start);
    ++line_no;
    std::string_view line(text.data() + start, end - start);
    if (!line.empty()) {
      auto id = batch_detail::id_of_result(line);
      if (!id) {
        return make_error(errc::bad_format, path + " line " + std::to_string(line_no) +
                                                " is not a result line with an id; refusing to append to it "
                                                "(move it away to start over)");
      }
      ids.insert(id->dump());
    }
    start = end + 1;
  }
  return ids;
}

}  // namespace

result<batch_progress> run_batch(inference_service& service, const std::string& input_path,
                                 const std::string& output_path, const batch_options& options) {
  std::ifstream in(input_path);
  if (!in) return make_error(errc::not_found, "cannot read the input " + input_path);
  CONVEYOR_TRY_ASSIGN(already, finished_ids(output_path));
  std::vector<job> jobs;
  std::map<std::string, std::int64_t> first_line;  // id -> line that used it first
  batch_progress progress;
  std::string text;
  for (std::int64_t line_no = 1; std::getline(in, text); ++line_no) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto parsed = batch_detail::parse_line(text, line_no, options.tokenizer);
    job j;
    j.id = std::move(parsed.id);
    j.request = std::move(parsed.request);
    const auto key = j.id.dump();
    if (auto [it, fresh] = first_line.emplace(key, line_no); !fresh) {
      j.request = make_error(errc::invalid_argument, "line " + std::to_string(line_no) + ": id " + key +
                                                         " is already used by line " + std::to_string(it->second));
    }
    if (already.count(key) != 0) {
      j.st = job::state::skipped;
      ++progress.skipped;
    }
    jobs.push_back(std::move(j));
  }
  progress.total = static_cast<std::int64_t>(jobs.size());
  std::ofstream out(output_path, std::ios::app | std::ios::binary);
  if (!out) return make_error(errc::io, "cannot write the output " + output_path);

  const auto t0 = clock_type::now();
  auto queue = std::make_shared<completion_queue>();
  std::deque<std::pair<clock_type::time_point, std::size_t>> retry;  // due time order (backoffs grow)
  std::size_t next_submit = 0, next_write = 0;
  int running = 0;
  auto finish = [&](job& j, std::string line, bool failed) {
    j.line = std::move(line);
    j.st = job::state::done;
    ++progress.done;
    if (failed) ++progress.errors;
  };
  auto submit = [&](std::size_t k) {
    jobs[k].st = job::state::running;
    ++running;
    service.submit(*jobs[k].request, std::make_shared<job_sink>(queue, k));
  };
  for (;;) {
    // Submit in input order, retries first, up to the window.
    const auto now = clock_type::now();
    while (running < options.window && !retry.empty() && retry.front().first <= now) {
      submit(retry.front().second);
      retry.pop_front();
    }
    while (running < options.window && next_submit < jobs.size()) {
      job& j = jobs[next_submit];
      if (j.st == job::state::pending) {
        if (j.request.ok()) {
          submit(next_submit);
        } else {
          finish(j, batch_detail::error_line(j.id, j.request.err()), true);
        }
      }
      ++next_submit;
    }
    // Write every result whose predecessors are all written.
    bool wrote = false;
    while (next_write < jobs.size() &&
           (jobs[next_write].st == job::state::done || jobs[next_write].st == job::state::skipped)) {
      if (jobs[next_write].st == job::state::done) {
        out << jobs[next_write].line << '\n';
        jobs[next_write].line.clear();
        wrote = true;
      }
      ++next_write;
    }
    if (wrote) {
      out.flush();
      if (!out) return make_error(errc::io, "writing " + output_path + " failed");
      progress.elapsed_s = std::chrono::duration<double>(clock_type::now() - t0).count();
      if (options.on_progress) options.on_progress(progress);
    }
    if (next_write == jobs.size()) break;
    // Nothing more to submit: a batch that waits to fill must not wait for lines that never come.
    if (next_submit == jobs.size() && retry.empty()) service.flush();
    std::unique_lock lock(queue->mu);
    const auto until = retry.empty() ? clock_type::now() + std::chrono::seconds(1) : retry.front().first;
    queue->cv.wait_until(lock, until, [&] { return !queue->items.empty(); });
    auto items = std::move(queue->items);
    queue->items.clear();
    lock.unlock();
    for (auto& it : items) {
      job& j = jobs[it.index];
      --running;
      if (!it.outcome.ok() && it.outcome.err().code == errc::overloaded) {
        // Admission control said "not now": wait and resubmit; an accepted line is never lost.
        j.backoff_s = j.backoff_s == 0.0 ? options.overload_backoff_s : std::min(1.0, 2 * j.backoff_s);
        j.st = job::state::pending;
        ++progress.retries;
        auto due = clock_type::now() + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(j.backoff_s));
        auto pos = std::upper_bound(retry.begin(), retry.end(), due,
                                    [](const auto& t, const auto& e) { return t < e.first; });
        retry.insert(pos, {due, it.index});
        continue;
      }
      progress.tokens += static_cast<std::int64_t>(it.tokens.size());
      if (it.outcome.ok()) {
        finish(j, batch_detail::result_line(j.id, it.tokens, *it.outcome, options.tokenizer), false);
      } else {
        finish(j, batch_detail::error_line(j.id, it.outcome.err()), true);
      }
    }
  }
  progress.elapsed_s = std::chrono::duration<double>(clock_type::now() - t0).count();
  return progress;
}

}  // namespace conveyor::service
