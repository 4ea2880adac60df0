// conveyor worker: one stage-worker process, started by `serve` or `launch` (directly, through an
// ssh-style command template, or as one task of an srun step).
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>

#include "command.hpp"
#include "conveyor/coordinator/launch_spec.hpp"
#include "conveyor/stage/worker_main.hpp"
#include "flags.hpp"

namespace conveyor::cli {

namespace {

std::string numeric(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET) inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof buf);
  if (sa->sa_family == AF_INET6) inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, buf, sizeof buf);
  return buf;
}

/// The network interface that holds `address` (an IP or a name that resolves to one of ours), for
/// UCX_NET_DEVICES; not_found when this machine has no such address.
result<std::string> interface_of(const std::string& address) {
  std::vector<std::string> wanted;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(address.c_str(), nullptr, &hints, &found) == 0) {
    for (addrinfo* a = found; a != nullptr; a = a->ai_next) wanted.push_back(numeric(a->ai_addr));
    ::freeaddrinfo(found);
  }
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return make_error(errc::io, std::string("cannot list network interfaces: ") + std::strerror(errno));
  std::string device;
  std::string have;
  for (ifaddrs* i = ifs; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6)) continue;
    const std::string ip = numeric(i->ifa_addr);
    have += (have.empty() ? "" : ", ") + ip + " (" + i->ifa_name + ")";
    if (device.empty() && std::find(wanted.begin(), wanted.end(), ip) != wanted.end()) device = i->ifa_name;
  }
  ::freeifaddrs(ifs);
  if (device.empty()) {
    return make_error(errc::not_found, "address " + address + " is not an address of this machine (it has " +
                                           (have.empty() ? std::string("none") : have) + ")");
  }
  return device;
}

/// Reads the first line of stdin (the cluster token, written there by the launcher) and then keeps
/// reading: when stdin closes, whoever started us (ssh, or the launcher itself) is gone, so stop.
result<std::string> token_from_stdin(int stage) {
  std::string token;
  for (char c;;) {
    const ssize_t n = ::read(0, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || c == '\n') break;
    token += c;
  }
  if (token.empty()) return make_error(errc::invalid_argument, "--token-stdin: no token on stdin");
  std::thread([stage] {
    char buf[256];
    for (;;) {
      const ssize_t n = ::read(0, buf, sizeof buf);
      if (n > 0 || (n < 0 && errno == EINTR)) continue;
      std::fprintf(stderr, "conveyor worker %d: stdin closed (the launcher went away); stopping\n", stage);
      std::_Exit(3);
    }
  }).detach();
  return token;
}

}  // namespace

