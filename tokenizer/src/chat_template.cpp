#include "conveyor/tokenizer/chat_template.hpp"

namespace conveyor::tokenizer {

namespace {

bool contains(std::string_view s, std::string_view x) { return s.find(x) != std::string_view::npos; }

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\n\r");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t\n\r");
  return s.substr(b, e - b + 1);
}

void add_stop(const tokenizer& tok, std::string_view token, std::vector<std::int32_t>& ids) {
  if (auto id = tok.token_id(token)) ids.push_back(*id);
}

}  // namespace

chat_format detect_chat_format(std::string_view t) {
  if (contains(t, "<|start_header_id|>")) return chat_format::llama3;
  if (contains(t, "<|im_start|>")) return chat_format::chatml;
  if (contains(t, "<|user|>") || contains(t, "<|assistant|>")) return chat_format::zephyr;
  if (contains(t, "[INST]")) return chat_format::llama2;
  return chat_format::plain;
}

std::string_view to_string(chat_format f) {
  switch (f) {
    case chat_format::llama3: return "llama3";
    case chat_format::chatml: return "chatml";
    case chat_format::zephyr: return "zephyr";
    case chat_format::llama2: return "llama2";
    case chat_format::plain: return "plain";
  }
  return "plain";
}

result<rendered_chat> render_chat(const tokenizer& tok, const std::vector<chat_message>& messages) {
  if (messages.empty()) return make_error(errc::invalid_argument, "messages must hold at least one message");
  const auto& sp = tok.specials();
  rendered_chat r;
  const chat_format f = detect_chat_format(sp.chat_template);
  switch (f) {
    case chat_format::llama3:
      // Meta's template: BOS, then each turn with its content trimmed, then the assistant header.
      r.prompt = sp.bos_token;
      for (const auto& m : messages) {
        r.prompt += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + trim(m.content) + "<|eot_id|>";
      }
      r.prompt += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      add_stop(tok, "<|eot_id|>", r.stop_ids);
      add_stop(tok, "<|eom_id|>", r.stop_ids);
      break;
    case chat_format::chatml:
      for (const auto& m : messages) r.prompt += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      r.prompt += "<|im_start|>assistant\n";
      add_stop(tok, "<|im_end|>", r.stop_ids);
      break;
    case chat_format::zephyr:
      for (const auto& m : messages) r.prompt += "<|" + m.role + "|>\n" + m.content + sp.eos_token + "\n";
      r.prompt += "<|assistant|>\n";
      break;
    case chat_format::llama2: {
      // [INST] turns; a system message is folded into the first user turn, as Meta's template does.
      std::string system;
      std::size_t i = 0;
      if (messages[0].role == "system") {
        system = "<<SYS>>\n" + trim(messages[0].content) + "\n<</SYS>>\n\n";
        i = 1;
      }
      bool first = true;
      for (; i < messages.size(); ++i) {
        const auto& m = messages[i];
        if (m.role == "user") {
          r.prompt += sp.bos_token + "[INST] " + (first ? system : "") + trim(m.content) + " [/INST]";
          first = false;
        } else if (m.role == "assistant") {
          r.prompt += " " + trim(m.content) + " " + sp.eos_token;
        } else {
          return make_error(errc::invalid_argument, "role \"" + m.role +
                                                        "\" cannot be expressed in the Llama 2 chat format "
                                                        "(system first, then user/assistant)");
        }
      }
      break;
    }
    case chat_format::plain:
      // No template: a readable transcript the model can continue. Documented in the HTTP README.
      if (sp.add_bos) r.prompt = sp.bos_token;
      for (const auto& m : messages) r.prompt += m.role + ": " + m.content + "\n";
      r.prompt += "assistant:";
      break;
  }
  return r;
}

}  // namespace conveyor::tokenizer
