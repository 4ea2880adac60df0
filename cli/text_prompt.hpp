#pragma once
// `--prompt TEXT` for the commands that otherwise take token ids (generate, client generate): the
// tokenizer of a model directory turns the text into ids, and the generated ids back into text.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "conveyor/base/result.hpp"
#include "conveyor/tokenizer/tokenizer.hpp"

namespace conveyor::cli {

struct text_prompt {
  std::unique_ptr<tokenizer::tokenizer> tok;
  std::vector<std::int32_t> ids;  ///< with the tokenizer's BOS where its config adds one, as HF does
};

/// Loads the tokenizer of `tokenizer_dir` (a model directory) and encodes `text`. Errors name
/// `flag`, the flag that gave the directory ("--model", "--tokenizer").
result<text_prompt> encode_text_prompt(const std::string& tokenizer_dir, const std::string& flag,
                                       const std::string& text);

}  // namespace conveyor::cli
