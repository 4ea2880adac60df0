// conveyor_soak: holds N streaming requests in flight against a running server for a while and checks
// that none is lost (every request ends "length" with all its tokens), none is duplicated (the
// streamed tokens are exactly the greedy reference, each once), the server counted exactly the
// requests the clients finished, and the resident memory of the server and all its worker processes
// stays flat after warm-up (issue 10, "Load").
//
//   conveyor_soak --connect HOST:PORT --server-pid PID [--concurrency 1000] [--connections 16]
//                 [--duration-s 60] [--warmup-s 10] [--max-new-tokens 8] [--prompts 16]
//                 [--rss-tolerance 0.10] [--sample-s 1] [--vocab V]
//
// Every worker thread loops: pick the next prompt, stream it, compare, repeat, until the duration is
// over; so the server sees `concurrency` requests at all times (most wait in its queue). The reference
// outputs come from one request per prompt made before the load starts. RSS is sampled from
// /proc/PID/status for the server and every descendant; the baseline is each process's RSS at the end
// of warm-up, and the check is the mean of the last quarter of the samples against it.
// Exit status: 0 when every check passed, 1 when one failed, 2 for bad flags or no server.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <dirent.h>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "conveyor/client/client.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

struct soak_options {
  std::string connect;
  int server_pid = 0;
  int concurrency = 1000;
  int connections = 16;
  double duration_s = 60;
  double warmup_s = 10;
  int max_new_tokens = 8;
  int prompts = 16;
  double rss_tolerance = 0.10;
  double sample_s = 1.0;
  int vocab = 1000;
};

bool parse_flags(int argc, char** argv, soak_options& o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "conveyor_soak: flag %s needs a value\n", a.c_str());
      return false;
    }
    const char* v = argv[++i];
    char* end = nullptr;
    auto num = [&](double lo, double hi) {
      double x = std::strtod(v, &end);
      if (end == v || *end != '\0' || !(x >= lo && x <= hi)) {
        std::fprintf(stderr, "conveyor_soak: %s wants a number in [%g, %g], got '%s'\n", a.c_str(), lo, hi, v);
        std::exit(2);
      }
      return x;
    };
    if (a == "--connect") o.connect = v;
    else if (a == "--server-pid") o.server_pid = static_cast<int>(num(1, 1e9));
    else if (a == "--concurrency") o.concurrency = static_cast<int>(num(1, 100000));
    else if (a == "--connections") o.connections = static_cast<int>(num(1, 1024));
    else if (a == "--duration-s") o.duration_s = num(0.1, 1e6);
    else if (a == "--warmup-s") o.warmup_s = num(0, 1e6);
    else if (a == "--max-new-tokens") o.max_new_tokens = static_cast<int>(num(1, 4096));
    else if (a == "--prompts") o.prompts = static_cast<int>(num(1, 100000));
    else if (a == "--rss-tolerance") o.rss_tolerance = num(0, 10);
    else if (a == "--sample-s") o.sample_s = num(0.05, 3600);
    else if (a == "--vocab") o.vocab = static_cast<int>(num(2, 1e9));
    else {
      std::fprintf(stderr, "conveyor_soak: unknown flag %s\n", a.c_str());
      return false;
    }
  }
  if (o.connect.empty() || o.server_pid == 0) {
    std::fprintf(stderr, "conveyor_soak: --connect and --server-pid are required\n");
    return false;
  }
  if (o.warmup_s >= o.duration_s) {
    std::fprintf(stderr, "conveyor_soak: --warmup-s must be shorter than --duration-s\n");
    return false;
  }
  return true;
}

/// The server and every process below it (the stage workers), from /proc/*/stat's parent field.
std::vector<int> process_tree(int root) {
  std::map<int, int> parent;
  if (DIR* d = opendir("/proc")) {
    while (dirent* e = readdir(d)) {
      int pid = std::atoi(e->d_name);
      if (pid <= 0) continue;
      std::ifstream f(std::string("/proc/") + e->d_name + "/stat");
      std::string line;
      if (!std::getline(f, line)) continue;
      // The name is in parentheses and may hold spaces: the fields after the last ')' are fixed.
      auto close = line.rfind(')');
      if (close == std::string::npos) continue;
      std::istringstream rest(line.substr(close + 1));
      std::string state;
      int ppid = 0;
      rest >> state >> ppid;
      parent[pid] = ppid;
    }
    closedir(d);
  }
  std::vector<int> tree{root};
  for (std::size_t i = 0; i < tree.size(); ++i)
    for (auto [pid, pp] : parent)
      if (pp == tree[i]) tree.push_back(pid);
  return tree;
}

