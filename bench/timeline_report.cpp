// The tables of a GPU timeline (timeline_report.hpp).
#include "timeline_report.hpp"

#include <algorithm>
#include <map>
#include <unordered_map>

namespace conveyor::bench {
namespace {

double us(std::uint64_t ns) { return static_cast<double>(ns) * 1e-3; }

launch_gaps::stats stats_of(std::vector<double> v) {
  launch_gaps::stats s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  s.mean_us = sum / static_cast<double>(v.size());
  s.median_us = v[v.size() / 2];
  s.p90_us = v[std::min(v.size() - 1, v.size() * 9 / 10)];
  s.max_us = v.back();
  return s;
}

}  // namespace

std::vector<launch_row> launch_rows(const std::vector<gpu_span>& spans, std::uint32_t correlation) {
  std::vector<launch_row> rows;
  for (const auto& s : spans) {
    if (s.correlation == correlation) rows.push_back({&s, 0, 0});
  }
  std::stable_sort(rows.begin(), rows.end(), [](const launch_row& a, const launch_row& b) { return a.span->start < b.span->start; });
  if (rows.empty()) return rows;
  std::uint64_t latest = rows.front().span->start;
  for (auto& r : rows) {
    if (r.span->start > latest) r.gap = r.span->start - latest;
    if (r.span->end > latest) {
      r.marginal = r.span->end - latest;
      latest = r.span->end;
    }
  }
  return rows;
}

std::vector<std::uint32_t> graph_launches(const std::vector<gpu_span>& spans, int min_kernels) {
  std::map<std::uint32_t, std::pair<int, std::uint64_t>> by;  // correlation -> (kernels, first start)
  for (const auto& s : spans) {
    if (s.kind != gpu_span::span_kind::kernel) continue;
    auto& e = by[s.correlation];
    if (e.first++ == 0 || s.start < e.second) e.second = s.start;
  }
  std::vector<std::pair<std::uint64_t, std::uint32_t>> order;
  for (const auto& [c, e] : by) {
    if (e.first > min_kernels) order.push_back({e.second, c});
  }
  std::sort(order.begin(), order.end());
  std::vector<std::uint32_t> out;
  for (const auto& o : order) out.push_back(o.second);
  return out;
}

void print_launch(std::FILE* out, const std::string& label, const std::vector<gpu_span>& spans,
                  std::uint32_t correlation) {
  const auto rows = launch_rows(spans, correlation);
  if (rows.empty()) return;
  const std::uint64_t t0 = rows.front().span->start;
  std::uint64_t last = t0;
  for (const auto& r : rows) last = std::max(last, r.span->end);
  std::fprintf(out, "timeline %s: one graph launch, %zu spans, %.1f us from first start to last end\n", label.c_str(),
               rows.size(), us(last - t0));
  std::fprintf(out, "  %4s %-56s %6s %5s %9s %8s %8s %7s\n", "#", "kernel", "grid", "regs", "start_us", "len_us",
               "marg_us", "gap_us");
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const gpu_span& s = *rows[i].span;
    std::fprintf(out, "  %4zu %-56s %6d %5d %9.2f %8.2f %8.2f %7.2f\n", i, s.name.c_str(), s.grid, s.registers,
                 us(s.start - t0), us(s.end - s.start), us(rows[i].marginal), us(rows[i].gap));
  }
}

