#pragma once
// Numeric flag values of the bench programs (conveyor_bench, spec_bench, serving_bench,
// transport_bench, allreduce_bench): the whole value must be a number in [lo, hi], so "2x" or "abc"
// end the run with one line naming the flag, where std::stoi threw std::invalid_argument out of main
// and std::atoi / std::atof read "2x" as 2 and "abc" as 0.
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace conveyor::bench {

/// The value; where it is malformed (leading blanks included: strtol would skip them) or out of range, 0 with `why` saying so (the flag and the value).
inline int parse_int_flag(const std::string& flag, const std::string& s, long lo, long hi, std::string& why) {
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(s.c_str(), &end, 10);
  if (s.empty() || std::isspace(static_cast<unsigned char>(s[0])) || end != s.c_str() + s.size() || errno == ERANGE ||
      v < lo || v > hi) {
    why = flag + ": \"" + s + "\" is not an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    return 0;
  }
  return static_cast<int>(v);
}

/// The same for a real number (finite; "1e3" and "0.5" are numbers, "nan", "inf" and "2x" are not).
inline double parse_real_flag(const std::string& flag, const std::string& s, double lo, double hi, std::string& why) {
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || std::isspace(static_cast<unsigned char>(s[0])) || end != s.c_str() + s.size() || errno == ERANGE ||
      !std::isfinite(v) || v < lo || v > hi) {
    char range[64];
    std::snprintf(range, sizeof range, "[%g, %g]", lo, hi);
    why = flag + ": \"" + s + "\" is not a number in " + range;
    return 0.0;
  }
  return v;
}

/// A comma-separated list of such values (empty items skipped); stops at the first bad one.
inline std::vector<int> parse_int_list_flag(const std::string& flag, const std::string& s, long lo, long hi,
                                            std::string& why) {
  std::vector<int> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    if (item.empty()) continue;
    out.push_back(parse_int_flag(flag, item, lo, hi, why));
    if (!why.empty()) break;
  }
  return out;
}

/// The value, or die(why) (the program's own [[noreturn]] error exit).
template <class Die>
int int_flag(const std::string& flag, const std::string& s, long lo, long hi, Die die) {
  std::string why;
  const int v = parse_int_flag(flag, s, lo, hi, why);
  if (!why.empty()) die(why);
  return v;
}
template <class Die>
double real_flag(const std::string& flag, const std::string& s, double lo, double hi, Die die) {
  std::string why;
  const double v = parse_real_flag(flag, s, lo, hi, why);
  if (!why.empty()) die(why);
  return v;
}
template <class Die>
std::vector<int> int_list_flag(const std::string& flag, const std::string& s, long lo, long hi, Die die) {
  std::string why;
  std::vector<int> v = parse_int_list_flag(flag, s, lo, hi, why);
  if (!why.empty()) die(why);
  return v;
}

}  // namespace conveyor::bench
