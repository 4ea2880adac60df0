// The GEMM tuning cache file (tuning_cache.hpp). One entry a line:
//   <device key> plain <rows> <cols> <bucket> 0 <use_lt> <ms> <ms_default> <8 algo words, hex>
//   <device key> split <rows> <cols> <bucket> <margin key> <splits> <8 algo words, hex>
#include "tuning_cache.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <optional>
#include <sstream>

namespace conveyor::kernels::cuda {
namespace {

constexpr const char* header = "# conveyor GEMM tuning cache: timed cuBLASLt choices per device and shape (safe to delete)";

std::string sys_error(const std::string& what, const std::string& path) {
  return what + " " + path + ": " + std::strerror(errno);
}

/// The file's text; nullopt (errno set) where it cannot be opened.
std::optional<std::string> file_text(const std::string& path) {
  std::ifstream f(path);
  if (!f) return std::nullopt;
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::pair<int, std::array<int, 4>> identity(const tuned_gemm& e) {
  return {static_cast<int>(e.kind), e.shape};
}

}  // namespace

std::string format_tuned_gemm(const tuned_gemm& e, const std::string& device_key) {
  std::ostringstream s;
  const bool plain = e.kind == tuned_gemm::kind_t::plain;
  s << device_key << (plain ? " plain " : " split ") << e.shape[0] << ' ' << e.shape[1] << ' ' << e.shape[2] << ' '
    << e.shape[3] << ' ';
  if (plain) {
    char t[64];
    std::snprintf(t, sizeof t, "%d %.6g %.6g", e.use_lt ? 1 : 0, e.ms, e.ms_default);
    s << t;
  } else {
    s << e.splits;
  }
  for (std::uint64_t w : e.algo) {
    char h[20];
    std::snprintf(h, sizeof h, " %" PRIx64, w);
    s << h;
  }
  return s.str();
}

tuning_cache_contents parse_tuning_cache(const std::string& text, const std::string& device_key,
                                         const std::string& source) {
  tuning_cache_contents out;
  std::istringstream in(text);
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream f(line);
    std::string device, kind;
    f >> device >> kind;
    if (device != device_key) {
      if (kind == "plain" || kind == "split") continue;  // another GPU's or cuBLASLt version's entry
    }
    auto bad = [&](const std::string& why) {
      out.warnings.push_back(source + " line " + std::to_string(number) + ": " + why + " (skipped)");
    };
    tuned_gemm e;
    if (kind == "plain") {
      e.kind = tuned_gemm::kind_t::plain;
    } else if (kind == "split") {
      e.kind = tuned_gemm::kind_t::split;
    } else {
      bad("expected \"<device> plain|split ...\", got \"" + line.substr(0, 60) + "\"");
      continue;
    }
    for (int& v : e.shape) f >> v;
    if (e.kind == tuned_gemm::kind_t::plain) {
      int use = 0;
      f >> use >> e.ms >> e.ms_default;
      e.use_lt = use != 0;
      if (use != 0 && use != 1) f.setstate(std::ios::failbit);
    } else {
      f >> e.splits;
      if (e.splits < 0) f.setstate(std::ios::failbit);
    }
    for (auto& w : e.algo) f >> std::hex >> w;
    f >> std::dec;
    std::string rest;
    if (f.fail() || (f >> rest, !rest.empty()) || e.shape[0] <= 0 || e.shape[1] <= 0 || e.shape[2] <= 0) {
      bad("a " + kind + " entry needs rows, cols, bucket (> 0), a key, " +
          (kind == "plain" ? std::string("use_lt (0/1), two times") : std::string("splits (>= 0)")) +
          " and 8 hex words");
      continue;
    }
    out.entries.push_back(e);
  }
  return out;
}

result<tuning_cache_contents> read_tuning_cache(const std::string& path, const std::string& device_key) {
  const auto text = file_text(path);
  if (!text) {
    if (errno == ENOENT) return tuning_cache_contents{};
    return make_error(errc::io, sys_error("cannot read the GEMM tuning cache", path));
  }
  return parse_tuning_cache(*text, device_key, path);
}

status merge_tuning_cache(const std::string& path, const std::string& device_key, const std::vector<tuned_gemm>& entries) {
  std::error_code ec;
  const std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path(), ec);
  if (ec) return make_error(errc::io, "cannot create " + p.parent_path().string() + ": " + ec.message());
  const std::string lock_path = path + ".lock";
  const int lock = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock < 0) return make_error(errc::io, sys_error("cannot open", lock_path));
  if (::flock(lock, LOCK_EX) != 0) {
    ::close(lock);
    return make_error(errc::io, sys_error("cannot lock", lock_path));
  }
  // Under the lock: what is there now (every device's lines), then ours where the shape is new.
  const std::string text = file_text(path).value_or("");
  std::set<std::pair<int, std::array<int, 4>>> have;
  for (const auto& e : parse_tuning_cache(text, device_key, path).entries) have.insert(identity(e));
  std::ostringstream out;
  if (text.rfind("#", 0) != 0) out << header << '\n';
  out << text;
  if (!text.empty() && text.back() != '\n') out << '\n';
  for (const auto& e : entries) {
    if (have.insert(identity(e)).second) out << format_tuned_gemm(e, device_key) << '\n';
  }
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  status st;
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << out.str();
    f.flush();
    if (!f) st = make_error(errc::io, sys_error("cannot write", tmp));
  }
  if (st.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) st = make_error(errc::io, sys_error("cannot replace", path));
  if (!st.ok()) std::remove(tmp.c_str());
  ::flock(lock, LOCK_UN);
  ::close(lock);
  return st;
}

}  // namespace conveyor::kernels::cuda
