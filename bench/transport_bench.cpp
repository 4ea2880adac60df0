// Frame bandwidth and latency of conveyor's UCX channels against ucx_perftest on the same transport,
// run in the same invocation, plus the CPU all-reduce bus bandwidth. Prints ratios (DESIGN.md: numbers
// come with their reference). Loopback only.
//
//   transport_bench [--tls tcp,shm] [--quick] [--busy-poll-us N] [--transfer-poll-us N] [--latency-only]
//                   [--frames-only]
//
// The peer process is a fork of this one (forked before this process starts any UCX thread).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "conveyor/transport/cpu_collective.hpp"
#include "conveyor/transport/frame_codec.hpp"
#include "conveyor/transport/shm_collective.hpp"
#include "conveyor/transport/ucx_context.hpp"
#include "flag_values.hpp"

using namespace conveyor;
using namespace conveyor::transport;
using namespace std::chrono_literals;

namespace {

std::string ucx_tls_env(const std::string& tls) { return tls == "shm" ? "posix,sysv,cma,self" : "tcp,self"; }

// ---------------------------------------------------------------- ucx_perftest

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct perftest_result {
  double median_lat_us = 0;  // one-way (perftest reports half the round trip)
  double bw_mbs = 0;         // MB/s (10^6... perftest prints MiB/s as "MB/s")
  bool ok = false;
};

perftest_result run_perftest(const std::string& tls, const std::string& test, std::size_t size, int iters,
                             const std::string& extra = "") {
  static int port = 20000 + getpid() % 20000;
  ++port;
  std::string env = "UCX_TLS=" + ucx_tls_env(tls) + " UCX_NET_DEVICES=lo ";
  std::string server = env + "timeout 120 ucx_perftest -p " + std::to_string(port) + " >/dev/null 2>&1 &";
  if (std::system(server.c_str()) != 0) return {};
  std::this_thread::sleep_for(1s);  // the server must listen before the client connects
  std::string client = env + "timeout 120 ucx_perftest 127.0.0.1 -p " + std::to_string(port) + " -t " + test +
                       " -s " + std::to_string(size) + " -n " + std::to_string(iters) + " -w " +
                       std::to_string(std::max(2, iters / 10)) + " " + extra + " -f -v 2>/dev/null";
  FILE* p = ::popen(client.c_str(), "r");
  if (p == nullptr) return {};
  char line[512];
  std::string last;
  while (std::fgets(line, sizeof line, p)) last = line;
  ::pclose(p);
  // iterations,50.0_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,avg_mr,overall_mr
  perftest_result r;
  std::vector<double> cols;
  std::stringstream ss(last);
  std::string cell;
  while (std::getline(ss, cell, ',')) cols.push_back(std::atof(cell.c_str()));
  if (cols.size() >= 6) {
    r.median_lat_us = cols[1];
    r.bw_mbs = cols[5];
    r.ok = true;
  }
  std::this_thread::sleep_for(200ms);  // let the server exit
  return r;
}

// ---------------------------------------------------------------- our frames

frame_header bench_header(std::uint64_t i, std::size_t bytes) {
  frame_header h;
  h.kind = frame_kind::logits;
  h.microbatch_id = i;
  sequence_plan s;
  s.seq_id = 1;
  s.tokens = {1};
  s.start_pos = 100;
  s.block_table = {0, 1, 2, 3, 4, 5, 6};
  h.seqs.push_back(s);
  h.tensor.type = kernels::dtype::i32;
  h.tensor.shape = {static_cast<std::int64_t>(bytes / 4)};
  return h;
}

std::string hex(const worker_address& a) {
  std::string s;
  char b[3];
  for (auto x : a) {
    std::snprintf(b, sizeof b, "%02x", static_cast<unsigned>(x));
    s += b;
  }
  return s;
}

worker_address unhex(const std::string& s) {
  worker_address a;
  for (std::size_t i = 0; i + 1 < s.size(); i += 2) a.push_back(static_cast<std::byte>(std::stoi(s.substr(i, 2), nullptr, 16)));
  return a;
}

std::chrono::microseconds g_busy_poll{50};
std::chrono::microseconds g_transfer_poll = ucx_config{}.transfer_poll;

ucx_config config_for(const std::string& tls) {
  ucx_config c;
  c.tls = tls;
  c.net_devices = "lo";
  c.busy_poll = g_busy_poll;
  c.transfer_poll = g_transfer_poll;
  return c;
}

/// The forked peer: echo (latency) or sink (bandwidth) until the channel closes.
[[noreturn]] void run_peer(const std::string& tls, bool echo, int in_fd, int out_fd) {
  auto ctx = ucx_context::create(config_for(tls));
  if (!ctx.ok()) _exit(2);
  std::string mine = hex((*ctx)->address()) + "\n";
  [[maybe_unused]] auto w = ::write(out_fd, mine.data(), mine.size());
  std::string theirs;
  char c;
  while (::read(in_fd, &c, 1) == 1 && c != '\n') theirs += c;
  auto ch = (*ctx)->connect(unhex(theirs), {});
  if (!ch.ok()) _exit(3);
  frame f;  // reused: a stage receiving frame after frame does the same (channel::receive_into)
  for (;;) {
    if (!(*ch)->receive_into(f, clock::duration(120s)).ok()) break;
    if (echo) {
      auto s = (*ch)->send_encoded(f.header_bytes, {f.payload.data(), f.payload.size()});
      if (!s.ok() || !s->wait(s->done() ? deadline{} : after(60s)).ok()) break;
    }
  }
  ch->reset();
  ctx->reset();
  _exit(0);
}

struct peer {
  pid_t pid = -1;
  std::unique_ptr<ucx_context> ctx;
  std::unique_ptr<channel> ch;
  ~peer() {
    ch.reset();
    ctx.reset();
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
};

bool start_peer(peer& p, const std::string& tls, bool echo) {
  int to_child[2], from_child[2];
  if (::pipe(to_child) != 0 || ::pipe(from_child) != 0) return false;
  p.pid = ::fork();
  if (p.pid == 0) run_peer(tls, echo, to_child[0], from_child[1]);
  std::string theirs;
  char c;
  while (::read(from_child[0], &c, 1) == 1 && c != '\n') theirs += c;
  auto ctx = ucx_context::create(config_for(tls));
  if (!ctx.ok()) return false;
  p.ctx = std::move(*ctx);
  std::string mine = hex(p.ctx->address()) + "\n";
  [[maybe_unused]] auto w = ::write(to_child[1], mine.data(), mine.size());
  auto ch = p.ctx->connect(unhex(theirs), {});
  ::close(to_child[0]); ::close(to_child[1]); ::close(from_child[0]); ::close(from_child[1]);
  if (!ch.ok()) {
    std::fprintf(stderr, "connect: %s\n", ch.err().message.c_str());
    return false;
  }
  p.ch = std::move(*ch);
  return true;
}

/// Median one-way latency (half the round trip) of `bytes`-byte frames, in microseconds. With
/// `send_call_us`, also the duration of each send() call (a diagnostic pass: the extra clock reads
/// add to the round trip, so its latency is not the one reported).
double frame_latency_us(channel& ch, std::size_t bytes, int iters, std::vector<double>* send_call_us = nullptr) {
  std::vector<std::byte> payload(bytes, std::byte{1});
  std::vector<double> rtt;
  // The plan is built once, as a stage has its plan at hand: the timed part is encoding and sending
  // it (and, on the way back, receiving and decoding it), not building the caller's std::vectors.
  auto header = bench_header(0, bytes);
  frame f;  // reused across round trips (channel::receive_into), on both sides
  rtt.reserve(static_cast<std::size_t>(iters));
  // One clock read a round trip, as perftest takes one time stamp an iteration: a round trip ends
  // where the next begins (the loop's own few instructions fall in one of them). Two reads put a
  // second clock read (30-46 ns on the GPU host) into every round trip that perftest's has not.
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters + iters / 10; ++i) {
    header.microbatch_id = static_cast<std::uint64_t>(i);
    if (send_call_us != nullptr) t0 = std::chrono::steady_clock::now();  // (the diagnostic pass times send() from here)
    auto s = ch.send(header, {payload.data(), payload.size()});
    if (!s.ok()) return -1;
    if (send_call_us != nullptr && i >= iters / 10) {
      send_call_us->push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    // A small send is mostly complete when send() returns: its status then needs no deadline (a
    // deadline is a clock read, 35-40 ns on the GPU host); a wait on a done send returns at once.
    if (!s->wait(s->done() ? deadline{} : after(10s)).ok()) return -1;
    if (!ch.receive_into(f, clock::duration(10s)).ok()) return -1;
    const auto t1 = std::chrono::steady_clock::now();
    if (i >= iters / 10) rtt.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    t0 = t1;
  }
  return median(std::move(rtt)) / 2;
}

/// One-way frame bandwidth in MB/s (10^6 bytes... as MiB/s to match perftest: 2^20 bytes/s).
double frame_bandwidth_mibs(channel& ch, std::size_t bytes, int frames, int window) {
  std::vector<std::vector<std::byte>> bufs(window, std::vector<std::byte>(bytes, std::byte{7}));
  std::deque<send_handle> pending;
  auto run = [&](int n) -> double {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) {
      if (static_cast<int>(pending.size()) == window) {
        if (auto st = pending.front().wait(after(60s)); !st.ok()) {
          std::fprintf(stderr, "bandwidth: %s\n", st.err().message.c_str());
          return -1;
        }
        pending.pop_front();
      }
      auto& b = bufs[i % window];
      auto s = ch.send(bench_header(i, bytes), {b.data(), b.size()});
      if (!s.ok()) {
        std::fprintf(stderr, "bandwidth: %s\n", s.err().message.c_str());
        return -1;
      }
      pending.push_back(*s);
    }
    while (!pending.empty()) {
      if (auto st = pending.front().wait(after(60s)); !st.ok()) {
        std::fprintf(stderr, "bandwidth: %s\n", st.err().message.c_str());
        return -1;
      }
      pending.pop_front();
    }
    double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return static_cast<double>(bytes) * n / sec / (1 << 20);
  };
  // Warm-up: registration cache, and page faults of every receive buffer the peer's pool will cycle
  // through (one per frame in flight; with fewer warm-up frames than that, the timed run paid for
  // faulting in fresh 64 MiB buffers, which perftest's single reused buffer never does).
  run(std::max(2 * window, frames / 8));
  return run(frames);
}

/// Nanoseconds to encode and to decode the latency test's header, in this process: a ping-pong round
/// trip pays one encode and two decodes (the echo forwards the encoded header), so this splits the
/// frame latency into header codec and transport.
std::pair<double, double> codec_ns(int iters) {
  auto h = bench_header(1, 8);
  auto bytes = encode_header(h);
  // As the channel does it: into a send state's reused vector, and into the receiver's reused
  // frame (channel::receive_into).
  std::vector<std::byte> out;
  frame_header decoded;
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) {
    if (!encode_header_into(h, out, 48, header_form::automatic, 8).ok()) return {-1, -1};
  }
  auto t1 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) {
    if (!decode_header_into(*bytes, decoded).ok()) return {-1, -1};
  }
  auto t2 = std::chrono::steady_clock::now();
  return {std::chrono::duration<double, std::nano>(t1 - t0).count() / iters,
          std::chrono::duration<double, std::nano>(t2 - t1).count() / iters};
}

