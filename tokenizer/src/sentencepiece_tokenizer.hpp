#pragma once
// tokenizer.model through Debian's libsentencepiece (internal to the tokenizer library).
#include <memory>
#include <string>

#include "conveyor/tokenizer/tokenizer.hpp"
#include "tokenizer_config.hpp"

namespace conveyor::tokenizer {

/// bad_format when libsentencepiece cannot load the file.
result<std::unique_ptr<tokenizer>> load_sentencepiece(const std::string& path, const dir_config& config);

}  // namespace conveyor::tokenizer
