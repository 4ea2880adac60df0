#include "conveyor/coordinator/launch_spec.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <map>

namespace conveyor::coordinator {

namespace {

std::string label_of(const worker_site& s, int stage) {
  if (s.address.empty()) return "stage " + std::to_string(stage);
  return "host " + s.host_name + " (" + s.address + ") stage " + std::to_string(stage);
}

/// The worker's own flags, the same for every method but the stage selection.
std::vector<std::string> common_flags(const launch_settings& ls) {
  char timeout[32];
  std::snprintf(timeout, sizeof timeout, "%g", ls.join_timeout_s);
  return {"--coordinator", ls.coordinator, "--threads", std::to_string(ls.threads), "--join-timeout", timeout};
}

std::string shell_line(const std::vector<std::string>& words) {
  std::string line;
  for (const auto& w : words) line += (line.empty() ? "" : " ") + shell_quote(w);
  return line;
}

}  // namespace

std::vector<int> gpu_sharers(const std::vector<worker_site>& sites) {
  auto gpus = [](const std::string& list) {
    std::vector<std::string> out;
    std::size_t from = 0;
    while (from <= list.size() && !list.empty()) {
      const std::size_t comma = std::min(list.find(',', from), list.size());
      out.push_back(list.substr(from, comma - from));
      from = comma + 1;
    }
    return out;
  };
  auto overlap = [&](const worker_site& x, const worker_site& y) {
    if (x.host_name != y.host_name) return false;
    if (x.visible_devices.empty() || y.visible_devices.empty()) return true;
    const auto a = gpus(x.visible_devices), b = gpus(y.visible_devices);
    return std::any_of(a.begin(), a.end(), [&](const std::string& g) { return std::find(b.begin(), b.end(), g) != b.end(); });
  };
  std::vector<int> out(sites.size(), 0);
  for (std::size_t i = 0; i < sites.size(); ++i)
    for (const auto& other : sites) out[i] += overlap(sites[i], other) ? 1 : 0;
  return out;
}

std::string shell_quote(std::string_view s) {
  const bool plain = !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || std::string_view("@%+=:,./_-").find(c) != std::string_view::npos;
  });
  if (plain) return std::string(s);
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

result<std::string> expand_template(std::string_view tmpl, const std::vector<std::pair<std::string, std::string>>& values) {
  std::string out;
  for (std::size_t i = 0; i < tmpl.size(); ++i) {
    if (tmpl[i] != '{') {
      out += tmpl[i];
      continue;
    }
    const std::size_t close = tmpl.find('}', i);
    if (close == std::string_view::npos) {
      return make_error(errc::invalid_argument, "launch template \"" + std::string(tmpl) + "\": unmatched {");
    }
    const std::string name(tmpl.substr(i + 1, close - i - 1));
    auto it = std::find_if(values.begin(), values.end(), [&](const auto& kv) { return kv.first == name; });
    if (it == values.end()) {
      std::string known;
      for (const auto& kv : values) known += (known.empty() ? "{" : ", {") + kv.first + "}";
      return make_error(errc::invalid_argument, "launch template \"" + std::string(tmpl) + "\": unknown placeholder {" +
                                                    name + "} (known: " + known + ")");
    }
    out += it->second;
    i = close;
  }
  return out;
}

std::string encode_sites(const std::vector<worker_site>& sites) {
  std::string out;
  for (const auto& s : sites) {
    out += (out.empty() ? "" : ";") + s.host_name + "@" + s.address;
    if (!s.visible_devices.empty()) out += "/" + s.visible_devices;
  }
  return out;
}

result<std::vector<worker_site>> decode_sites(std::string_view text) {
  std::vector<worker_site> out;
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t end = std::min(text.find(';', at), text.size());
    const std::string_view entry = text.substr(at, end - at);
    const std::size_t amp = entry.find('@');
    if (amp == std::string_view::npos || amp == 0 || amp + 1 == entry.size()) {
      return make_error(errc::invalid_argument, "--placement entry " + std::to_string(out.size()) + " \"" +
                                                    std::string(entry) + "\": expected NAME@ADDRESS[/GPUS]");
    }
    worker_site s;
    s.host_name = std::string(entry.substr(0, amp));
    const std::string_view rest = entry.substr(amp + 1);
    const std::size_t slash = rest.find('/');
    s.address = std::string(rest.substr(0, slash));
    if (slash != std::string_view::npos) s.visible_devices = std::string(rest.substr(slash + 1));
    out.push_back(std::move(s));
    at = end + 1;
  }
  return out;
}