/// What the small-frame path's building blocks cost on this machine (ns each, one thread, warm
/// lines): a steady_clock read, a locked read-modify-write (an atomic add: the lock prefix a mutex,
/// a shared_ptr copy or a counter pays), and an uncontended mutex lock + unlock. To weigh a change
/// that removes some of them against the one-way latency.
struct host_costs {
  double clock_ns = 0, locked_rmw_ns = 0, mutex_pair_ns = 0;
};

host_costs measure_host_costs() {
  constexpr int n = 2'000'000;
  using steady = std::chrono::steady_clock;
  auto per = [](steady::time_point t0, steady::time_point t1) {
    return std::chrono::duration<double, std::nano>(t1 - t0).count() / n;
  };
  host_costs c;
  auto t0 = steady::now();
  std::int64_t sink = 0;
  for (int i = 0; i < n; ++i) sink += steady::now().time_since_epoch().count();
  auto t1 = steady::now();
  c.clock_ns = per(t0, t1);
  std::atomic<std::int64_t> counter{sink & 1};
  t0 = steady::now();
  for (int i = 0; i < n; ++i) counter.fetch_add(1, std::memory_order_acq_rel);
  t1 = steady::now();
  c.locked_rmw_ns = per(t0, t1);
  std::mutex mu;
  t0 = steady::now();
  for (int i = 0; i < n; ++i) {
    mu.lock();
    mu.unlock();
  }
  t1 = steady::now();
  c.mutex_pair_ns = per(t0, t1);
  return c;
}

