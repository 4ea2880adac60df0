// serving_bench: one arrival pattern (Poisson arrivals, prompt and output lengths drawn from ranges,
// all from a fixed seed) replayed against the in-process service once per batching mode, printing
// throughput, TTFT, inter-token latency and end-to-end latency percentiles, and the rejection rate.
// Continuous batching is the reference row: the others print their ratios to it.
//
//   serving_bench [--model DIR] [--requests N] [--rate R] [--max-batch-size B] [--delay-ms D]
//                 [--prompt MIN:MAX] [--output MIN:MAX] [--modes continuous,dynamic,static]
//                 [--job-ticket] [--job-queue-size Q] [--threads T] [--seed S] [--csv FILE]
//                 [--step-delay-us U] [--rates R1,R2,...] [--kv-blocks N]
//                 [--cluster --conveyor PATH [--device cpu|cuda] [--dtype f32|bf16] [--stages K]
//                  [--queued-steps 0|1]]
//
// --cluster drives a real cluster instead (coordinator in this process, `conveyor worker` processes
// from --conveyor PATH, the same as `conveyor serve` starts): one cluster per mode, every rate of
// --rates through it in turn. Latencies are taken at the service interface (no RPC client).
//
// The CPU fixture's steps are compute-bound: their time grows with every token, so batching saves
// little. --step-delay-us adds a fixed time per step, the shape of a GPU's memory-bound decode step
// (reading the weights once costs the same for 1 or 32 sequences), where batching pays.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "conveyor/coordinator/cluster.hpp"
#include "conveyor/engine/model_config.hpp"
#include "conveyor/service/local_inference_service.hpp"
#include "flag_values.hpp"

namespace {

using namespace conveyor;
using clock_type = std::chrono::steady_clock;

struct bench_options {
  std::string model = "tests/fixtures/tiny-llama";
  int requests = 200;
  double rate = 150.0;  // requests per second
  int max_batch_size = 16;
  int delay_ms = 20;
  int prompt_min = 8, prompt_max = 96;
  int output_min = 8, output_max = 64;
  std::vector<std::string> modes = {"continuous", "dynamic", "static"};
  bool job_ticket = false;
  int job_queue_size = 0;
  int threads = 1;
  std::int64_t step_delay_us = 0;
  std::uint64_t seed = 7;
  std::string csv;
  std::vector<double> rates;  ///< empty = {rate}
  int kv_blocks = 1024;
  bool cluster = false;
  bool queued_steps = true;  ///< serving.queued_steps (a one-stage cluster)
  std::string conveyor;  ///< the binary the cluster's workers run
  std::string device = "cpu", dtype = "f32";
  int stages = 1;
};

struct arrival {
  double at_s;
  service::generate_request request;
};

/// Records when each token of one request arrived (the service calls it from its own thread).
class timing_sink final : public service::token_sink {
 public:
  void on_tokens(std::span<const std::int32_t> t) override {
    const auto now = clock_type::now();
    std::lock_guard lock(mu_);
    for (std::size_t i = 0; i < t.size(); ++i) times_.push_back(now);
  }
  void on_done(result<service::generate_summary> s) override {
    std::lock_guard lock(mu_);
    ok_ = s.ok();
    overloaded_ = !s.ok() && s.err().code == errc::overloaded;
    end_ = clock_type::now();
    done_ = true;
  }
  clock_type::time_point submitted;
  std::mutex mu_;
  std::vector<clock_type::time_point> times_;
  clock_type::time_point end_;
  bool done_ = false, ok_ = false, overloaded_ = false;
};

std::vector<arrival> make_arrivals(const bench_options& o, int vocab) {
  std::mt19937_64 rng(o.seed);
  std::exponential_distribution<double> gap(o.rate);
  std::uniform_int_distribution<int> plen(o.prompt_min, o.prompt_max), olen(o.output_min, o.output_max);
  std::uniform_int_distribution<int> tok(3, vocab - 1);
  std::vector<arrival> out;
  double t = 0.0;
  for (int i = 0; i < o.requests; ++i) {
    t += gap(rng);
    arrival a;
    a.at_s = t;
    a.request.prompt.resize(plen(rng));
    for (auto& id : a.request.prompt) id = tok(rng);
    a.request.max_new_tokens = olen(rng);
    a.request.ignore_eos = true;  // exact output lengths: every mode does the same work
    out.push_back(std::move(a));
  }
  return out;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const double idx = p / 100.0 * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(idx));
  const auto hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (idx - static_cast<double>(lo));
}

