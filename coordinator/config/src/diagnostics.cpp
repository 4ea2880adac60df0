#include "diagnostics.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>

#include "rules.hpp"

namespace conveyor::config::detail {
namespace {

std::string normalized(std::string_view word) {
  std::string out;
  for (char c : word) {
    if (c == '_' || c == '-') continue;
    out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

// Optimal string alignment distance: insertions, deletions, substitutions and swaps of neighbours
// ("modle" -> "model") each cost one.
std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    for (std::size_t j = 1; j <= b.size(); ++j) {
      d[i][j] =
          std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

}  // namespace

std::string format_number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::string format_ints(const std::vector<int>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

error diagnostics::to_error(errc code) const {
  std::string message;
  for (const auto& line : lines_) message += (message.empty() ? "" : "\n") + line;
  return make_error(code, std::move(message));
}

std::string format_position(const source_position& p) {
  if (p.line == 0) return p.source;
  return p.source + ":" + std::to_string(p.line) + ":" + std::to_string(p.column);
}

std::string where(const deployment& d, std::string_view key) {
  auto it = d.origins.find(key);
  return it == d.origins.end() ? std::string("default") : format_position(it->second);
}

bool is_set(const deployment& d, std::string_view key) { return d.origins.find(key) != d.origins.end(); }

std::string closest(std::string_view word, const std::vector<std::string>& candidates) {
  const std::string w = normalized(word);
  std::string best;
  std::size_t best_distance = 0;
  for (const auto& c : candidates) {
    const std::string n = normalized(c);
    const std::size_t d = edit_distance(w, n);
    // A typo is a slip of a letter or two, never half of a short word.
    const std::size_t limit = std::max<std::size_t>(1, std::min<std::size_t>(2, n.size() / 3));
    if (d <= limit && (best.empty() || d < best_distance)) {
      best = c;
      best_distance = d;
    }
  }
  return best;
}

std::string quoted(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

std::string allowed(const int_rule& r) {
  if (r.max == rules::unbounded) return "must be an integer >= " + std::to_string(r.min);
  return "must be an integer from " + std::to_string(r.min) + " to " + std::to_string(r.max);
}

std::string allowed(const real_rule& r) {
  return std::string("must be a number ") + (r.min_exclusive ? "> " : ">= ") + format_number(r.min) +
         " and <= " + format_number(r.max);
}

}  // namespace conveyor::config::detail
