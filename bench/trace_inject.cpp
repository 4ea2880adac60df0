// A GPU timeline of any CUDA process, with no change to it: CUDA loads the library named by
// CUDA_INJECTION64_PATH when it initialises and calls InitializeInjection, which starts the CUPTI
// activity records (kernel_timeline.hpp); at exit the process's graph launches are summarised into
// $CONVEYOR_TRACE_DIR/trace-<pid>.txt. Made for the served chain (issue 8): a stage worker is
// started by the coordinator, so only the environment reaches it, and the question is where the
// time between the engine's step and a served token goes (device idle between step graphs, or a
// slower graph).
//   CUDA_INJECTION64_PATH=.../libconveyor_trace.so CONVEYOR_TRACE_DIR=/tmp/t conveyor batch ...
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "kernel_timeline.hpp"

namespace {

conveyor::bench::kernel_timeline timeline;

// Runs before the CUDA runtime's own teardown: that was registered when the runtime initialised,
// which is before CUDA called us.
void write_trace() {
  using namespace conveyor::bench;
  const std::vector<gpu_span> spans = timeline.stop();
  const char* dir = std::getenv("CONVEYOR_TRACE_DIR");
  const std::string path = std::string(dir != nullptr && *dir != '\0' ? dir : ".") + "/trace-" + std::to_string(::getpid()) + ".txt";
  std::FILE* out = std::fopen(path.c_str(), "w");
  if (out == nullptr) {
    std::fprintf(stderr, "conveyor trace: cannot write %s\n", path.c_str());
    return;
  }
  const auto launches = graph_launches(spans);
  std::fprintf(out, "trace of pid %d: %zu spans\n", static_cast<int>(::getpid()), spans.size());
  print_gaps(out, "all", gaps_between(spans, launches));
  print_summary(out, "all", spans, launches);
  std::fclose(out);
  std::fprintf(stderr, "conveyor trace: %zu graph launches in %s\n", launches.size(), path.c_str());
}

}  // namespace

extern "C" int InitializeInjection(void) {
  if (std::string why = timeline.start(); !why.empty()) {
    std::fprintf(stderr, "conveyor trace: %s (no timeline)\n", why.c_str());
    return 1;  // the process runs on untraced
  }
  std::atexit(write_trace);
  return 1;
}
