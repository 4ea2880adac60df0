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

/// strto*'s parse of `s` (which stopped at `end`) took the whole text: not empty, no leading blank
/// (strtol and strtod would skip it), nothing after the number, not out of the type's range.
inline bool whole_value(const std::string& s, const char* end) {
  return !s.empty() && !std::isspace(static_cast<unsigned char>(s[0])) && end == s.c_str() + s.size() && errno != ERANGE;
}

/// The value; where it is malformed or out of range, 0 with `why` saying so (the flag and the value).
inline int parse_int_flag(const std::string& flag, const std::string& s, long lo, long hi, std::string& why) {
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(s.c_str(), &end, 10);
  if (!whole_value(s, end) || v < lo || v > hi) {
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
  if (!whole_value(s, end) || !std::isfinite(v) || v < lo || v > hi) {
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

/// parse(why)'s value, or die(why) (the program's own [[noreturn]] error exit).
template <class Parse, class Die>
auto or_die(Parse parse, Die die) {
  std::string why;
  auto v = parse(why);
  if (!why.empty()) die(why);
  return v;
}
template <class Die>
int int_flag(const std::string& flag, const std::string& s, long lo, long hi, Die die) {
  return or_die([&](std::string& why) { return parse_int_flag(flag, s, lo, hi, why); }, die);
}
template <class Die>
double real_flag(const std::string& flag, const std::string& s, double lo, double hi, Die die) {
  return or_die([&](std::string& why) { return parse_real_flag(flag, s, lo, hi, why); }, die);
}
template <class Die>
std::vector<int> int_list_flag(const std::string& flag, const std::string& s, long lo, long hi, Die die) {
  return or_die([&](std::string& why) { return parse_int_list_flag(flag, s, lo, hi, why); }, die);
}

/// The value after flag argv[i] (i moves onto it), or die("missing value after FLAG").
template <class Die>
std::string flag_value(int argc, char** argv, int& i, Die die) {
  if (i + 1 >= argc) die(std::string("missing value after ") + argv[i]);
  return argv[++i];
}

}  // namespace conveyor::bench