result<std::vector<process_spec>> worker_processes(const launch_settings& ls, const std::vector<worker_site>& sites,
                                                   const std::string& token) {
  std::vector<process_spec> out;
  const std::string token_env = "CONVEYOR_CLUSTER_TOKEN=" + token;
  switch (ls.method) {
    case launch_method::local:
      for (std::size_t k = 0; k < sites.size(); ++k) {
        process_spec p;
        p.argv = {ls.executable, "worker", "--stage", std::to_string(k)};
        const std::string& address = sites[k].address.empty() ? ls.default_address : sites[k].address;
        if (!address.empty()) p.argv.insert(p.argv.end(), {"--address", address});
        const auto flags = common_flags(ls);
        p.argv.insert(p.argv.end(), flags.begin(), flags.end());
        // A worker started here dies with us, even if we crash before we can say stop.
        p.env = {token_env, "CONVEYOR_EXIT_WITH_PARENT=1"};
        if (!sites[k].visible_devices.empty()) p.env.push_back("CUDA_VISIBLE_DEVICES=" + sites[k].visible_devices);
        p.stages = {static_cast<int>(k)};
        p.label = label_of(sites[k], static_cast<int>(k));
        out.push_back(std::move(p));
      }
      return out;
    case launch_method::ssh:
      for (std::size_t k = 0; k < sites.size(); ++k) {
        // The far side runs {command} with a shell (as ssh does), so an `env` prefix sets the GPUs
        // whatever the login shell is.
        std::vector<std::string> words;
        if (!sites[k].visible_devices.empty()) words = {"env", "CUDA_VISIBLE_DEVICES=" + sites[k].visible_devices};
        for (const auto& w : {ls.executable, std::string("worker"), std::string("--stage"), std::to_string(k),
                              std::string("--address"), sites[k].address, std::string("--token-stdin")}) {
          words.push_back(w);
        }
        const auto flags = common_flags(ls);
        words.insert(words.end(), flags.begin(), flags.end());
        CONVEYOR_TRY_ASSIGN(line, expand_template(ls.ssh_template, {{"host", shell_quote(sites[k].address)},
                                                                    {"address", shell_quote(sites[k].address)},
                                                                    {"name", shell_quote(sites[k].host_name)},
                                                                    {"command", shell_quote(shell_line(words))}}));
        process_spec p;
        p.argv = {"/bin/sh", "-c", line};
        p.stdin_text = token + "\n";
        p.stages = {static_cast<int>(k)};
        p.label = label_of(sites[k], static_cast<int>(k));
        out.push_back(std::move(p));
      }
      return out;
    case launch_method::slurm: {
      // One step: task k is stage k. Tasks are laid out in host order, as many per node as the
      // placement puts there; the worker checks that it landed where the placement says.
      std::vector<std::string> hosts;
      std::map<std::string, int> per_host;
      for (const auto& s : sites) {
        if (per_host[s.address]++ == 0) hosts.push_back(s.address);
      }
      std::vector<std::string> words = {"--ntasks=" + std::to_string(sites.size()), "--nodes=" + std::to_string(hosts.size()),
                                        "--distribution=block", "--kill-on-bad-exit=1"};
      const int first = per_host.begin()->second;
      if (std::all_of(per_host.begin(), per_host.end(), [&](const auto& kv) { return kv.second == first; })) {
        words.push_back("--ntasks-per-node=" + std::to_string(first));
      }
      for (const auto& w : {ls.executable, std::string("worker"), std::string("--slurm"), std::string("--placement"),
                            encode_sites(sites)}) {
        words.push_back(w);
      }
      const auto flags = common_flags(ls);
      words.insert(words.end(), flags.begin(), flags.end());
      process_spec p;
      p.argv = {"/bin/sh", "-c", ls.srun_command + " " + shell_line(words)};
      p.env = {token_env};
      for (std::size_t k = 0; k < sites.size(); ++k) p.stages.push_back(static_cast<int>(k));
      p.label = "the srun step (" + std::to_string(sites.size()) + " tasks on " + std::to_string(hosts.size()) +
                (hosts.size() == 1 ? " node)" : " nodes)");
      out.push_back(std::move(p));
      return out;
    }
  }
  return out;
}

}  // namespace conveyor::coordinator
