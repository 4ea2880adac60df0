#pragma once
// What a timeline of GPU spans says about a step (kernel_timeline.hpp records them): each span's
// marginal time inside one graph launch, per-name sums over launches, and what ran between
// launches. Plain C++ (no CUDA, no CUPTI), so its arithmetic is unit-tested on any machine.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace conveyor::bench {

struct gpu_span {
  enum class span_kind { kernel, memcpy, memset } kind = span_kind::kernel;
  std::string name;           ///< a kernel's function name (no namespace, template arguments or parameters)
  std::uint64_t start = 0;    ///< ns, the device's clock
  std::uint64_t end = 0;
  std::uint32_t correlation = 0;  ///< the API call that launched it: one cudaGraphLaunch for a graph's nodes
  int grid = 0, block = 0, registers = 0;
  std::uint64_t bytes = 0;    ///< memcpy / memset
};

/// One span of a launch in start order, with its marginal time: how far it moved the latest end
/// seen so far (a gap before it counts against it, so a launch's marginals sum to its span from
/// first start to last end), and that gap alone.
struct launch_row {
  const gpu_span* span = nullptr;
  std::uint64_t marginal = 0, gap = 0;
};

/// The spans sharing `correlation`, by start, with their marginal times.
std::vector<launch_row> launch_rows(const std::vector<gpu_span>& spans, std::uint32_t correlation);

/// The correlation ids of the graph launches (ids shared by more than `min_kernels` kernels), oldest first.
std::vector<std::uint32_t> graph_launches(const std::vector<gpu_span>& spans, int min_kernels = 8);

/// Prints one graph launch (the spans sharing `correlation`) in start order, with each span's offset,
/// length and marginal time; `label` heads the table.
void print_launch(std::FILE* out, const std::string& label, const std::vector<gpu_span>& spans,
                  std::uint32_t correlation);

/// Sums the marginal time of each name over the given launches (their mean per launch), printed
/// beside the launches' mean span and what the device ran between consecutive launches.
void print_summary(std::FILE* out, const std::string& label, const std::vector<gpu_span>& spans,
                   const std::vector<std::uint32_t>& launches);

/// Consecutive graph launches as a served loop sees them: the period from one launch's first start
/// to the next's, each launch's span, and the device's idle time between them (the gap less what
/// other spans covered there). Over hundreds of steps a per-gap list is unreadable; these are the
/// mean, median, p90 and max of each.
struct launch_gaps {
  struct stats {
    double mean_us = 0, median_us = 0, p90_us = 0, max_us = 0;
  };
  std::size_t launches = 0;
  stats period, span, idle, busy_between;
};
launch_gaps gaps_between(const std::vector<gpu_span>& spans, const std::vector<std::uint32_t>& launches);
void print_gaps(std::FILE* out, const std::string& label, const launch_gaps& g);

}  // namespace conveyor::bench
