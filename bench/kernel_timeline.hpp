#pragma once
// A timeline of the kernels, copies and sets the GPU ran, from CUPTI's activity records (start and
// end of each, as the device's clock saw them; kernels of a CUDA graph too, and with programmatic
// dependent launch their overlap). ncu serialises kernels and flushes caches, so it cannot show what
// a kernel costs inside a step where the next one starts early; this can: timeline_report.hpp turns
// the spans into each kernel's share of the step's critical path ("marginal").
#include <string>
#include <vector>

#include "timeline_report.hpp"

namespace conveyor::bench {

/// Records spans between start() and stop(). CUPTI takes plain function pointers for its buffers,
/// so the records land in one process-wide list: one timeline at a time.
class kernel_timeline {
 public:
  /// Empty on success, else why CUPTI refused (no profiling rights, another tool attached, ...).
  std::string start();
  /// Waits for the device, flushes CUPTI's buffers and returns every span since start(), by start.
  std::vector<gpu_span> stop();
};

}  // namespace conveyor::bench
