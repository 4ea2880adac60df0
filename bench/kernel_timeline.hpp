#pragma once
// A timeline of the kernels, copies and sets the GPU ran, from CUPTI's activity records (start and
// end of each, as the device's clock saw them; kernels of a CUDA graph too, and with programmatic
// dependent launch their overlap). ncu serialises kernels and flushes caches, so it cannot show what
// a kernel costs inside a step where the next one starts early; this can: a kernel's share of the
// step is how far it moves the latest end seen so far ("marginal"), which sums to the step's span.
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

/// Records spans between start() and stop(). CUPTI takes plain function pointers for its buffers,
/// so the records land in one process-wide list: one timeline at a time.
class kernel_timeline {
 public:
  /// Empty on success, else why CUPTI refused (no profiling rights, another tool attached, ...).
  std::string start();
  /// Waits for the device, flushes CUPTI's buffers and returns every span since start(), by start.
  std::vector<gpu_span> stop();
};

/// Prints one graph launch (the spans sharing `correlation`) in start order, with each span's offset,
/// length and marginal time, then the same spans summed by name; `label` heads both tables.
void print_launch(std::FILE* out, const std::string& label, const std::vector<gpu_span>& spans,
                  std::uint32_t correlation);

/// The correlation ids of the graph launches (ids shared by more than `min_kernels` kernels), oldest first.
std::vector<std::uint32_t> graph_launches(const std::vector<gpu_span>& spans, int min_kernels = 8);

/// Sums the marginal time of each name over the given launches (their mean per launch), printed
/// beside the launches' mean span and the device time between consecutive launches.
void print_summary(std::FILE* out, const std::string& label, const std::vector<gpu_span>& spans,
                   const std::vector<std::uint32_t>& launches);

}  // namespace conveyor::bench
