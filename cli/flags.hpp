#pragma once
// A small flag parser: `--name value` or `--name=value`; unknown or malformed flags are errors that
// name the flag, never silently ignored.
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "conveyor/base/result.hpp"

namespace conveyor::cli {

class flags {
 public:
  /// `known` lists accepted flag names (without dashes); `switches` those that take no value.
  static result<flags> parse(const std::vector<std::string>& argv, const std::set<std::string>& known,
                             const std::set<std::string>& switches = {});

  bool has(const std::string& name) const { return values_.count(name) != 0; }
  std::optional<std::string> get(const std::string& name) const;
  result<long long> get_int(const std::string& name, long long fallback, long long min, long long max) const;
  result<double> get_double(const std::string& name, double fallback, double min, double max) const;
  /// Comma-separated integers, e.g. "1,2,3".
  result<std::vector<int>> get_int_list(const std::string& name) const;

 private:
  std::map<std::string, std::string> values_;
};

}  // namespace conveyor::cli
