#include "conveyor/engine/model_config.hpp"

#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace conveyor::engine {

namespace {

using json = nlohmann::json;

/// Reads config keys with messages that name the file and key; the first problem wins.
class reader {
 public:
  reader(const json& j, std::string_view source) : j_(j), source_(source) {}

  bool failed() const { return !error_.empty(); }
  error err() const { return make_error(errc::bad_format, error_); }

  int get_int(const char* key, int fallback, bool required, int min_value = 0) {
    const json* v = find(key);
    if (v == nullptr || v->is_null()) {
      if (required) fail(std::string("missing required key \"") + key + "\"");
      return fallback;
    }
    const double d = v->is_number() ? v->get<double>() : 0.0;
    if (!v->is_number_integer() && !(v->is_number_float() && d == std::trunc(d))) {
      fail(std::string("key \"") + key + "\" must be an integer, got " + v->dump());
      return fallback;
    }
    // The range is checked on the double: converting one outside the integer's range is undefined
    // behaviour (found by fuzz/model_config), and 2^64 - 1 must not wrap into range.
    if (d < min_value || d > (1ll << 30)) {
      fail(std::string("key \"") + key + "\" = " + v->dump() + " is out of range (>= " + std::to_string(min_value) +
           ")");
      return fallback;
    }
    return static_cast<int>(v->get<long long>());
  }

  double get_double(const json& obj, const char* key, double fallback, const std::string& where) {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return fallback;
    if (!it->is_number()) {
      fail("key \"" + where + key + "\" must be a number, got " + it->dump());
      return fallback;
    }
    return it->get<double>();
  }

  bool get_bool(const char* key, bool fallback) {
    const json* v = find(key);
    if (v == nullptr || v->is_null()) return fallback;
    if (!v->is_boolean()) {
      fail(std::string("key \"") + key + "\" must be true or false, got " + v->dump());
      return fallback;
    }
    return v->get<bool>();
  }

  const json* find(const char* key) const {
    auto it = j_.find(key);
    return it == j_.end() ? nullptr : &*it;
  }

  void fail(const std::string& what) {
    if (error_.empty()) error_ = std::string(source_) + ": " + what;
  }

 private:
  const json& j_;
  std::string_view source_;
  std::string error_;
};

void read_rope(reader& r, const json& j, model_config& c) {
  rope_config& rope = c.rope;
  // transformers 5 writes rope_parameters; older checkpoints rope_theta + rope_scaling.
  const json* params = r.find("rope_parameters");
  const json* scaling = r.find("rope_scaling");
  if (params != nullptr && !params->is_null() && !params->is_object()) {
    r.fail("key \"rope_parameters\" must be an object");
    return;
  }
  if (scaling != nullptr && !scaling->is_null() && !scaling->is_object()) {
    r.fail("key \"rope_scaling\" must be an object or null");
    return;
  }
  rope.theta = r.get_double(j, "rope_theta", rope.theta, "");
  const json* src = nullptr;
  std::string where;
  if (params != nullptr && params->is_object()) {
    src = params;
    where = "rope_parameters.";
  } else if (scaling != nullptr && scaling->is_object()) {
    src = scaling;
    where = "rope_scaling.";
  }
  if (src == nullptr) return;
  rope.theta = r.get_double(*src, "rope_theta", rope.theta, where);
  std::string type = "default";
  for (const char* key : {"rope_type", "type"}) {
    auto it = src->find(key);
    if (it != src->end() && it->is_string()) {
      type = it->get<std::string>();
      break;
    }
  }
  if (type != "default" && type != "linear" && type != "llama3" && type != "yarn") {
    r.fail("key \"" + where + "rope_type\" = \"" + type +
           "\" is not supported (supported: default, linear, llama3, yarn)");
    return;
  }
  rope.type = type;
  rope.factor = r.get_double(*src, "factor", 1.0, where);
  rope.low_freq_factor = r.get_double(*src, "low_freq_factor", 1.0, where);
  rope.high_freq_factor = r.get_double(*src, "high_freq_factor", 4.0, where);
  // Range-checked as a double first: converting one outside int's range is undefined behaviour
  // (UBSan in fuzz/model_config; the input is kept in fuzz/regressions/).
  const double original_max = r.get_double(*src, "original_max_position_embeddings", 0, where);
  if (std::fabs(original_max) > (1 << 30)) {
    r.fail("key \"" + where + "original_max_position_embeddings\" is out of range");
  } else {
    rope.original_max_position_embeddings = static_cast<int>(original_max);
  }
  rope.attention_factor = r.get_double(*src, "attention_factor", 0.0, where);
  rope.beta_fast = r.get_double(*src, "beta_fast", 32.0, where);
  rope.beta_slow = r.get_double(*src, "beta_slow", 1.0, where);
  rope.mscale = r.get_double(*src, "mscale", 0.0, where);
  rope.mscale_all_dim = r.get_double(*src, "mscale_all_dim", 0.0, where);
  if (auto it = src->find("truncate"); it != src->end() && it->is_boolean()) rope.truncate = it->get<bool>();
  if (type != "default" && rope.factor <= 0.0) r.fail("key \"" + where + "factor\" must be > 0");
  if (type == "llama3") {
    if (rope.original_max_position_embeddings <= 0)
      r.fail("key \"" + where + "original_max_position_embeddings\" is required for llama3 rope scaling");
    if (rope.high_freq_factor <= rope.low_freq_factor)
      r.fail("keys \"" + where + "high_freq_factor\" must be greater than \"low_freq_factor\"");
  }
  if (rope.theta <= 1.0) r.fail("rope_theta must be > 1, got " + std::to_string(rope.theta));
}

void read_token_ids(reader& r, model_config& c) {
  if (const json* bos = r.find("bos_token_id"); bos != nullptr && bos->is_number_integer()) {
    c.bos_token_id = bos->get<int>();
  }
  if (const json* eos = r.find("eos_token_id"); eos != nullptr) {
    if (eos->is_number_integer()) {
      c.eos_token_ids.push_back(eos->get<int>());
    } else if (eos->is_array()) {
      for (const auto& e : *eos) {
        if (e.is_number_integer()) c.eos_token_ids.push_back(e.get<int>());
      }
    }
  }
}

void read_sliding_window(reader& r, const json& j, model_config& c) {
  c.sliding_window.assign(c.num_layers, 0);
  int window = 0;
  if (const json* w = r.find("sliding_window"); w != nullptr && w->is_number_integer()) {
    window = w->get<int>();
  }
  if (window <= 0) return;
  if (c.model_type == "mistral") {
    c.sliding_window.assign(c.num_layers, window);
    return;
  }
  // qwen2: only with use_sliding_window, per layer_types (or layers >= max_window_layers).
  if (!r.get_bool("use_sliding_window", false)) return;
  const json* types = r.find("layer_types");
  if (types != nullptr && types->is_array() && static_cast<int>(types->size()) == c.num_layers) {
    for (int i = 0; i < c.num_layers; ++i) {
      if ((*types)[i] == "sliding_attention") c.sliding_window[i] = window;
    }
    return;
  }
  const int first = r.get_int("max_window_layers", c.num_layers, false);
  for (int i = first; i < c.num_layers; ++i) c.sliding_window[i] = window;
  (void)j;
}

}  // namespace

