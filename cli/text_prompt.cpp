#include "text_prompt.hpp"

namespace conveyor::cli {

result<text_prompt> encode_text_prompt(const std::string& tokenizer_dir, const std::string& flag,
                                       const std::string& text) {
  if (text.empty()) return make_error(errc::invalid_argument, "--prompt is empty");
  auto tok = tokenizer::load_tokenizer(tokenizer_dir);
  if (!tok) {
    return make_error(tok.err().code, "--prompt needs a tokenizer, and " + flag + " " + tokenizer_dir +
                                          " has none that loads: " + tok.err().message);
  }
  auto ids = (*tok)->encode(text);
  if (!ids) return make_error(ids.err().code, "--prompt: " + ids.err().message);
  if (ids->empty()) return make_error(errc::invalid_argument, "--prompt encodes to no tokens");
  return text_prompt{std::move(tok).value(), std::move(ids).value()};
}

}  // namespace conveyor::cli