// ---------------------------------------------------------------- CPU all-reduce

double cpu_allreduce_busbw_gbs(int ranks, std::size_t count, int iters) {
  cpu_group g(ranks);
  std::vector<std::vector<float>> data(ranks, std::vector<float>(count, 1.0f));
  std::vector<std::thread> threads;
  auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      auto c = g.rank(r);
      for (int i = 0; i < iters; ++i) (void)c->all_reduce_sum(data[r].data(), count, kernels::dtype::f32);
    });
  }
  for (auto& t : threads) t.join();
  double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
  // NCCL's bus bandwidth convention: algorithm bandwidth * 2 (n-1) / n.
  return count * 4.0 / sec * 2.0 * (ranks - 1) / ranks / 1e9;
}

/// The same all-reduce with the ranks as forked processes (shm_group). Rank 0 times it after a
/// warm-up pass and writes the seconds per operation to a pipe.
double shm_allreduce_busbw_gbs(int ranks, std::size_t count, int iters) {
  auto id = make_shm_group_id();
  int fds[2];
  if (::pipe(fds) != 0) return -1;
  std::fflush(stdout);
  std::vector<pid_t> pids;
  for (int r = 0; r < ranks; ++r) {
    pid_t pid = ::fork();
    if (pid == 0) {
      auto c = join_shm_group(id, ranks, r);
      if (!c.ok()) _exit(2);
      std::vector<float> data(count, 1.0f);
      (void)(*c)->all_reduce_sum(data.data(), count, kernels::dtype::f32);
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) (void)(*c)->all_reduce_sum(data.data(), count, kernels::dtype::f32);
      double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
      if (r == 0) [[maybe_unused]] auto w = ::write(fds[1], &sec, sizeof sec);
      _exit(0);
    }
    pids.push_back(pid);
  }
  double sec = -1;
  [[maybe_unused]] auto n = ::read(fds[0], &sec, sizeof sec);
  for (pid_t pid : pids) ::waitpid(pid, nullptr, 0);
  ::close(fds[0]);
  ::close(fds[1]);
  return sec > 0 ? count * 4.0 / sec * 2.0 * (ranks - 1) / ranks / 1e9 : -1;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> tls_list = {"tcp", "shm"};
  bool quick = false, latency_only = false, frames_only = false;
  auto die = [](const std::string& why) {
    std::fprintf(stderr, "transport_bench: %s\n", why.c_str());
    std::exit(2);
  };
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&] { return bench::flag_value(argc, argv, i, die); };
    if (a == "--quick") quick = true;
    else if (a == "--latency-only") latency_only = true;  // for profiling the small-frame path
    else if (a == "--frames-only") frames_only = true;    // no perftest runs: for profiling the frames alone
    else if (a == "--busy-poll-us") g_busy_poll = std::chrono::microseconds(bench::int_flag(a, value(), 0, 1000000, die));
    else if (a == "--transfer-poll-us") {
      g_transfer_poll = std::chrono::microseconds(bench::int_flag(a, value(), 0, 1000000, die));
    } else if (a == "--tls") {
      tls_list.clear();
      std::stringstream ss(value());
      std::string t;
      while (std::getline(ss, t, ',')) tls_list.push_back(t);
      if (tls_list.empty()) die("--tls needs at least one of tcp, shm");
    } else {
      die("unknown flag " + a + " (--quick, --latency-only, --frames-only, --busy-poll-us N, --transfer-poll-us N, --tls LIST)");
    }
  }
  int lat_iters = quick ? 500 : 5000;
  int bw_frames = quick ? 8 : 32;
  // 64 MiB: both sides keep the same number of messages in flight (perftest -O), and the pair is
  // measured `rounds` times, alternating, so a slow spell of the machine hits both; the goal's ratio
  // is the median of the rounds' ratios.
  const int window = 4, rounds = 3, frames64 = quick ? 16 : 32;
  std::printf("# conveyor transport bench (loopback; %u hardware threads; busy_poll %lld us, transfer_poll %lld us)\n",
              std::thread::hardware_concurrency(), static_cast<long long>(g_busy_poll.count()),
              static_cast<long long>(g_transfer_poll.count()));
  {
    auto hc = measure_host_costs();
    std::printf("# this machine: clock read %.1f ns, locked read-modify-write %.1f ns, mutex lock+unlock %.1f ns\n",
                hc.clock_ns, hc.locked_rmw_ns, hc.mutex_pair_ns);
  }
  std::fflush(stdout);  // the peer is a fork: it must not inherit unflushed output
  for (const auto& tls : tls_list) {
    std::printf("\n## tls=%s (UCX_TLS=%s)\n", tls.c_str(), ucx_tls_env(tls).c_str());
    std::fflush(stdout);
    // The frame as UCX sees it: preamble + header + payload in one active message.
    std::size_t wire_bytes = 48 /* wire::preamble */ + encode_header(bench_header(0, 8))->size() + 8;
    // 8 B latency: like the bandwidth below, `rounds` alternating pairs (perftest, then our frames on
    // a channel kept open), and the goal's ratio is the median of the rounds' ratios, so one quiet or
    // noisy spell of the machine does not decide it (one pair per run read 1.80x and 2.43x on the same
    // host, 2026-11-29, with perftest itself moving 0.40-0.49 us).
    perftest_result p_lat, p_lat_same;
    double lat = -1, lat4k = -1, diag_one_way = -1;
    std::vector<double> lat_ratios, lats, p_lats, send_calls;
    {
      peer p;
      if (!start_peer(p, tls, true)) return 1;
      for (int r = 0; r < rounds; ++r) {
        auto pr = frames_only ? perftest_result{} : run_perftest(tls, "ucp_am_lat", 8, lat_iters * 4);
        double l = frame_latency_us(*p.ch, 8, lat_iters);
        lats.push_back(l);
        if (pr.ok) {
          p_lats.push_back(pr.median_lat_us);
          lat_ratios.push_back(l / pr.median_lat_us);
        }
        std::printf("latency 8 B      : round %d: frame %.2f us | perftest ucp_am_lat %.2f us | ratio %.2fx\n", r + 1, l,
                    pr.median_lat_us, pr.ok ? l / pr.median_lat_us : 0.0);
        std::fflush(stdout);
      }
      lat4k = frame_latency_us(*p.ch, 4096, lat_iters);
      // Where a one-way goes (diagnostic pass): the sender's send() call is ours alone (encode, the
      // worker lock, the channel's state, ucp_am_send_nbx of an inline message); the rest of the
      // one-way is UCX's wire and the receiver's detect, take and decode.
      diag_one_way = frame_latency_us(*p.ch, 8, lat_iters, &send_calls);
      std::sort(send_calls.begin(), send_calls.end());
    }
    if (!frames_only) p_lat_same = run_perftest(tls, "ucp_am_lat", wire_bytes, lat_iters * 4);
    lat = median(lats);
    p_lat.median_lat_us = median(p_lats);
    p_lat.ok = !p_lats.empty();
    std::printf("latency 8 B      : frame %.2f us | perftest ucp_am_lat %.2f us | median ratio %.2fx of %d rounds (goal <= 2x)\n",
                lat, p_lat.median_lat_us, median(lat_ratios), rounds);
    std::printf("  same wire bytes: perftest ucp_am_lat at %zu B (the frame's whole message) %.2f us | ratio %.2fx\n",
                wire_bytes, p_lat_same.median_lat_us, p_lat_same.ok ? lat / p_lat_same.median_lat_us : 0.0);
    auto [enc_ns, dec_ns] = codec_ns(lat_iters * 10);
    double codec_one_way_us = (enc_ns + 2 * dec_ns) / 2 / 1000;
    std::printf("  header codec   : encode %.0f ns, decode %.0f ns -> %.2f us of the one-way latency; "
                "transport alone %.2f us = %.2fx perftest\n",
                enc_ns, dec_ns, codec_one_way_us, lat - codec_one_way_us,
                p_lat.ok ? (lat - codec_one_way_us) / p_lat.median_lat_us : 0.0);
    if (!send_calls.empty()) {
      std::printf("  send() call    : median %.2f us, p90 %.2f us of a %.2f us one-way (diagnostic pass, a clock read "
                  "around each send)\n",
                  send_calls[send_calls.size() / 2], send_calls[send_calls.size() * 9 / 10], diag_one_way);
    }
    std::printf("latency 4 KiB    : frame %.2f us\n", lat4k);
    std::fflush(stdout);
    if (latency_only) continue;
    peer p;
    if (!start_peer(p, tls, false)) return 1;
    for (std::size_t mib : {1, 8}) {
      std::printf("bandwidth %2zu MiB : frame %.0f MiB/s\n", mib, frame_bandwidth_mibs(*p.ch, mib << 20, bw_frames * 4, window));
    }
    std::fflush(stdout);
    std::vector<double> ratios;
    for (int r = 0; r < rounds; ++r) {
      auto pb = frames_only ? perftest_result{} : run_perftest(tls, "ucp_am_bw", 64u << 20, frames64, "-O " + std::to_string(window));
      double bw = frame_bandwidth_mibs(*p.ch, 64u << 20, frames64, window);
      double ratio = pb.ok && bw > 0 ? bw / pb.bw_mbs : 0.0;
      if (frames_only) ratio = bw;  // the median below is then of the frame bandwidths
      ratios.push_back(ratio);
      std::printf("bandwidth 64 MiB : round %d: frame %.0f MiB/s | perftest ucp_am_bw -O %d %.0f MiB/s | ratio %.2f\n", r + 1,
                  bw, window, pb.bw_mbs, ratio);
      std::fflush(stdout);
    }
    auto p_tag = frames_only ? perftest_result{} : run_perftest(tls, "tag_bw", 64u << 20, frames64, "-O " + std::to_string(window));
    std::printf("bandwidth 64 MiB : median ratio %.2f of am_bw (goal >= 0.8), %d in flight both; perftest tag_bw %.0f MiB/s\n",
                median(ratios), window, p_tag.bw_mbs);
  }
  if (latency_only) return 0;
  std::printf("\n## CPU all-reduce (f32, 16 MiB per rank): ranks as threads (cpu_group) | as processes (shm_group)\n");
  std::fflush(stdout);
  for (int ranks : {2, 4}) {
    double threads = cpu_allreduce_busbw_gbs(ranks, 4u << 20, quick ? 5 : 20);
    double procs = shm_allreduce_busbw_gbs(ranks, 4u << 20, quick ? 5 : 20);
    std::printf("ranks %d: bus bandwidth %.2f GB/s | %.2f GB/s\n", ranks, threads, procs);
  }
  return 0;
}