result<model_config> parse_model_config(std::string_view text, std::string_view source) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return make_error(errc::bad_format, std::string(source) + ": malformed JSON");
  if (!j.is_object()) return make_error(errc::bad_format, std::string(source) + ": expected a JSON object");
  model_config c;
  reader r(j, source);
  const json* type = r.find("model_type");
  if (type == nullptr || !type->is_string()) {
    return make_error(errc::bad_format, std::string(source) + ": missing \"model_type\"");
  }
  c.model_type = type->get<std::string>();
  if (c.model_type != "llama" && c.model_type != "mistral" && c.model_type != "qwen2") {
    return make_error(errc::unsupported, std::string(source) + ": model_type \"" + c.model_type +
                                             "\" is not supported (supported: llama, mistral, qwen2)");
  }
  if (const json* act = r.find("hidden_act"); act != nullptr && act->is_string() && *act != "silu") {
    return make_error(errc::unsupported, std::string(source) + ": hidden_act \"" +
                                             act->get<std::string>() + "\" is not supported (only silu)");
  }
  c.vocab_size = r.get_int("vocab_size", 0, true, 1);
  c.hidden_size = r.get_int("hidden_size", 0, true, 1);
  c.intermediate_size = r.get_int("intermediate_size", 0, true, 1);
  c.num_layers = r.get_int("num_hidden_layers", 0, true, 1);
  c.num_heads = r.get_int("num_attention_heads", 0, true, 1);
  c.num_kv_heads = r.get_int("num_key_value_heads", c.num_heads, false, 1);
  if (r.failed()) return r.err();
  const json* hd = r.find("head_dim");
  c.head_dim = (hd != nullptr && !hd->is_null()) ? r.get_int("head_dim", 0, true, 2)
                                                 : (c.num_heads > 0 ? c.hidden_size / c.num_heads : 0);
  c.max_position_embeddings = r.get_int("max_position_embeddings", 4096, false, 1);
  if (const json* eps = r.find("rms_norm_eps"); eps != nullptr && !eps->is_null()) {
    if (!eps->is_number() || eps->get<double>() <= 0) {
      r.fail("key \"rms_norm_eps\" must be a positive number");
    } else {
      c.rms_norm_eps = eps->get<float>();
    }
  }
  c.tie_word_embeddings = r.get_bool("tie_word_embeddings", false);
  if (c.model_type == "qwen2") {
    c.qkv_bias = true;  // Qwen2 always has q/k/v biases and none on o_proj
  } else {
    c.qkv_bias = c.o_bias = r.get_bool("attention_bias", false);
  }
  c.mlp_bias = r.get_bool("mlp_bias", false);
  read_rope(r, j, c);
  read_token_ids(r, c);
  read_sliding_window(r, j, c);
  if (r.failed()) return r.err();

  if (c.num_heads % c.num_kv_heads != 0) {
    return make_error(errc::bad_format, std::string(source) + ": num_attention_heads (" +
                                            std::to_string(c.num_heads) + ") must be a multiple of num_key_value_heads (" +
                                            std::to_string(c.num_kv_heads) + ")");
  }
  if (c.head_dim <= 0 || c.head_dim % 2 != 0 || c.head_dim > 1024) {
    return make_error(errc::bad_format, std::string(source) + ": head_dim " + std::to_string(c.head_dim) +
                                            " must be even and at most 1024");
  }
  return c;
}

result<model_config> load_model_config(const std::string& model_dir) {
  const std::string path = model_dir + "/config.json";
  std::ifstream in(path);
  if (!in) return make_error(errc::not_found, path + ": cannot open (is this a Hugging Face model directory?)");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_model_config(ss.str(), path);
}

}  // namespace conveyor::engine
