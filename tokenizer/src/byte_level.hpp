#pragma once
// GPT-2's byte-level alphabet: every byte maps to one printable code point (space -> 'Ġ', newline ->
// 'Ċ', ...), so a BPE vocabulary over those code points covers any byte string.
#include <string>
#include <string_view>

namespace conveyor::tokenizer::byte_level {

/// Appends the byte-level spelling of `bytes` (one code point per byte) to `out`.
void encode(std::string_view bytes, std::string& out);
/// Appends the bytes a byte-level piece stands for. A code point outside the alphabet (not produced by
/// encode; e.g. a hand-added vocabulary entry) is copied as its UTF-8 text.
void decode(std::string_view piece, std::string& out);

}  // namespace conveyor::tokenizer::byte_level
