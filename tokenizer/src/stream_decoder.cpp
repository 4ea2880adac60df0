#include "conveyor/tokenizer/stream_decoder.hpp"

#include "utf8.hpp"

namespace conveyor::tokenizer {

namespace {

bool ends_with_replacement(const std::string& s) {
  return s.size() >= utf8::replacement.size() &&
         s.compare(s.size() - utf8::replacement.size(), utf8::replacement.size(), utf8::replacement) == 0;
}

}  // namespace

std::string stream_decoder::push(std::span<const std::int32_t> ids) {
  ids_.insert(ids_.end(), ids.begin(), ids.end());
  std::span<const std::int32_t> all(ids_);
  const std::string prefix_text = tok_.decode(all.subspan(prefix_, read_ - prefix_), options_);
  const std::string new_text = tok_.decode(all.subspan(prefix_), options_);
  // A trailing U+FFFD means the last token ends inside a character: wait for the rest of it.
  if (new_text.size() <= prefix_text.size() || ends_with_replacement(new_text)) return {};
  std::string out = new_text.substr(prefix_text.size());
  // Keep a few ids of context so SentencePiece's "no leading space at the start" rule and byte
  // tokens decode as they would in the whole sequence.
  read_ = ids_.size();
  prefix_ = read_ >= 6 ? read_ - 6 : 0;
  return out;
}

std::string stream_decoder::finish() {
  std::span<const std::int32_t> all(ids_);
  const std::string prefix_text = tok_.decode(all.subspan(prefix_, read_ - prefix_), options_);
  const std::string new_text = tok_.decode(all.subspan(prefix_), options_);
  read_ = ids_.size();
  prefix_ = read_;
  if (new_text.size() <= prefix_text.size()) return {};
  return new_text.substr(prefix_text.size());
}

}  // namespace conveyor::tokenizer
