#pragma once
// Integer flag values of the bench programs (conveyor_bench, spec_bench): the whole value must be
// a number in [lo, hi], so "2x" or "abc" end the run with one line naming the flag, where
// std::stoi threw std::invalid_argument out of main or read "2x" as 2.
#include <cerrno>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace conveyor::bench {

/// The value; where it is malformed or out of range, 0 with `why` saying so (the flag and the value).
inline int parse_int_flag(const std::string& flag, const std::string& s, long lo, long hi, std::string& why) {
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(s.c_str(), &end, 10);
  if (s.empty() || end != s.c_str() + s.size() || errno == ERANGE || v < lo || v > hi) {
    why = flag + ": \"" + s + "\" is not an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    return 0;
  }
  return static_cast<int>(v);
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
std::vector<int> int_list_flag(const std::string& flag, const std::string& s, long lo, long hi, Die die) {
  std::string why;
  std::vector<int> v = parse_int_list_flag(flag, s, lo, hi, why);
  if (!why.empty()) die(why);
  return v;
}

}  // namespace conveyor::bench
