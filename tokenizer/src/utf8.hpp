#pragma once
// Small UTF-8 helpers the tokenizers share.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace conveyor::tokenizer::utf8 {

/// Offset of the first byte that does not start a valid UTF-8 sequence, or npos when all is valid.
std::size_t first_invalid(std::string_view s);
/// `s` with every invalid sequence replaced by U+FFFD (as Rust's from_utf8_lossy / HF's decode).
std::string lossy(std::string_view s);
/// Appends code point `cp` as UTF-8.
void append(std::string& out, char32_t cp);
/// Length of the UTF-8 sequence that starts with byte `lead` (1 for a stray continuation byte).
std::size_t sequence_length(unsigned char lead);
/// True when `s` ends in the middle of a multi-byte sequence that more bytes could complete.
bool ends_incomplete(std::string_view s);

inline constexpr std::string_view replacement = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace conveyor::tokenizer::utf8
