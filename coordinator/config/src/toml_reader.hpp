#pragma once
// Reading one TOML table into plain fields with positions in every message. The only header of the
// project that includes toml++ (tests/layering keeps it here).
#include <toml++/toml.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "conveyor/config/deployment.hpp"
#include "diagnostics.hpp"
#include "rules.hpp"

namespace conveyor::config::detail {

/// State shared by the readers of one document.
struct parse_context {
  std::string source;  ///< file name shown in messages
  diagnostics diags;
  deployment* out = nullptr;  ///< receives origins of the keys read
  /// Keys the readers asked for, as "section.key" with array indices dropped ("placement.hosts.gpus").
  std::vector<std::string> known;
  struct unknown_key {
    std::string path;     ///< "parallel.stagess"
    std::string section;  ///< "parallel" ("" at the top level)
    source_position position;
  };
  std::vector<unknown_key> unknown;
};

/// Checks a string value; returns why it is not allowed, or "" when it is.
using string_check = std::function<std::string(std::string_view)>;

/// Reads the keys of one table. Each `read` returns true when the key was present and valid, and then
/// assigns `out` and records the key's origin; an absent key leaves `out` at its default; a bad one
/// adds a message naming position, key and what is allowed. `finish` reports the keys never asked for.
class table_reader {
 public:
  /// `path` is the table's dotted name ("" for the document, "placement.hosts[1]").
  table_reader(const toml::table& table, std::string path, parse_context& ctx);

  bool read(std::string_view key, int& out, const int_rule& rule);
  bool read(std::string_view key, std::int64_t& out, const int_rule& rule);
  bool read(std::string_view key, double& out, const real_rule& rule);
  bool read(std::string_view key, bool& out);
  /// `check` may be empty; an empty string is rejected unless `allow_empty`.
  bool read(std::string_view key, std::string& out, const string_check& check = {}, bool allow_empty = false);
  bool read(std::string_view key, endpoint& out);
  /// A non-empty array of integers, each within `rule`; `unique` rejects repeats.
  bool read(std::string_view key, std::vector<int>& out, const int_rule& rule, bool unique);

  /// One of the listed spellings.
  template <class E>
  bool read_choice(std::string_view key, E& out,
                   std::initializer_list<std::pair<std::string_view, E>> choices) {
    std::vector<std::string_view> names;
    for (const auto& c : choices) names.push_back(c.first);
    int index = -1;
    if (!read_choice_index(key, names, index)) return false;
    out = std::data(choices)[index].second;
    return true;
  }

  /// A sub-table ([section] or an inline table); nullptr when absent or not a table (reported).
  const toml::table* table(std::string_view key);
  /// An array of tables ([[section]]); nullptr when absent or malformed (reported).
  const toml::array* table_array(std::string_view key);

  /// True when the table holds `key` (whatever its value).
  bool has(std::string_view key) const { return table_.contains(key); }

  /// Reports `key` missing from this table, with `hint` saying what to give.
  void missing(std::string_view key, std::string_view hint);

  /// Records keys of the table that no read asked for. Call once, after every read.
  void finish();

  const std::string& path() const { return path_; }

 private:
  const toml::node* find(std::string_view key);
  bool read_choice_index(std::string_view key, const std::vector<std::string_view>& names, int& index);
  std::string key_path(std::string_view key) const;
  void bad(const toml::node& node, std::string_view key, std::string_view reason);
  void record(const toml::node& node, std::string_view key);

  const toml::table& table_;
  std::string path_;
  parse_context& ctx_;
  std::vector<std::string> asked_;
};

/// Position of a node (1-based line and column) in the document.
source_position position_of(const toml::node& node, const std::string& source);

}  // namespace conveyor::config::detail