long rss_kib(int pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string key;
  while (f >> key) {
    if (key == "VmRSS:") {
      long kib = 0;
      f >> kib;
      return kib;
    }
    std::string rest;
    std::getline(f, rest);
  }
  return -1;  // gone
}

std::vector<std::int32_t> prompt_for(int i, int vocab) {
  // Distinct, deterministic prompts of 3..10 tokens.
  std::vector<std::int32_t> p;
  const int len = 3 + i % 8;
  for (int k = 0; k < len; ++k) p.push_back(static_cast<std::int32_t>((1 + i * 131 + k * 37) % vocab));
  return p;
}

struct tally {
  std::atomic<long> completed{0};
  std::atomic<long> lost{0};        // ended with an error or a finish other than "length"
  std::atomic<long> wrong{0};       // tokens differ from the reference (missing, extra, repeated)
  std::atomic<long> tokens{0};
  std::mutex m;
  std::vector<std::string> first_errors;
  void note(const std::string& s) {
    std::lock_guard lock(m);
    if (first_errors.size() < 8) first_errors.push_back(s);
  }
};

}  // namespace

int main(int argc, char** argv) {
  soak_options o;
  if (!parse_flags(argc, argv, o)) return 2;
  namespace cc = conveyor::client;

  std::vector<std::unique_ptr<cc::connection>> conns;
  for (int c = 0; c < o.connections; ++c) {
    auto conn = cc::connect(o.connect);
    if (!conn) {
      std::fprintf(stderr, "conveyor_soak: %s\n", conn.err().message.c_str());
      return 2;
    }
    conns.push_back(std::move(*conn));
  }
  auto info = conns[0]->info();
  if (!info) {
    std::fprintf(stderr, "conveyor_soak: info: %s\n", info.err().message.c_str());
    return 2;
  }
  o.vocab = std::min(o.vocab, info->vocab_size);

  // References: one request per prompt, alone.
  std::vector<std::vector<std::int32_t>> prompts, want;
  for (int i = 0; i < o.prompts; ++i) {
    cc::generate_request r;
    r.prompt = prompt_for(i, o.vocab);
    r.max_new_tokens = o.max_new_tokens;
    r.ignore_eos = true;
    std::vector<std::int32_t> got;
    auto s = conns[0]->generate(r, [&](std::span<const std::int32_t> t) {
      got.insert(got.end(), t.begin(), t.end());
      return true;
    });
    if (!s || s->finish_reason != "length" || static_cast<int>(got.size()) != o.max_new_tokens) {
      std::fprintf(stderr, "conveyor_soak: reference request %d failed: %s\n", i,
                   s ? s->finish_reason.c_str() : s.err().message.c_str());
      return 2;
    }
    prompts.push_back(r.prompt);
    want.push_back(std::move(got));
  }
  auto before = conns[0]->stats();
  if (!before) {
    std::fprintf(stderr, "conveyor_soak: stats: %s\n", before.err().message.c_str());
    return 2;
  }

  tally t;
  std::atomic<long> next{0};
  const auto start = clock_type::now();
  const auto stop_at = start + std::chrono::duration<double>(o.duration_s);
  std::vector<std::thread> threads;
  threads.reserve(o.concurrency);
  for (int w = 0; w < o.concurrency; ++w) {
    threads.emplace_back([&, w] {
      auto& conn = *conns[w % conns.size()];
      while (clock_type::now() < stop_at) {
        const long n = next.fetch_add(1);
        const int i = static_cast<int>(n % o.prompts);
        cc::generate_request r;
        r.prompt = prompts[i];
        r.max_new_tokens = o.max_new_tokens;
        r.ignore_eos = true;
        r.deadline_s = 0;  // the server's default
        std::vector<std::int32_t> got;
        auto s = conn.generate(r, [&](std::span<const std::int32_t> tk) {
          got.insert(got.end(), tk.begin(), tk.end());
          return true;
        });
        if (!s) {
          t.lost.fetch_add(1);
          t.note("request " + std::to_string(n) + ": " + s.err().message);
          continue;
        }
        if (s->finish_reason != "length") {
          t.lost.fetch_add(1);
          t.note("request " + std::to_string(n) + " finished '" + s->finish_reason + "'");
          continue;
        }
        t.tokens.fetch_add(static_cast<long>(got.size()));
        if (got != want[i] || s->completion_tokens != o.max_new_tokens) {
          t.wrong.fetch_add(1);
          t.note("request " + std::to_string(n) + " streamed " + std::to_string(got.size()) +
                 " tokens that differ from the reference");
          continue;
        }
        t.completed.fetch_add(1);
      }
    });
  }

  // RSS samples of every process in the server's tree, until the workers are done.
  std::map<int, std::vector<long>> samples;  // after warm-up only
  std::map<int, long> baseline;
  std::vector<int> tree;
  bool warmed = false;
  while (clock_type::now() < stop_at) {
    std::this_thread::sleep_for(std::chrono::duration<double>(o.sample_s));
    const double at = std::chrono::duration<double>(clock_type::now() - start).count();
    if (!warmed && at >= o.warmup_s) {
      warmed = true;
      tree = process_tree(o.server_pid);
      for (int pid : tree) baseline[pid] = rss_kib(pid);
      std::printf("warm-up over at %.1f s: %zu processes, %ld requests done\n", at, tree.size(),
                  t.completed.load());
    } else if (warmed) {
      for (int pid : tree) samples[pid].push_back(rss_kib(pid));
    }
  }
  for (auto& th : threads) th.join();
  const double wall = std::chrono::duration<double>(clock_type::now() - start).count();
  auto after = conns[0]->stats();

  bool ok = true;
  const long done = t.completed.load();
  std::printf("concurrency %d over %d connections, %.1f s: %ld requests completed (%.1f/s), %ld tokens, "
              "%ld lost, %ld wrong\n",
              o.concurrency, o.connections, wall, done, done / wall, t.tokens.load(), t.lost.load(),
              t.wrong.load());
  for (const auto& e : t.first_errors) std::printf("  %s\n", e.c_str());
  if (t.lost.load() != 0 || t.wrong.load() != 0 || done == 0) ok = false;
  if (after) {
    const long server_finished = after->requests_finished - before->requests_finished;
    const long server_failed = after->requests_failed - before->requests_failed;
    std::printf("server: %ld finished, %ld failed during the soak (clients saw %ld)\n", server_finished,
                server_failed, done + t.wrong.load() + t.lost.load());
    if (server_finished != done + t.wrong.load() || server_failed != 0) ok = false;
  } else {
    std::printf("server stats after the soak failed: %s\n", after.err().message.c_str());
    ok = false;
  }
  for (int pid : tree) {
    const auto& s = samples[pid];
    if (s.empty() || baseline[pid] <= 0) continue;
    const std::size_t tail = std::max<std::size_t>(1, s.size() / 4);
    double mean = 0;
    for (std::size_t k = s.size() - tail; k < s.size(); ++k) mean += static_cast<double>(s[k]);
    mean /= static_cast<double>(tail);
    const long peak = *std::max_element(s.begin(), s.end());
    const double growth = mean / static_cast<double>(baseline[pid]) - 1.0;
    const bool flat = s.back() > 0 && std::abs(growth) <= o.rss_tolerance;
    std::printf("rss pid %d: %ld KiB after warm-up, %.0f KiB at the end (%+.1f%%), peak %ld KiB: %s\n", pid,
                baseline[pid], mean, growth * 100, peak, flat ? "flat" : "NOT FLAT");
    // The trend, in eighths of the measured window: a leak climbs steadily, allocator growth levels off.
    std::printf("  trend KiB:");
    for (int k = 1; k <= 8; ++k) std::printf(" %ld", s[(s.size() * k) / 8 - (k == 8 ? 1 : 0)]);
    std::printf("\n");
    if (!flat) ok = false;
  }
  if (tree.empty()) {
    std::printf("no RSS samples (warm-up longer than the run?)\n");
    ok = false;
  }
  std::printf("%s\n", ok ? "SOAK PASSED" : "SOAK FAILED");
  // Threads blocked in generate are joined already; connections close here.
  return ok ? 0 : 1;
}
