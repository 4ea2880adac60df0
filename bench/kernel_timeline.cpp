// CUPTI activity records -> spans, and the tables of one graph launch (kernel_timeline.hpp).
#include "kernel_timeline.hpp"

#include <cuda_runtime.h>
#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

namespace conveyor::bench {
namespace {

// CUPTI's buffer callbacks are plain functions, so what they collect has to live at namespace scope.
std::mutex records_mutex;
std::vector<gpu_span> records;

constexpr std::size_t buffer_bytes = 8u << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, buffer_bytes));
  *size = buffer_bytes;
  *max_records = 0;  // as many as fit
}

// "void ns::(anonymous namespace)::gemv_kernel<8, true>(args...)" -> "gemv_kernel<8, true>".
std::string short_name(const char* mangled) {
  if (mangled == nullptr) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string s = (status == 0 && d != nullptr) ? d : mangled;
  std::free(d);
  for (std::size_t p; (p = s.find("(anonymous namespace)::")) != std::string::npos;) s.erase(p, 23);
  int depth = 0;
  std::size_t cut = s.size(), word = 0, scope = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '<') ++depth;
    if (c == '>') --depth;
    if (depth != 0) continue;
    if (c == '(') {
      cut = i;
      break;
    }
    if (c == ' ') word = i + 1;
    if (c == ':' && i + 1 < s.size() && s[i + 1] == ':') scope = i + 2;
  }
  s = s.substr(std::max(word, scope), cut - std::max(word, scope));
  if (s.size() > 56) s = s.substr(0, 53) + "...";
  return s;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::vector<gpu_span> got;
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    gpu_span s;
    if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || record->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
      s.kind = gpu_span::span_kind::kernel;
      s.name = short_name(k->name);
      s.start = k->start;
      s.end = k->end;
      s.correlation = k->correlationId;
      s.grid = k->gridX * k->gridY * k->gridZ;
      s.block = k->blockX * k->blockY * k->blockZ;
      s.registers = k->registersPerThread;
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
      s.kind = gpu_span::span_kind::memcpy;
      static const char* kinds[] = {"?", "HtoD", "DtoH", "HtoA", "AtoH", "AtoA", "AtoD", "DtoA", "DtoD", "HtoH", "PtoP"};
      s.name = std::string("memcpy ") + (m->copyKind < 11 ? kinds[m->copyKind] : "?");
      s.start = m->start;
      s.end = m->end;
      s.correlation = m->correlationId;
      s.bytes = m->bytes;
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
      s.kind = gpu_span::span_kind::memset;
      s.name = "memset";
      s.start = m->start;
      s.end = m->end;
      s.correlation = m->correlationId;
      s.bytes = m->bytes;
    } else {
      continue;
    }
    got.push_back(std::move(s));
  }
  std::free(buffer);
  std::lock_guard<std::mutex> lock(records_mutex);
  records.insert(records.end(), std::make_move_iterator(got.begin()), std::make_move_iterator(got.end()));
}

std::string cupti_error(CUptiResult r, const char* what) {
  const char* text = nullptr;
  cuptiGetResultString(r, &text);
  return std::string(what) + ": " + (text != nullptr ? text : "unknown CUPTI error");
}

const CUpti_ActivityKind traced[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                     CUPTI_ACTIVITY_KIND_MEMSET};

double us(std::uint64_t ns) { return static_cast<double>(ns) * 1e-3; }

std::vector<const gpu_span*> launch_spans(const std::vector<gpu_span>& spans, std::uint32_t correlation) {
  std::vector<const gpu_span*> v;
  for (const auto& s : spans) {
    if (s.correlation == correlation) v.push_back(&s);
  }
  std::sort(v.begin(), v.end(), [](const gpu_span* a, const gpu_span* b) { return a->start < b->start; });
  return v;
}

// Marginal time of each span in start order: how far it moved the latest end (a gap before it
// counts against it, so the marginals sum to the launch's span), and the gap alone.
struct marginal {
  std::uint64_t moved = 0, gap = 0;
};
std::vector<marginal> marginals(const std::vector<const gpu_span*>& v) {
  std::vector<marginal> m(v.size());
  if (v.empty()) return m;
  std::uint64_t latest = v.front()->start;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (v[i]->start > latest) m[i].gap = v[i]->start - latest;
    if (v[i]->end > latest) {
      m[i].moved = v[i]->end - latest;
      latest = v[i]->end;
    }
  }
  return m;
}

}  // namespace

std::string kernel_timeline::start() {
  {
    std::lock_guard<std::mutex> lock(records_mutex);
    records.clear();
  }
  if (CUptiResult r = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed); r != CUPTI_SUCCESS) {
    return cupti_error(r, "cuptiActivityRegisterCallbacks");
  }
  for (CUpti_ActivityKind k : traced) {
    if (CUptiResult r = cuptiActivityEnable(k); r != CUPTI_SUCCESS) return cupti_error(r, "cuptiActivityEnable");
  }
  return {};
}

std::vector<gpu_span> kernel_timeline::stop() {
  cudaDeviceSynchronize();
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  for (CUpti_ActivityKind k : traced) cuptiActivityDisable(k);
  std::lock_guard<std::mutex> lock(records_mutex);
  std::vector<gpu_span> out = std::move(records);
  records.clear();
  std::sort(out.begin(), out.end(), [](const gpu_span& a, const gpu_span& b) { return a.start < b.start; });
  return out;
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
  const auto v = launch_spans(spans, correlation);
  if (v.empty()) return;
  const auto m = marginals(v);
  const std::uint64_t t0 = v.front()->start;
  std::uint64_t last = t0;
  for (const gpu_span* s : v) last = std::max(last, s->end);
  std::fprintf(out, "timeline %s: one graph launch, %zu spans, %.1f us from first start to last end\n", label.c_str(),
               v.size(), us(last - t0));
  std::fprintf(out, "  %4s %-56s %6s %5s %9s %8s %8s %7s\n", "#", "kernel", "grid", "regs", "start_us", "len_us",
               "marg_us", "gap_us");
  for (std::size_t i = 0; i < v.size(); ++i) {
    std::fprintf(out, "  %4zu %-56s %6d %5d %9.2f %8.2f %8.2f %7.2f\n", i, v[i]->name.c_str(), v[i]->grid,
                 v[i]->registers, us(v[i]->start - t0), us(v[i]->end - v[i]->start), us(m[i].moved), us(m[i].gap));
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
    const auto v = launch_spans(spans, c);
    const auto m = marginals(v);
    std::uint64_t last = 0;
    for (std::size_t i = 0; i < v.size(); ++i) {
      auto& a = by[v[i]->name];
      ++a.count;
      a.len += v[i]->end - v[i]->start;
      a.moved += m[i].moved;
      a.gap += m[i].gap;
      last = std::max(last, v[i]->end);
    }
    span_sum += last - v.front()->start;
    bounds.push_back({v.front()->start, last});
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

}  // namespace conveyor::bench
