#pragma once
// Collecting problems and pointing at them: positions, "where did this key come from", and
// "did you mean" suggestions for misspelt keys.
#include <string>
#include <string_view>
#include <vector>

#include "conveyor/base/result.hpp"
#include "conveyor/config/deployment.hpp"

namespace conveyor::config::detail {

/// Every problem found in one pass, so a user fixes a config in one round instead of one per error.
class diagnostics {
 public:
  void add(std::string line) { lines_.push_back(std::move(line)); }
  bool empty() const { return lines_.empty(); }
  /// All lines joined by '\n'.
  error to_error(errc code) const;

 private:
  std::vector<std::string> lines_;
};

/// "file:line:column", or the flag's name for a value from the command line.
std::string format_position(const source_position& p);

/// Where `key` of `d` came from: its position, or "default" when no file or flag set it.
std::string where(const deployment& d, std::string_view key);

/// True when a file or a flag set `key`.
bool is_set(const deployment& d, std::string_view key);

/// The candidate closest to `word` (ignoring case, '_' and '-', so camelCase spellings match), or ""
/// when none is close enough to be a likely typo.
std::string closest(std::string_view word, const std::vector<std::string>& candidates);

/// Quotes a string the way TOML writes it, for messages.
std::string quoted(std::string_view s);

/// "[2, 2]", as TOML writes an array of integers.
std::string format_ints(const std::vector<int>& v);

/// A number without trailing zeros: 5, 0.85, 7.5.
std::string format_number(double v);

}  // namespace conveyor::config::detail