int worker_main(const args& argv) {
  auto f = flags::parse(argv,
                        {"coordinator", "stage", "rank", "threads", "address", "token-stdin", "join-timeout", "slurm",
                         "placement"},
                        {"token-stdin", "slurm"});
  int stage_for_messages = -1;
  auto fail = [&](const std::string& m) {
    if (stage_for_messages >= 0) {
      std::fprintf(stderr, "conveyor worker %d: %s\n", stage_for_messages, m.c_str());
    } else {
      std::fprintf(stderr, "conveyor worker: %s\n", m.c_str());
    }
    return 1;
  };
  if (!f) return fail(f.err().message);
  stage::worker_options o;
  const std::string coord = f->get("coordinator").value_or("");
  const auto colon = coord.rfind(':');
  if (colon == std::string::npos) return fail("--coordinator HOST:PORT is required");
  o.coordinator_host = coord.substr(0, colon);
  char* port_end = nullptr;
  const long port = std::strtol(coord.c_str() + colon + 1, &port_end, 10);
  // The whole rest must be the port: "host:80x" used to connect to port 80.
  if (port <= 0 || port > 65535 || *port_end != '\0') return fail("--coordinator: bad port in \"" + coord + "\"");
  o.coordinator_port = static_cast<std::uint16_t>(port);
  auto stage = f->get_int("stage", -1, 0, 4096);
  auto rank = f->get_int("rank", 0, 0, 4096);
  auto threads = f->get_int("threads", 0, 0, 4096);
  auto join_timeout = f->get_double("join-timeout", 5.0, 0.1, 7 * 24 * 3600.0);
  if (!stage) return fail(stage.err().message);
  if (!rank) return fail(rank.err().message);
  if (!threads) return fail(threads.err().message);
  if (!join_timeout) return fail(join_timeout.err().message);
  o.rank = static_cast<int>(*rank);
  o.threads = static_cast<int>(*threads);
  o.join_timeout = std::chrono::milliseconds(static_cast<long long>(*join_timeout * 1000));
  std::optional<std::string> address = f->get("address");
  std::string host_name;

  if (f->has("slurm")) {
    // One task of an srun step: the stage is the task's rank, the placement says where it should be.
    if (f->has("stage")) return fail("--slurm takes the stage from SLURM_PROCID; leave out --stage");
    if (!f->has("placement")) return fail("--slurm needs --placement NAME@ADDRESS[/GPUS];... (conveyor launch passes it)");
    auto sites = coordinator::decode_sites(*f->get("placement"));
    if (!sites) return fail(sites.err().message);
    const char* procid = std::getenv("SLURM_PROCID");
    char* end = nullptr;
    const long k = procid != nullptr ? std::strtol(procid, &end, 10) : -1;
    if (procid == nullptr || *procid == '\0' || *end != '\0' || k < 0) {
      return fail("--slurm: SLURM_PROCID is not set to a task rank (run under srun)");
    }
    if (const char* ntasks = std::getenv("SLURM_NTASKS"); ntasks != nullptr && std::atol(ntasks) != static_cast<long>(sites->size())) {
      return fail("--slurm: the step has SLURM_NTASKS=" + std::string(ntasks) + " tasks but the placement has " +
                  std::to_string(sites->size()) + " stages");
    }
    if (k >= static_cast<long>(sites->size())) {
      return fail("--slurm: SLURM_PROCID=" + std::to_string(k) + " but the placement has only " +
                  std::to_string(sites->size()) + " stages");
    }
    const auto& site = (*sites)[static_cast<std::size_t>(k)];
    *stage = k;
    address = site.address;
    host_name = site.host_name;
    // Before any thread starts: CUDA reads it once, at initialisation.
    if (!site.visible_devices.empty()) ::setenv("CUDA_VISIBLE_DEVICES", site.visible_devices.c_str(), 1);
    if (auto iface = interface_of(site.address); !iface) {
      const char* node = std::getenv("SLURMD_NODENAME");
      stage_for_messages = static_cast<int>(k);
      return fail("SLURM_PROCID " + std::to_string(k) + " runs on node " + (node != nullptr ? node : "(unknown)") +
                  ", but the placement puts stage " + std::to_string(k) + " on host " + site.host_name + ": " +
                  iface.err().message +
                  "; list placement.hosts in the order of the allocation's nodes, with their addresses");
    }
  }
  if (*stage < 0) return fail("--stage K is required (or --slurm)");
  o.stage = static_cast<int>(*stage);
  stage_for_messages = o.stage;
  if (address) {
    auto iface = interface_of(*address);
    if (!iface) return fail(iface.err().message + (host_name.empty() ? "" : " (host " + host_name + ")"));
    o.net_devices = *iface;
  }
  if (f->has("token-stdin")) {
    auto token = token_from_stdin(o.stage);
    if (!token) return fail(token.err().message);
    o.token = *token;
  } else {
    const char* token = std::getenv("CONVEYOR_CLUSTER_TOKEN");
    if (token == nullptr || *token == '\0') return fail("CONVEYOR_CLUSTER_TOKEN is not set (the coordinator sets it)");
    o.token = token;
  }
  // A worker started by a local coordinator dies with it, even if the coordinator crashed before it
  // could say stop (remote workers notice through the actor monitor, or their stdin closing).
  if (const char* v = std::getenv("CONVEYOR_EXIT_WITH_PARENT"); v != nullptr && *v == '1') {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  }
  return stage::run_worker(o);
}

}  // namespace conveyor::cli
