#include "byte_level.hpp"

#include <array>
#include <unordered_map>

#include "utf8.hpp"

namespace conveyor::tokenizer::byte_level {

namespace {

struct tables {
  std::array<std::string, 256> to_unicode;        // byte -> UTF-8 of its code point
  std::unordered_map<char32_t, unsigned char> to_byte;

  tables() {
    // bytes_to_unicode() of GPT-2's encoder.py: printable Latin-1 bytes keep their code point, the
    // others (controls, space, 0x7F-0xA0, 0xAD) take 256, 257, ... in byte order.
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t cp = keep ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      utf8::append(to_unicode[b], cp);
      to_byte.emplace(cp, static_cast<unsigned char>(b));
    }
  }
};

const tables& the_tables() {
  static const tables t;  // immutable after construction: safe to share between threads
  return t;
}

}  // namespace

void encode(std::string_view bytes, std::string& out) {
  const auto& t = the_tables();
  for (char c : bytes) out += t.to_unicode[static_cast<unsigned char>(c)];
}

void decode(std::string_view piece, std::string& out) {
  const auto& t = the_tables();
  for (std::size_t i = 0; i < piece.size();) {
    const auto lead = static_cast<unsigned char>(piece[i]);
    std::size_t n = utf8::sequence_length(lead);
    if (i + n > piece.size()) n = piece.size() - i;
    char32_t cp = n == 1 ? lead : lead & (0xFF >> (n + 1));
    for (std::size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(piece[i + k]) & 0x3F);
    if (auto it = t.to_byte.find(cp); it != t.to_byte.end()) {
      out.push_back(static_cast<char>(it->second));
    } else {
      out.append(piece.substr(i, n));
    }
    i += n;
  }
}

}  // namespace conveyor::tokenizer::byte_level