struct mode_result {
  std::string mode;
  double rate = 0;
  int completed = 0, rejected = 0, failed = 0;
  std::int64_t tokens = 0;
  double wall_s = 0;
  double ttft_p50 = 0, ttft_p99 = 0, itl_p50 = 0, itl_p99 = 0, e2e_p50 = 0, e2e_p99 = 0;
  double busy_s = 0;  ///< engine time (the rest of wall_s the service waited for work)
  std::int64_t preemptions = 0;
  double tok_per_s() const { return tokens / wall_s; }
};

/// The service one mode runs on: the in-process engine, or a cluster of worker processes.
struct service_holder {
  std::unique_ptr<service::inference_service> local;
  std::unique_ptr<coordinator::cluster> cluster;
  service::inference_service& get() { return cluster ? cluster->service() : *local; }
};

service::stats_report stats_now(service::inference_service& svc) {
  std::promise<service::stats_report> stats;
  svc.stats([&](service::stats_report st) { stats.set_value(std::move(st)); });
  return stats.get_future().get();
}

result<service_holder> make_service(const bench_options& o, const std::string& mode) {
  service::local_service_options so;
  so.threads = o.threads;
  so.step_delay_us = o.step_delay_us;
  so.max_seqs_per_step = o.max_batch_size;
  so.max_step_tokens = 512;
  so.kv_blocks = o.kv_blocks;
  so.policy.max_batch_delay_ms = o.delay_ms;
  so.policy.use_job_ticket = o.job_ticket;
  so.policy.job_queue_size = o.job_queue_size;
  so.policy.prefix_caching = false;  // random prompts share nothing; keep the comparison about batching
  so.policy.queued_steps = o.queued_steps;
  if (mode == "continuous") {
    so.policy.batching = service::batching_mode::continuous;
  } else if (mode == "dynamic") {
    so.policy.batching = service::batching_mode::dynamic;
  } else if (mode == "static") {
    so.policy.batching = service::batching_mode::fixed;
  } else {
    return make_error(errc::invalid_argument, "unknown mode \"" + mode + "\" (continuous, dynamic, static)");
  }
  service_holder h;
  if (!o.cluster) {
    CONVEYOR_TRY_ASSIGN(svc, service::make_local_inference_service(o.model, so));
    h.local = std::move(svc);
    return h;
  }
  coordinator::cluster_options co;
  co.model_dir = o.model;
  co.stages = o.stages;
  co.chunks = o.stages;
  co.kv_blocks = so.kv_blocks;
  co.max_step_tokens = so.max_step_tokens;
  co.max_seqs_per_step = so.max_seqs_per_step;
  co.policy = so.policy;
  co.worker_threads = o.threads;
  co.executable = o.conveyor;
  co.device = o.device;
  co.dtype = o.dtype;
  co.step_delay_us = o.step_delay_us;
  co.startup_timeout = std::chrono::seconds(120);
  CONVEYOR_TRY_ASSIGN(cl, coordinator::cluster::start(co));
  h.cluster = std::move(cl);
  return h;
}

