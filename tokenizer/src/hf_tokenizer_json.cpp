// tokenizer.json -> hf_spec. Accepts what GPT-2, Llama 2/3, Mistral, Qwen2 and TinyLlama files hold;
// anything else is an `unsupported` error that names the component, never a silent difference.
#include <nlohmann/json.hpp>

#include "hf_tokenizer.hpp"

namespace conveyor::tokenizer {

namespace {

using json = nlohmann::json;

error unsupported(const std::string& what) {
  return make_error(errc::unsupported, "tokenizer.json: " + what + " is not supported");
}
error bad(const std::string& what) { return make_error(errc::bad_format, "tokenizer.json: " + what); }

std::string type_of(const json& j) { return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>() : ""; }

/// A Split/Replace "pattern": {"Regex": "..."} or {"String": "..."}; a String is matched literally.
result<std::string> pattern_regex(const json& p, const std::string& where) {
  if (p.contains("Regex") && p["Regex"].is_string()) return p["Regex"].get<std::string>();
  if (p.contains("String") && p["String"].is_string()) {
    std::string lit = p["String"].get<std::string>();
    return "\\Q" + lit + "\\E";
  }
  return bad(where + ".pattern must be {\"Regex\": ...} or {\"String\": ...}");
}

status parse_normalizer(const json& j, std::vector<normalizer_step>& out) {
  if (j.is_null()) return ok_status();
  const std::string t = type_of(j);
  if (t == "Sequence") {
    for (const auto& n : j.value("normalizers", json::array())) CONVEYOR_TRY(parse_normalizer(n, out));
  } else if (t == "NFC") {
    out.push_back({normalizer_step::kind::nfc, "", ""});
  } else if (t == "Prepend") {
    out.push_back({normalizer_step::kind::prepend, j.value("prepend", std::string()), ""});
  } else if (t == "Replace") {
    const auto& p = j.value("pattern", json::object());
    if (!p.contains("String")) return unsupported("normalizer Replace with a regex pattern");
    out.push_back({normalizer_step::kind::replace, p["String"].get<std::string>(), j.value("content", std::string())});
  } else {
    return unsupported("normalizer.type = " + (t.empty() ? std::string("(missing)") : t));
  }
  return ok_status();
}

status parse_pre_tokenizer(const json& j, std::vector<pre_tokenizer_step>& out) {
  if (j.is_null()) return ok_status();
  const std::string t = type_of(j);
  if (t == "Sequence") {
    for (const auto& p : j.value("pretokenizers", json::array())) CONVEYOR_TRY(parse_pre_tokenizer(p, out));
    return ok_status();
  }
  pre_tokenizer_step s;
  if (t == "Split") {
    if (j.value("behavior", std::string()) != "Isolated" || j.value("invert", false)) {
      return unsupported("pre_tokenizer Split with behavior " + j.value("behavior", std::string("?")) +
                         (j.value("invert", false) ? " (inverted)" : "") + " (only Isolated)");
    }
    CONVEYOR_TRY_ASSIGN(pattern, pattern_regex(j.value("pattern", json::object()), "pre_tokenizer Split"));
    auto re = regex::compile(pattern);
    if (!re) return bad("pre_tokenizer Split: " + re.err().message);
    s.what = pre_tokenizer_step::kind::split;
    s.pattern = *re;
  } else if (t == "ByteLevel") {
    s.what = pre_tokenizer_step::kind::byte_level;
    s.add_prefix_space = j.value("add_prefix_space", false);
    if (j.value("use_regex", true)) {
      auto re = regex::compile(gpt2_pattern());
      if (!re) return re.err();
      s.pattern = *re;
    }
  } else if (t == "Metaspace") {
    s.what = pre_tokenizer_step::kind::metaspace;
    s.replacement = j.value("replacement", std::string("\xE2\x96\x81"));
    const std::string scheme = j.value("prepend_scheme", std::string(j.value("add_prefix_space", true) ? "always" : "never"));
    // "always" prepends to every stretch between added tokens; we treat it as "first", the
    // difference only shows after an added token in the middle of a text.
    s.prepend_first = scheme != "never";
    s.metaspace_split = j.value("split", true);
  } else if (t == "Digits") {
    s.what = pre_tokenizer_step::kind::digits;
    s.individual_digits = j.value("individual_digits", false);
  } else {
    return unsupported("pre_tokenizer.type = " + (t.empty() ? std::string("(missing)") : t));
  }
  out.push_back(std::move(s));
  return ok_status();
}

status parse_decoder(const json& j, hf_decoder& d) {
  if (j.is_null()) return ok_status();
  const std::string t = type_of(j);
  if (t == "Sequence") {
    for (const auto& x : j.value("decoders", json::array())) CONVEYOR_TRY(parse_decoder(x, d));
  } else if (t == "ByteLevel") {
    d.byte_level = true;
  } else if (t == "Replace") {
    const auto& p = j.value("pattern", json::object());
    if (!p.contains("String") || j.value("content", std::string()) != " ") return unsupported("decoder Replace other than X -> \" \"");
    d.metaspace = p["String"].get<std::string>();
  } else if (t == "ByteFallback") {
    d.byte_fallback = true;
  } else if (t == "Fuse") {
    // Joining the pieces is what we do anyway.
  } else if (t == "Strip") {
    if (j.value("content", std::string(" ")) != " " || j.value("stop", 0) != 0) return unsupported("decoder Strip other than leading spaces");
    d.strip_start = j.value("start", 0);
  } else if (t == "Metaspace") {
    d.metaspace = j.value("replacement", std::string("\xE2\x96\x81"));
    const std::string scheme = j.value("prepend_scheme", std::string(j.value("add_prefix_space", true) ? "always" : "never"));
    d.strip_start = scheme == "never" ? 0 : 1;
  } else {
    return unsupported("decoder.type = " + (t.empty() ? std::string("(missing)") : t));
  }
  return ok_status();
}

status parse_post_processor(const json& j, hf_spec& spec) {
  if (j.is_null()) return ok_status();
  const std::string t = type_of(j);
  if (t == "Sequence") {
    for (const auto& p : j.value("processors", json::array())) CONVEYOR_TRY(parse_post_processor(p, spec));
  } else if (t == "TemplateProcessing") {
    spec.has_template = true;
    bool seen_text = false;
    for (const auto& piece : j.value("single", json::array())) {
      if (piece.contains("Sequence")) {
        seen_text = true;
      } else if (piece.contains("SpecialToken")) {
        auto id = piece["SpecialToken"].value("id", std::string());
        (seen_text ? spec.suffix_specials : spec.prefix_specials).push_back(id);
      }
    }
  } else if (t != "ByteLevel" && t != "RobertaProcessing" && t != "BertProcessing") {
    return unsupported("post_processor.type = " + t);
  }
  return ok_status();
}

result<bpe_model> parse_model(const json& m) {
  if (type_of(m) != "BPE" && !(m.contains("merges") && !m.contains("type"))) {
    return unsupported("model.type = " + (type_of(m).empty() ? std::string("(missing)") : type_of(m)) + " (only BPE)");
  }
  if (!m.value("continuing_subword_prefix", json()).is_null() && !m["continuing_subword_prefix"].get<std::string>().empty()) {
    return unsupported("model.continuing_subword_prefix");
  }
  if (!m.value("end_of_word_suffix", json()).is_null() && !m["end_of_word_suffix"].get<std::string>().empty()) {
    return unsupported("model.end_of_word_suffix");
  }
  if (!m.contains("vocab") || !m["vocab"].is_object()) return bad("model.vocab must be an object of piece -> id");
  std::unordered_map<std::string, std::int32_t> vocab;
  vocab.reserve(m["vocab"].size());
  for (const auto& [piece, id] : m["vocab"].items()) {
    if (!id.is_number_integer()) return bad("model.vocab[\"" + piece + "\"] is not an integer");
    vocab.emplace(piece, id.get<std::int32_t>());
  }
  std::vector<std::pair<std::string, std::string>> merges;
  const auto& ms = m.value("merges", json::array());
  merges.reserve(ms.size());
  for (const auto& x : ms) {
    if (x.is_string()) {  // "a b" (tokenizers < 0.20)
      const auto& s = x.get_ref<const std::string&>();
      const auto sp = s.find(' ', 1);
      if (sp == std::string::npos) return bad("merge \"" + s + "\" is not \"A B\"");
      merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (x.is_array() && x.size() == 2 && x[0].is_string() && x[1].is_string()) {  // ["a", "b"]
      merges.emplace_back(x[0].get<std::string>(), x[1].get<std::string>());
    } else {
      return bad("model.merges holds an entry that is neither \"A B\" nor [\"A\", \"B\"]");
    }
  }
  bpe_options o;
  o.ignore_merges = m.value("ignore_merges", false);
  o.byte_fallback = m.value("byte_fallback", false);
  o.fuse_unk = m.value("fuse_unk", false);
  if (m.contains("unk_token") && m["unk_token"].is_string()) {
    auto it = vocab.find(m["unk_token"].get<std::string>());
    if (it != vocab.end()) o.unk_id = it->second;
  }
  return bpe_model::create(std::move(vocab), merges, o);
}

}  // namespace

bool is_byte_level(const json& doc) {
  auto has = [](const json& j, auto&& self) -> bool {
    if (!j.is_object()) return false;
    if (type_of(j) == "ByteLevel") return true;
    for (const char* k : {"pretokenizers", "decoders"}) {
      if (j.contains(k)) {
        for (const auto& x : j[k]) {
          if (self(x, self)) return true;
        }
      }
    }
    return false;
  };
  return has(doc.value("pre_tokenizer", json()), has) || has(doc.value("decoder", json()), has);
}

result<hf_spec> parse_tokenizer_json(const json& doc) {
  if (!doc.is_object()) return bad("the document is not a JSON object");
  hf_spec spec;
  CONVEYOR_TRY(parse_normalizer(doc.value("normalizer", json()), spec.normalizers));
  CONVEYOR_TRY(parse_pre_tokenizer(doc.value("pre_tokenizer", json()), spec.pre_tokenizers));
  CONVEYOR_TRY(parse_decoder(doc.value("decoder", json()), spec.decoder));
  CONVEYOR_TRY(parse_post_processor(doc.value("post_processor", json()), spec));
  CONVEYOR_TRY_ASSIGN(model, parse_model(doc.value("model", json::object())));
  spec.model = std::move(model);
  for (const auto& a : doc.value("added_tokens", json::array())) {
    if (!a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") || !a["content"].is_string()) {
      return bad("added_tokens entries need an integer id and a string content");
    }
    added_token t;
    t.id = a["id"].get<std::int32_t>();
    t.content = a["content"].get<std::string>();
    t.special = a.value("special", false);
    t.lstrip = a.value("lstrip", false);
    t.rstrip = a.value("rstrip", false);
    if (t.id < 0 || t.content.empty()) return bad("added token \"" + t.content + "\" has a negative id or is empty");
    spec.added.push_back(std::move(t));
  }
  return spec;
}

}  // namespace conveyor::tokenizer
