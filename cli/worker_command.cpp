// conveyor worker: one stage-worker process, normally started by the coordinator.
#include <sys/prctl.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>

#include "command.hpp"
#include "conveyor/stage/worker_main.hpp"
#include "flags.hpp"

namespace conveyor::cli {

int worker_main(const args& argv) {
  auto f = flags::parse(argv, {"coordinator", "stage", "rank", "threads"});
  auto fail = [](const std::string& m) {
    std::fprintf(stderr, "conveyor worker: %s\n", m.c_str());
    return 1;
  };
  if (!f) return fail(f.err().message);
  stage::worker_options o;
  const std::string coord = f->get("coordinator").value_or("");
  const auto colon = coord.rfind(':');
  if (colon == std::string::npos) return fail("--coordinator HOST:PORT is required");
  o.coordinator_host = coord.substr(0, colon);
  const long port = std::strtol(coord.c_str() + colon + 1, nullptr, 10);
  if (port <= 0 || port > 65535) return fail("--coordinator: bad port in \"" + coord + "\"");
  o.coordinator_port = static_cast<std::uint16_t>(port);
  auto stage = f->get_int("stage", -1, 0, 4096);
  auto rank = f->get_int("rank", 0, 0, 4096);
  auto threads = f->get_int("threads", 0, 0, 4096);
  if (!stage) return fail(stage.err().message);
  if (!rank) return fail(rank.err().message);
  if (!threads) return fail(threads.err().message);
  if (*stage < 0) return fail("--stage K is required");
  o.stage = static_cast<int>(*stage);
  o.rank = static_cast<int>(*rank);
  o.threads = static_cast<int>(*threads);
  const char* token = std::getenv("CONVEYOR_CLUSTER_TOKEN");
  if (token == nullptr || *token == '\0') return fail("CONVEYOR_CLUSTER_TOKEN is not set (the coordinator sets it)");
  o.token = token;
  // A worker started by a local coordinator dies with it, even if the coordinator crashed before it
  // could say stop (remote workers notice through the actor monitor instead).
  if (const char* v = std::getenv("CONVEYOR_EXIT_WITH_PARENT"); v != nullptr && *v == '1') {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  }
  return stage::run_worker(o);
}

}  // namespace conveyor::cli
