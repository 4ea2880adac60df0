#pragma once
// Turns a stream of generated ids into text pieces as they arrive, never cutting a UTF-8 character
// (a byte-level token may hold half of one) and never changing text already emitted (SentencePiece
// drops a leading space only at the start of a decode). vLLM's prefix/read offsets keep each step's
// decode short instead of re-decoding the whole sequence.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "conveyor/tokenizer/tokenizer.hpp"

namespace conveyor::tokenizer {

class stream_decoder {
 public:
  /// `tok` must outlive the decoder.
  explicit stream_decoder(const tokenizer& tok, decode_options options = {}) : tok_(tok), options_(options) {}
  /// Adds ids; returns the text they complete (possibly empty while a character is incomplete).
  std::string push(std::span<const std::int32_t> ids);
  /// Returns whatever is still held back (an incomplete character at the end, as U+FFFD).
  std::string finish();
  /// Every id pushed so far.
  const std::vector<std::int32_t>& ids() const { return ids_; }

 private:
  const tokenizer& tok_;
  decode_options options_;
  std::vector<std::int32_t> ids_;
  std::size_t prefix_ = 0;  ///< decode window start: a few ids of context before read_
  std::size_t read_ = 0;    ///< ids before this one are emitted
};

}  // namespace conveyor::tokenizer
