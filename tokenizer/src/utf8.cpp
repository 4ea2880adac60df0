#include "utf8.hpp"

namespace conveyor::tokenizer::utf8 {

namespace {

/// Length of the valid sequence at s[i], or 0 when it is not valid (overlong, surrogate, > U+10FFFF,
/// truncated).
std::size_t valid_at(std::string_view s, std::size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return 1;
  std::size_t n = 0;
  char32_t cp = 0, min = 0;
  if ((b0 & 0xE0) == 0xC0) { n = 2; cp = b0 & 0x1F; min = 0x80; }
  else if ((b0 & 0xF0) == 0xE0) { n = 3; cp = b0 & 0x0F; min = 0x800; }
  else if ((b0 & 0xF8) == 0xF0) { n = 4; cp = b0 & 0x07; min = 0x10000; }
  else return 0;
  if (i + n > s.size()) return 0;
  for (std::size_t k = 1; k < n; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

}  // namespace

std::size_t first_invalid(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = valid_at(s, i);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

std::string lossy(std::string_view s) {
  if (first_invalid(s) == std::string_view::npos) return std::string(s);
  std::string out;
  out.reserve(s.size() + 8);
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = valid_at(s, i);
    if (n > 0) {
      out.append(s.substr(i, n));
      i += n;
      continue;
    }
    // One U+FFFD per maximal invalid prefix (the "substitution of maximal subparts" practice): skip the
    // lead byte and the continuation bytes that could still have belonged to it.
    out.append(replacement);
    const std::size_t want = sequence_length(static_cast<unsigned char>(s[i]));
    ++i;
    for (std::size_t k = 1; k < want && i < s.size() && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80; ++k) ++i;
  }
  return out;
}

void append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::size_t sequence_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return 4;
  return 1;
}

bool ends_incomplete(std::string_view s) {
  // Look back at most 3 bytes for a lead byte whose sequence runs past the end.
  for (std::size_t back = 1; back <= 3 && back <= s.size(); ++back) {
    const auto b = static_cast<unsigned char>(s[s.size() - back]);
    if ((b & 0xC0) == 0x80) continue;  // continuation: keep looking for the lead
    const std::size_t n = sequence_length(b);
    return n > back;
  }
  return false;
}

}  // namespace conveyor::tokenizer::utf8