void print_summary(std::FILE* out, const std::string& label, const std::vector<gpu_span>& spans,
                   const std::vector<std::uint32_t>& launches) {
  if (launches.empty()) {
    std::fprintf(out, "timeline %s: no graph launch recorded\n", label.c_str());
    return;
  }
  struct agg {
    int count = 0;
    std::uint64_t len = 0, moved = 0, gap = 0;
  };
  std::map<std::string, agg> by;
  std::uint64_t span_sum = 0;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> bounds;  // first start, last end per launch
  for (std::uint32_t c : launches) {
    const auto launch = launch_rows(spans, c);
    if (launch.empty()) continue;
    std::uint64_t last = 0;
    for (const auto& r : launch) {
      auto& a = by[r.span->name];
      ++a.count;
      a.len += r.span->end - r.span->start;
      a.moved += r.marginal;
      a.gap += r.gap;
      last = std::max(last, r.span->end);
    }
    span_sum += last - launch.front().span->start;
    bounds.push_back({launch.front().span->start, last});
  }
  const double n = static_cast<double>(launches.size());
  std::vector<std::pair<std::string, agg>> rows(by.begin(), by.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.moved > b.second.moved; });
  std::fprintf(out, "timeline %s: %zu graph launches, mean span %.1f us; per launch, by kernel (marginal = critical-path share)\n",
               label.c_str(), launches.size(), us(span_sum) / n);
  std::fprintf(out, "  %-56s %6s %9s %9s %9s %8s\n", "kernel", "calls", "len_us", "marg_us", "marg/call", "gap_us");
  for (const auto& [name, a] : rows) {
    std::fprintf(out, "  %-56s %6.1f %9.2f %9.2f %9.2f %8.2f\n", name.c_str(), a.count / n, us(a.len) / n,
                 us(a.moved) / n, a.count > 0 ? us(a.moved) / a.count : 0.0, us(a.gap) / n);
  }
  // Between launches: what the device ran there (copies, sets, kernels outside the graph) and the idle rest.
  for (std::size_t i = 0; i + 1 < bounds.size(); ++i) {
    const std::uint64_t from = bounds[i].second, to = bounds[i + 1].first;
    if (to <= from) continue;
    std::uint64_t busy = 0;
    std::string what;
    for (const auto& s : spans) {
      if (s.start >= from && s.end <= to) {
        busy += s.end - s.start;
        // name@start+length, in us from the end of the launch before
        char item[96];
        std::snprintf(item, sizeof item, " %s@%.1f+%.1f", s.name.c_str(), us(s.start - from), us(s.end - s.start));
        if (what.size() < 240) what += item;
      }
    }
    std::fprintf(out, "  between launches %zu and %zu: %.1f us, busy %.1f:%s\n", i, i + 1, us(to - from), us(busy),
                 what.c_str());
  }
}

launch_gaps gaps_between(const std::vector<gpu_span>& spans, const std::vector<std::uint32_t>& launches) {
  // One pass over the spans: each launch's first start and last end, and the spans outside every
  // launch (uploads, copies of draws, eager kernels), sorted by start to sum what ran in each gap.
  std::unordered_map<std::uint32_t, std::pair<std::uint64_t, std::uint64_t>> launch_bounds;
  for (std::uint32_t c : launches) launch_bounds.emplace(c, std::pair<std::uint64_t, std::uint64_t>{UINT64_MAX, 0});
  std::vector<std::pair<std::uint64_t, std::uint64_t>> others;
  for (const auto& s : spans) {
    auto it = launch_bounds.find(s.correlation);
    if (it == launch_bounds.end()) {
      others.push_back({s.start, s.end});
      continue;
    }
    it->second.first = std::min(it->second.first, s.start);
    it->second.second = std::max(it->second.second, s.end);
  }
  std::sort(others.begin(), others.end());
  std::vector<std::pair<std::uint64_t, std::uint64_t>> bounds;  // first start, last end per launch
  for (const auto& [c, b] : launch_bounds) {
    if (b.second > 0) bounds.push_back(b);
  }
  std::sort(bounds.begin(), bounds.end());
  std::vector<double> period, span, idle, busy;
  for (std::size_t i = 0; i < bounds.size(); ++i) {
    span.push_back(us(bounds[i].second - bounds[i].first));
    if (i + 1 == bounds.size()) break;
    period.push_back(us(bounds[i + 1].first - bounds[i].first));
    const std::uint64_t from = bounds[i].second, to = bounds[i + 1].first;
    if (to <= from) {  // the next launch began before this one ended (no gap)
      idle.push_back(0);
      busy.push_back(0);
      continue;
    }
    // Covered time inside (from, to): the union of the other spans clipped to it.
    std::uint64_t covered = 0, reach = from;
    for (const auto& [a0, b0] : others) {  // by start: `reach` is the end of the union so far
      if (a0 >= to) break;
      const std::uint64_t a = std::max(a0, reach), b = std::min(b0, to);
      if (b > a) {
        covered += b - a;
        reach = b;
      }
    }
    busy.push_back(us(covered));
    idle.push_back(us(to - from - covered));
  }
  launch_gaps g;
  g.launches = bounds.size();
  g.period = stats_of(period);
  g.span = stats_of(span);
  g.idle = stats_of(idle);
  g.busy_between = stats_of(busy);
  return g;
}

void print_gaps(std::FILE* out, const std::string& label, const launch_gaps& g) {
  std::fprintf(out, "timeline %s: %zu graph launches (us: mean / median / p90 / max)\n", label.c_str(), g.launches);
  auto row = [&](const char* what, const launch_gaps::stats& s) {
    std::fprintf(out, "  %-34s %9.1f %9.1f %9.1f %9.1f\n", what, s.mean_us, s.median_us, s.p90_us, s.max_us);
  };
  row("period (start to next start)", g.period);
  row("launch span (first start to end)", g.span);
  row("device idle between launches", g.idle);
  row("other work between launches", g.busy_between);
}

}  // namespace conveyor::bench
