#pragma once
// Chat messages -> one prompt string, in the model's own format. Not a Jinja interpreter: we recognise
// the template families that LLaMA-family checkpoints ship (by the markers in tokenizer_config.json's
// chat_template) and render them in C++. A model without a template, or with one we don't recognise,
// gets the documented plain fallback ("role: content" lines, then "assistant:").
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "conveyor/base/result.hpp"
#include "conveyor/tokenizer/tokenizer.hpp"

namespace conveyor::tokenizer {

struct chat_message {
  std::string role;  ///< "system" | "user" | "assistant" (others pass through where the format allows)
  std::string content;
};

enum class chat_format {
  llama3,  ///< <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>
  chatml,  ///< <|im_start|>role\n...<|im_end|>\n (Qwen2, many fine-tunes)
  zephyr,  ///< <|user|>\n...</s>\n (TinyLlama-Chat)
  llama2,  ///< <s>[INST] <<SYS>>...<</SYS>> ... [/INST]
  plain,   ///< fallback: "role: content\n" lines then "assistant:"
};

/// Which family a Jinja chat template belongs to (plain when empty or unrecognised).
chat_format detect_chat_format(std::string_view jinja_source);
std::string_view to_string(chat_format f);

struct rendered_chat {
  std::string prompt;  ///< encode with add_special = false: the format writes BOS itself where it needs it
  std::vector<std::int32_t> stop_ids;  ///< end-of-turn ids of the format (besides the model's EOS)
};

/// Renders `messages` (ending with the generation prompt for the assistant's turn). invalid_argument
/// for an empty list or a role the format cannot express.
result<rendered_chat> render_chat(const tokenizer& tok, const std::vector<chat_message>& messages);

}  // namespace conveyor::tokenizer