result<mode_result> run_rate(service::inference_service* svc, const std::string& mode, double rate,
                             const std::vector<arrival>& arrivals) {
  const auto before = stats_now(*svc);
  std::vector<std::shared_ptr<timing_sink>> sinks;
  const auto t0 = clock_type::now();
  for (const auto& a : arrivals) {
    std::this_thread::sleep_until(t0 + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(a.at_s)));
    auto sink = std::make_shared<timing_sink>();
    sink->submitted = clock_type::now();
    sinks.push_back(sink);
    svc->submit(a.request, sink);
  }
  // The arrivals have ended: a static batch that is not full would otherwise wait for ever.
  svc->flush();
  for (;;) {
    const bool all = std::all_of(sinks.begin(), sinks.end(), [](auto& s) {
      std::lock_guard lock(s->mu_);
      return s->done_;
    });
    if (all) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  mode_result r;
  r.mode = mode;
  r.rate = rate;
  {
    // A cluster's stage times arrive with its heartbeat: let one pass.
    std::this_thread::sleep_for(std::chrono::milliseconds(600));
    const auto st = stats_now(*svc);
    auto busy0 = [](const service::stats_report& x) { return x.stage_busy_s.empty() ? 0.0 : x.stage_busy_s[0]; };
    r.busy_s = busy0(st) - busy0(before);
    r.preemptions = st.preemptions - before.preemptions;
  }
  std::vector<double> ttft, itl, e2e;
  clock_type::time_point last = t0;
  for (auto& s : sinks) {
    std::lock_guard lock(s->mu_);
    if (!s->ok_) {
      (s->overloaded_ ? r.rejected : r.failed)++;
      continue;
    }
    ++r.completed;
    r.tokens += static_cast<std::int64_t>(s->times_.size());
    auto ms = [](clock_type::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
    if (!s->times_.empty()) ttft.push_back(ms(s->times_.front() - s->submitted));
    for (std::size_t i = 1; i < s->times_.size(); ++i) itl.push_back(ms(s->times_[i] - s->times_[i - 1]));
    e2e.push_back(ms(s->end_ - s->submitted));
    last = std::max(last, s->end_);
  }
  r.wall_s = std::chrono::duration<double>(last - t0).count();
  r.ttft_p50 = percentile(ttft, 50);
  r.ttft_p99 = percentile(ttft, 99);
  r.itl_p50 = percentile(itl, 50);
  r.itl_p99 = percentile(itl, 99);
  r.e2e_p50 = percentile(e2e, 50);
  r.e2e_p99 = percentile(e2e, 99);
  return r;
}

bool parse_range(const std::string& s, int& lo, int& hi) {
  auto colon = s.find(':');
  if (colon == std::string::npos) return false;
  std::string why;
  lo = bench::parse_int_flag("", s.substr(0, colon), 1, 1 << 20, why);
  hi = bench::parse_int_flag("", s.substr(colon + 1), 1, 1 << 20, why);
  return why.empty() && hi >= lo;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= s.size()) {
    auto comma = s.find(',', start);
    if (comma == std::string::npos) comma = s.size();
    if (comma > start) out.push_back(s.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

int usage(const char* why) {
  std::fprintf(stderr, "serving_bench: %s\n(see the comment at the top of bench/serving_bench.cpp)\n", why);
  return 2;
}

/// A malformed flag value ends the run at once, as usage() does (bench/flag_values.hpp).
[[noreturn]] void die(const std::string& why) { std::exit(usage(why.c_str())); }

}  // namespace

int main(int argc, char** argv) {
  bench_options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&] { return bench::flag_value(argc, argv, i, die); };
    if (a == "--model") o.model = value();
    else if (a == "--requests") o.requests = bench::int_flag(a, value(), 1, 1 << 24, die);
    else if (a == "--rate") o.rate = bench::real_flag(a, value(), 1e-6, 1e9, die);
    else if (a == "--max-batch-size") o.max_batch_size = bench::int_flag(a, value(), 1, 1 << 16, die);
    else if (a == "--delay-ms") o.delay_ms = bench::int_flag(a, value(), 0, 3600 * 1000, die);
    else if (a == "--prompt") { if (!parse_range(value(), o.prompt_min, o.prompt_max)) return usage("--prompt MIN:MAX"); }
    else if (a == "--output") { if (!parse_range(value(), o.output_min, o.output_max)) return usage("--output MIN:MAX"); }
    else if (a == "--modes") o.modes = split(value());
    else if (a == "--job-ticket") o.job_ticket = true;
    else if (a == "--job-queue-size") o.job_queue_size = bench::int_flag(a, value(), 0, 1 << 24, die);
    else if (a == "--threads") o.threads = bench::int_flag(a, value(), 0, 4096, die);  // 0: every core
    else if (a == "--step-delay-us") o.step_delay_us = bench::int_flag(a, value(), 0, 60 * 1000 * 1000, die);
    else if (a == "--seed") o.seed = static_cast<std::uint64_t>(bench::int_flag(a, value(), 0, 0x7fffffff, die));
    else if (a == "--csv") o.csv = value();
    else if (a == "--rates") { for (const auto& x : split(value())) o.rates.push_back(bench::real_flag(a, x, 1e-6, 1e9, die)); }
    else if (a == "--kv-blocks") o.kv_blocks = bench::int_flag(a, value(), 1, 1 << 24, die);
    else if (a == "--cluster") o.cluster = true;
    else if (a == "--conveyor") o.conveyor = value();
    else if (a == "--device") o.device = value();
    else if (a == "--dtype") o.dtype = value();
    else if (a == "--stages") o.stages = bench::int_flag(a, value(), 1, 1024, die);
    else if (a == "--queued-steps") o.queued_steps = bench::int_flag(a, value(), 0, 1, die) != 0;
    else return usage(("unknown flag " + a).c_str());
  }
  if (o.requests < 1 || !(o.rate > 0) || o.max_batch_size < 1) return usage("--requests, --rate and --max-batch-size must be positive");
  if (o.cluster && o.conveyor.empty()) return usage("--cluster needs --conveyor PATH (the binary its workers run)");
  if (o.rates.empty()) o.rates.push_back(o.rate);
  for (double r : o.rates) {
    if (!(r > 0)) return usage("--rates must be positive");
  }
  auto config = engine::load_model_config(o.model);
  if (!config) return usage(config.err().message.c_str());
  std::int64_t offered_tokens = 0;
  for (const auto& a : make_arrivals(o, config->vocab_size)) offered_tokens += a.request.max_new_tokens;
  std::printf("serving_bench: %s, %s, %d requests per rate, Poisson arrivals, prompts %d..%d, outputs %d..%d "
              "(%lld tokens), max_batch_size %d, max_batch_delay_ms %d, step delay %lld us%s\n",
              o.model.c_str(),
              o.cluster ? ("a cluster of " + std::to_string(o.stages) + " " + o.device + " stage(s), " + o.dtype).c_str()
                        : "in process",
              o.requests, o.prompt_min, o.prompt_max, o.output_min, o.output_max,
              static_cast<long long>(offered_tokens), o.max_batch_size, o.delay_ms,
              static_cast<long long>(o.step_delay_us),
              (std::string(o.job_ticket ? ", job tickets" : "") +
               (o.cluster && o.stages == 1 ? (o.queued_steps ? ", queued steps" : ", plain steps") : ""))
                  .c_str());
  std::printf("%-10s %6s %6s %6s %8s %8s %9s %8s %8s %8s %8s %9s %9s %9s\n", "mode", "rate", "done", "rej%", "wall_s",
              "busy_s", "tok/s", "vs_cont", "ttft50", "ttft99", "itl50", "itl99", "e2e50", "e2e99");
  std::vector<mode_result> results;
  std::vector<double> first_mode_tok_s;  // per rate: the reference for vs_cont
  for (const auto& mode : o.modes) {
    auto holder = make_service(o, mode);
    if (!holder) return usage(holder.err().message.c_str());
    for (std::size_t ri = 0; ri < o.rates.size(); ++ri) {
      bench_options at_rate = o;
      at_rate.rate = o.rates[ri];
      const auto arrivals = make_arrivals(at_rate, config->vocab_size);
      auto r = run_rate(&holder->get(), mode, at_rate.rate, arrivals);
      if (!r) return usage(r.err().message.c_str());
      results.push_back(*r);
      if (first_mode_tok_s.size() <= ri) first_mode_tok_s.push_back(r->tok_per_s());
      std::printf("%-10s %6.0f %6d %6.1f %8.2f %8.2f %9.0f %8.2f %8.1f %8.1f %8.2f %9.2f %9.1f %9.1f\n", r->mode.c_str(),
                  r->rate, r->completed, 100.0 * r->rejected / o.requests, r->wall_s, r->busy_s, r->tok_per_s(),
                  r->tok_per_s() / first_mode_tok_s[ri], r->ttft_p50, r->ttft_p99, r->itl_p50, r->itl_p99, r->e2e_p50,
                  r->e2e_p99);
      std::fflush(stdout);
    }
    if (holder->cluster) holder->cluster->shutdown();
  }
  std::printf("(latencies in ms; vs_cont = throughput / the first mode's; busy_s = engine time)\n");
  for (const auto& r : results) {
    if (r.preemptions > 0 || r.failed > 0) {
      std::printf("%s: %lld preemptions, %d failed\n", r.mode.c_str(), static_cast<long long>(r.preemptions), r.failed);
    }
  }
  if (!o.csv.empty()) {
    std::ofstream csv(o.csv);
    csv << "mode,rate,completed,rejected,wall_s,tok_per_s,ttft_p50_ms,ttft_p99_ms,itl_p50_ms,itl_p99_ms,e2e_p50_ms,e2e_p99_ms\n";
    for (const auto& r : results) {
      csv << r.mode << ',' << r.rate << ',' << r.completed << ',' << r.rejected << ',' << r.wall_s << ','
          << r.tok_per_s() << ',' << r.ttft_p50 << ',' << r.ttft_p99 << ',' << r.itl_p50 << ',' << r.itl_p99 << ','
          << r.e2e_p50 << ',' << r.e2e_p99 << '\n';
    }
  }
  return 0;
}
