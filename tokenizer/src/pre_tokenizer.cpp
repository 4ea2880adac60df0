#include "pre_tokenizer.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <uninorm.h>

#include <cstdlib>
#include <memory>

#include "byte_level.hpp"
#include "utf8.hpp"

namespace conveyor::tokenizer {

namespace {

pcre2_code* code_of(void* p) { return static_cast<pcre2_code*>(p); }

std::string pcre2_message(int rc) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(rc, buf, sizeof buf);
  return reinterpret_cast<const char*>(buf);
}

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  std::string out;
  std::size_t pos = 0;
  for (;;) {
    const std::size_t hit = s.find(from, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos);
    out.append(to);
    pos = hit + from.size();
  }
  if (pos == 0) return;
  out.append(s, pos, std::string::npos);
  s = std::move(out);
}

}  // namespace

const std::string& gpt2_pattern() {
  static const std::string p = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
  return p;
}

result<std::shared_ptr<const regex>> regex::compile(const std::string& pattern) {
  int rc = 0;
  PCRE2_SIZE offset = 0;
  // UCP: \s, \d, \w and POSIX classes follow Unicode properties, as in the Oniguruma/Rust regex HF uses.
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &rc, &offset, nullptr);
  if (code == nullptr) {
    return make_error(errc::invalid_argument, "pre-tokenizer pattern rejected at offset " + std::to_string(offset) +
                                                  ": " + pcre2_message(rc));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // best effort: the interpreter is the fallback
  return std::shared_ptr<const regex>(new regex(code));
}

regex::~regex() { pcre2_code_free(code_of(code_)); }

status regex::split_isolated(std::string_view text, std::vector<std::string>& out) const {
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
      pcre2_match_data_create_from_pattern(code_of(code_), nullptr), &pcre2_match_data_free);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::size_t pos = 0, gap = 0;
  std::uint32_t flags = 0;
  while (pos <= text.size()) {
    const int rc = pcre2_match(code_of(code_), subject, text.size(), pos, flags, md.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      return make_error(errc::invalid_argument, "text rejected by the pre-tokenizer: " + pcre2_message(rc));
    }
    flags = PCRE2_NO_UTF_CHECK;  // checked once on the first call
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    const std::size_t start = ov[0], end = ov[1];
    if (start > gap) out.emplace_back(text.substr(gap, start - gap));
    if (end > start) {
      out.emplace_back(text.substr(start, end - start));
      pos = end;
    } else {
      // An empty match: step over one character so the scan moves on.
      if (start >= text.size()) break;
      pos = start + std::min(utf8::sequence_length(static_cast<unsigned char>(text[start])), text.size() - start);
      continue;
    }
    gap = end;
  }
  if (gap < text.size()) out.emplace_back(text.substr(gap));
  return ok_status();
}

status normalize(const std::vector<normalizer_step>& steps, std::string& text) {
  for (const auto& s : steps) {
    switch (s.what) {
      case normalizer_step::kind::nfc: {
        std::size_t len = 0;
        uint8_t* r = u8_normalize(UNINORM_NFC, reinterpret_cast<const uint8_t*>(text.data()), text.size(), nullptr, &len);
        if (r == nullptr) return make_error(errc::invalid_argument, "text could not be NFC-normalized (invalid UTF-8?)");
        text.assign(reinterpret_cast<const char*>(r), len);
        std::free(r);
        break;
      }
      case normalizer_step::kind::prepend:
        if (!text.empty()) text.insert(0, s.a);  // HF's Prepend leaves empty text alone
        break;
      case normalizer_step::kind::replace:
        replace_all(text, s.a, s.b);
        break;
    }
  }
  return ok_status();
}

status pre_tokenize(const std::vector<pre_tokenizer_step>& steps, std::string_view text, bool at_start,
                    std::vector<std::string>& words) {
  std::vector<std::string> cur{std::string(text)}, next;
  for (const auto& s : steps) {
    next.clear();
    switch (s.what) {
      case pre_tokenizer_step::kind::split:
        for (const auto& w : cur) CONVEYOR_TRY(s.pattern->split_isolated(w, next));
        break;
      case pre_tokenizer_step::kind::byte_level:
        for (std::size_t i = 0; i < cur.size(); ++i) {
          std::string w = cur[i];
          if (s.add_prefix_space && i == 0 && at_start && !w.empty() && w[0] != ' ') w.insert(0, " ");
          std::vector<std::string> parts;
          if (s.pattern) {
            CONVEYOR_TRY(s.pattern->split_isolated(w, parts));
          } else {
            parts.push_back(std::move(w));
          }
          for (const auto& p : parts) {
            std::string mapped;
            byte_level::encode(p, mapped);
            next.push_back(std::move(mapped));
          }
        }
        break;
      case pre_tokenizer_step::kind::metaspace:
        for (std::size_t i = 0; i < cur.size(); ++i) {
          std::string w = cur[i];
          replace_all(w, " ", s.replacement);
          if (s.prepend_first && i == 0 && at_start && w.rfind(s.replacement, 0) != 0) w.insert(0, s.replacement);
          if (!s.metaspace_split) {
            next.push_back(std::move(w));
            continue;
          }
          // Each word starts at a replacement char (HF's MergedWithNext).
          std::size_t begin = 0;
          for (std::size_t p = w.find(s.replacement, 1); p != std::string::npos; p = w.find(s.replacement, p + 1)) {
            next.push_back(w.substr(begin, p - begin));
            begin = p;
          }
          next.push_back(w.substr(begin));
        }
        break;
      case pre_tokenizer_step::kind::digits:
        for (const auto& w : cur) {
          // Runs of ASCII digits become their own words (one word per digit with individual_digits).
          std::size_t i = 0;
          while (i < w.size()) {
            const bool digit = w[i] >= '0' && w[i] <= '9';
            std::size_t j = i + 1;
            if (!(digit && s.individual_digits)) {
              while (j < w.size() && ((w[j] >= '0' && w[j] <= '9') == digit)) ++j;
            }
            next.push_back(w.substr(i, j - i));
            i = j;
          }
        }
        break;
    }
    cur.swap(next);
  }
  for (auto& w : cur) {
    if (!w.empty()) words.push_back(std::move(w));
  }
  return ok_status();
}

}  // namespace conveyor::tokenizer
