#include "toml_reader.hpp"

#include <algorithm>
#include <set>
#include <sstream>

namespace conveyor::config::detail {
namespace {

std::string_view type_name(toml::node_type t) {
  switch (t) {
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a float";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::date:
      return "a date";
    case toml::node_type::time:
      return "a time";
    case toml::node_type::date_time:
      return "a date-time";
    case toml::node_type::none:
      break;
  }
  return "nothing";
}

// The value as the user wrote it (near enough), cut short so one line stays one line.
std::string render(const toml::node& node) {
  std::string text;
  if (const auto* s = node.as_string()) {
    text = quoted(s->get());
  } else if (node.is_table()) {
    text = "{...}";
  } else {
    std::ostringstream os;
    node.visit([&](const auto& v) { os << v; });
    text = os.str();
    std::replace(text.begin(), text.end(), '\n', ' ');
  }
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text;
}

// "placement.hosts[1].gpus" -> "placement.hosts.gpus": the shape of a key, for suggestions.
std::string generic(std::string_view path) {
  std::string out;
  bool in_index = false;
  for (char c : path) {
    if (c == '[') in_index = true;
    if (!in_index) out += c;
    if (c == ']') in_index = false;
  }
  return out;
}

}  // namespace

source_position position_of(const toml::node& node, const std::string& source) {
  const auto& begin = node.source().begin;
  return {source, static_cast<int>(begin.line), static_cast<int>(begin.column)};
}

table_reader::table_reader(const toml::table& table, std::string path, parse_context& ctx)
    : table_(table), path_(std::move(path)), ctx_(ctx) {}

std::string table_reader::key_path(std::string_view key) const {
  return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
}

const toml::node* table_reader::find(std::string_view key) {
  asked_.emplace_back(key);
  ctx_.known.push_back(generic(key_path(key)));
  return table_.get(key);
}

void table_reader::bad(const toml::node& node, std::string_view key, std::string_view reason) {
  ctx_.diags.add(format_position(position_of(node, ctx_.source)) + ": " + key_path(key) + " = " +
                 render(node) + ": " + std::string(reason));
}

void table_reader::record(const toml::node& node, std::string_view key) {
  if (ctx_.out != nullptr) ctx_.out->origins[key_path(key)] = position_of(node, ctx_.source);
}

void table_reader::missing(std::string_view key, std::string_view hint) {
  ctx_.diags.add(format_position(position_of(table_, ctx_.source)) + ": " + key_path(key) +
                 " is missing: " + std::string(hint));
}

bool table_reader::read(std::string_view key, std::int64_t& out, const int_rule& rule) {
  const toml::node* node = find(key);
  if (node == nullptr) return false;
  const auto* v = node->as_integer();
  if (v == nullptr) {
    bad(*node, key, allowed(rule) + ", not " + std::string(type_name(node->type())));
    return false;
  }
  if (!accepts(rule, v->get())) {
    bad(*node, key, allowed(rule));
    return false;
  }
  out = v->get();
  record(*node, key);
  return true;
}

bool table_reader::read(std::string_view key, int& out, const int_rule& rule) {
  std::int64_t wide = out;
  if (!read(key, wide, rule)) return false;  // every rule's bounds fit an int
  out = static_cast<int>(wide);
  return true;
}

bool table_reader::read(std::string_view key, double& out, const real_rule& rule) {
  const toml::node* node = find(key);
  if (node == nullptr) return false;
  double value = 0;
  if (const auto* f = node->as_floating_point()) {
    value = f->get();
  } else if (const auto* i = node->as_integer()) {
    value = static_cast<double>(i->get());
  } else {
    bad(*node, key, allowed(rule) + ", not " + std::string(type_name(node->type())));
    return false;
  }
  if (!accepts(rule, value)) {  // also rejects nan; inf fails the upper bound
    bad(*node, key, allowed(rule));
    return false;
  }
  out = value;
  record(*node, key);
  return true;
}

bool table_reader::read(std::string_view key, bool& out) {
  const toml::node* node = find(key);
  if (node == nullptr) return false;
  const auto* b = node->as_boolean();
  if (b == nullptr) {
    bad(*node, key, "must be true or false, not " + std::string(type_name(node->type())));
    return false;
  }
  out = b->get();
  record(*node, key);
  return true;
}

bool table_reader::read(std::string_view key, std::string& out, const string_check& check, bool allow_empty) {
  const toml::node* node = find(key);
  if (node == nullptr) return false;
  const auto* s = node->as_string();
  if (s == nullptr) {
    bad(*node, key, "must be a string, not " + std::string(type_name(node->type())));
    return false;
  }
  if (s->get().empty() && !allow_empty) {
    bad(*node, key, "must not be empty (leave the key out to keep the default)");
    return false;
  }
  if (check) {
    if (std::string why = check(s->get()); !why.empty()) {
      bad(*node, key, why);
      return false;
    }
  }
  out = s->get();
  record(*node, key);
  return true;
}

bool table_reader::read(std::string_view key, endpoint& out) {
  const toml::node* node = find(key);
  if (node == nullptr) return false;
  const auto* s = node->as_string();
  if (s == nullptr) {
    bad(*node, key, "must be a string \"HOST:PORT\", not " + std::string(type_name(node->type())));
    return false;
  }
  auto parsed = parse_endpoint(s->get());
  if (!parsed.ok()) {
    bad(*node, key, parsed.err().message);
    return false;
  }
  out = std::move(parsed).value();
  record(*node, key);
  return true;
}

bool table_reader::read(std::string_view key, std::vector<int>& out, const int_rule& rule, bool unique) {
  const toml::node* node = find(key);
  if (node == nullptr) return false;
  const auto* array = node->as_array();
  if (array == nullptr) {
    bad(*node, key, "must be an array of integers, not " + std::string(type_name(node->type())));
    return false;
  }
  if (array->empty()) {
    bad(*node, key, "must not be empty (leave the key out to keep the default)");
    return false;
  }
  std::vector<int> values;
  bool ok = true;
  for (std::size_t i = 0; i < array->size(); ++i) {
    const toml::node& item = *array->get(i);
    const std::string item_key = std::string(key) + "[" + std::to_string(i) + "]";
    const auto* v = item.as_integer();
    if (v == nullptr || !accepts(rule, v->get())) {
      bad(item, item_key,
          "each entry " + allowed(rule) +
              (v == nullptr ? ", not " + std::string(type_name(item.type())) : std::string()));
      ok = false;
      continue;
    }
    const int value = static_cast<int>(v->get());
    if (unique && std::find(values.begin(), values.end(), value) != values.end()) {
      bad(item, item_key, "listed twice; each entry may appear once");
      ok = false;
      continue;
    }
    values.push_back(value);
  }
  if (!ok) return false;
  out = std::move(values);
  record(*node, key);
  return true;
}

bool table_reader::read_choice_index(std::string_view key, const std::vector<std::string_view>& names,
                                     int& index) {
  const toml::node* node = find(key);
  if (node == nullptr) return false;
  std::string list;
  for (std::size_t i = 0; i < names.size(); ++i) {
    list += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + quoted(names[i]);
  }
  const auto* s = node->as_string();
  if (s == nullptr) {
    bad(*node, key, "must be " + list + ", not " + std::string(type_name(node->type())));
    return false;
  }
  auto it = std::find(names.begin(), names.end(), s->get());
  if (it == names.end()) {
    bad(*node, key, "must be " + list);
    return false;
  }
  index = static_cast<int>(it - names.begin());
  record(*node, key);
  return true;
}

const toml::table* table_reader::table(std::string_view key) {
  const toml::node* node = find(key);
  if (node == nullptr) return nullptr;
  if (const auto* t = node->as_table()) return t;
  bad(*node, key, "must be a table ([" + key_path(key) + "]), not " + std::string(type_name(node->type())));
  return nullptr;
}

const toml::array* table_reader::table_array(std::string_view key) {
  const toml::node* node = find(key);
  if (node == nullptr) return nullptr;
  const auto* array = node->as_array();
  if (array == nullptr || !array->is_array_of_tables() || array->empty()) {
    bad(*node, key,
        "must be one or more [[" + key_path(key) + "]] tables, not " +
            (array == nullptr ? std::string(type_name(node->type()))
             : array->empty() ? std::string("an empty array")
                              : "an array of other values"));
    return nullptr;
  }
  record(*node, key);
  return array;
}

void table_reader::finish() {
  const std::string section = generic(path_);
  for (const auto& [key, node] : table_) {
    if (std::find(asked_.begin(), asked_.end(), key.str()) != asked_.end()) continue;
    source_position pos{ctx_.source, static_cast<int>(key.source().begin.line),
                        static_cast<int>(key.source().begin.column)};
    if (pos.line == 0) pos = position_of(node, ctx_.source);
    ctx_.unknown.push_back({key_path(key.str()), section, pos});
  }
}

}  // namespace conveyor::config::detail
