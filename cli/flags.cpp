#include "flags.hpp"

#include <cerrno>
#include <cstdlib>

namespace conveyor::cli {

result<flags> flags::parse(const std::vector<std::string>& argv, const std::set<std::string>& known,
                           const std::set<std::string>& switches) {
  flags f;
  for (std::size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a.rfind("--", 0) != 0) return make_error(errc::invalid_argument, "unexpected argument \"" + a + "\"");
    std::string name = a.substr(2);
    std::optional<std::string> value;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (!known.count(name)) return make_error(errc::invalid_argument, "unknown flag --" + name);
    if (switches.count(name)) {
      if (value) return make_error(errc::invalid_argument, "flag --" + name + " takes no value");
      f.values_[name] = "1";
      continue;
    }
    if (!value) {
      if (i + 1 >= argv.size()) return make_error(errc::invalid_argument, "flag --" + name + " needs a value");
      value = argv[++i];
    }
    f.values_[name] = *value;
  }
  return f;
}

std::optional<std::string> flags::get(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

result<long long> flags::get_int(const std::string& name, long long fallback, long long min, long long max) const {
  auto v = get(name);
  if (!v) return fallback;
  errno = 0;
  char* end = nullptr;
  const long long x = std::strtoll(v->c_str(), &end, 10);
  if (v->empty() || *end != '\0' || errno != 0) {
    return make_error(errc::invalid_argument, "--" + name + " must be an integer, got \"" + *v + "\"");
  }
  if (x < min || x > max) {
    return make_error(errc::invalid_argument, "--" + name + " must be between " + std::to_string(min) + " and " +
                                                  std::to_string(max) + ", got " + *v);
  }
  return x;
}

result<double> flags::get_double(const std::string& name, double fallback, double min, double max) const {
  auto v = get(name);
  if (!v) return fallback;
  errno = 0;
  char* end = nullptr;
  const double x = std::strtod(v->c_str(), &end);
  if (v->empty() || *end != '\0' || errno != 0 || !(x >= min && x <= max)) {
    return make_error(errc::invalid_argument, "--" + name + " must be a number between " + std::to_string(min) +
                                                  " and " + std::to_string(max) + ", got \"" + *v + "\"");
  }
  return x;
}

result<std::vector<int>> flags::get_int_list(const std::string& name) const {
  auto v = get(name);
  std::vector<int> out;
  if (!v) return out;
  std::size_t at = 0;
  while (at <= v->size()) {
    const std::size_t comma = v->find(',', at);
    const std::string item = v->substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    errno = 0;
    char* end = nullptr;
    const long long x = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || errno != 0 || x < INT32_MIN || x > INT32_MAX) {
      return make_error(errc::invalid_argument, "--" + name + ": \"" + item + "\" is not an integer (expected e.g. 1,2,3)");
    }
    out.push_back(static_cast<int>(x));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

}  // namespace conveyor::cli
