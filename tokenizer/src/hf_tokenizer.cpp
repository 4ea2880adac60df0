// The tokenizer over an hf_spec: added tokens split the text first, then each stretch runs through the
// normalizer, the pre-tokenizer and the BPE model; BOS/EOS come from the merged special_tokens.
#include <algorithm>
#include <unordered_map>

#include "byte_level.hpp"
#include "hf_tokenizer.hpp"
#include "utf8.hpp"

namespace conveyor::tokenizer {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

class hf_tokenizer final : public tokenizer {
 public:
  hf_tokenizer(hf_spec spec, special_tokens specials) : spec_(std::move(spec)), specials_(std::move(specials)) {
    vocab_size_ = spec_.model.size();
    for (std::size_t i = 0; i < spec_.added.size(); ++i) {
      const auto& a = spec_.added[i];
      vocab_size_ = std::max(vocab_size_, a.id + 1);
      by_first_byte_[static_cast<unsigned char>(a.content[0])].push_back(i);
      by_id_[a.id] = i;
    }
    // Longest first, so the first hit at a position is the leftmost-longest match.
    for (auto& bucket : by_first_byte_) {
      std::stable_sort(bucket.begin(), bucket.end(), [&](std::size_t x, std::size_t y) {
        return spec_.added[x].content.size() > spec_.added[y].content.size();
      });
    }
  }

  result<std::vector<std::int32_t>> encode(std::string_view text, const encode_options& o) const override {
    if (auto bad = utf8::first_invalid(text); bad != std::string_view::npos) {
      return make_error(errc::invalid_argument, "the text is not valid UTF-8 (byte " + std::to_string(bad) + ")");
    }
    std::vector<std::int32_t> ids;
    if (o.add_special && specials_.add_bos && specials_.bos_id) ids.push_back(*specials_.bos_id);
    std::size_t stretch = 0;  // start of the text not yet encoded
    bool skip_space = false;  // the previous added token has rstrip
    for (std::size_t i = 0; i < text.size();) {
      const added_token* hit = match_added(text, i, o.parse_special);
      if (hit == nullptr) {
        ++i;
        continue;
      }
      std::size_t end = i;
      if (hit->lstrip) {
        while (end > stretch && is_space(text[end - 1])) --end;
      }
      CONVEYOR_TRY(encode_stretch(text, stretch, end, skip_space, ids));
      ids.push_back(hit->id);
      i += hit->content.size();
      stretch = i;
      skip_space = hit->rstrip;
    }
    CONVEYOR_TRY(encode_stretch(text, stretch, text.size(), skip_space, ids));
    if (o.add_special && specials_.add_eos && !specials_.eos_ids.empty()) ids.push_back(specials_.eos_ids.front());
    return ids;
  }

  std::string decode(std::span<const std::int32_t> ids, const decode_options& o) const override {
    std::string bytes;
    bool at_start = true;  // nothing emitted yet: the decoder's Strip applies
    for (std::int32_t id : ids) {
      if (auto it = by_id_.find(id); it != by_id_.end()) {
        const auto& a = spec_.added[it->second];
        if (a.special && o.skip_special) continue;
        bytes += a.content;
        at_start = false;
        continue;
      }
      const std::string* piece = spec_.model.piece(id);
      if (piece == nullptr) continue;
      const std::size_t before = bytes.size();
      append_piece(id, *piece, bytes);
      if (at_start && bytes.size() > before) {
        for (int k = 0; k < spec_.decoder.strip_start && before < bytes.size() && bytes[before] == ' '; ++k) {
          bytes.erase(before, 1);
        }
        at_start = bytes.size() == before;
      }
    }
    return utf8::lossy(bytes);
  }

  int vocab_size() const override { return vocab_size_; }

  std::optional<std::int32_t> token_id(std::string_view token) const override {
    for (const auto& a : spec_.added) {
      if (a.content == token) return a.id;
    }
    return spec_.model.id(token);
  }

  bool is_special(std::int32_t id) const override {
    auto it = by_id_.find(id);
    return it != by_id_.end() && spec_.added[it->second].special;
  }

  const special_tokens& specials() const override { return specials_; }
  std::string_view kind() const override { return spec_.decoder.byte_level ? "byte_level_bpe" : "metaspace_bpe"; }

 private:
  const added_token* match_added(std::string_view text, std::size_t i, bool parse_special) const {
    for (std::size_t k : by_first_byte_[static_cast<unsigned char>(text[i])]) {
      const auto& a = spec_.added[k];
      if (a.special && !parse_special) continue;
      if (text.compare(i, a.content.size(), a.content) == 0) return &a;
    }
    return nullptr;
  }

  status encode_stretch(std::string_view text, std::size_t begin, std::size_t end, bool skip_space,
                        std::vector<std::int32_t>& ids) const {
    if (skip_space) {
      while (begin < end && is_space(text[begin])) ++begin;
    }
    if (begin >= end) return ok_status();
    std::string s(text.substr(begin, end - begin));
    CONVEYOR_TRY(normalize(spec_.normalizers, s));
    std::vector<std::string> words;
    CONVEYOR_TRY(pre_tokenize(spec_.pre_tokenizers, s, begin == 0, words));
    for (const auto& w : words) spec_.model.encode_word(w, ids);
    return ok_status();
  }

  void append_piece(std::int32_t id, const std::string& piece, std::string& out) const {
    if (spec_.decoder.byte_level) {
      byte_level::decode(piece, out);
      return;
    }
    if (spec_.decoder.byte_fallback) {
      if (int b = spec_.model.byte_of(id); b >= 0) {
        out.push_back(static_cast<char>(b));
        return;
      }
    }
    if (spec_.decoder.metaspace.empty()) {
      out += piece;
      return;
    }
    const std::string& m = spec_.decoder.metaspace;
    for (std::size_t i = 0; i < piece.size();) {
      if (piece.compare(i, m.size(), m) == 0) {
        out.push_back(' ');
        i += m.size();
      } else {
        out.push_back(piece[i++]);
      }
    }
  }

  hf_spec spec_;
  special_tokens specials_;
  int vocab_size_ = 0;
  std::vector<std::size_t> by_first_byte_[256];
  std::unordered_map<std::int32_t, std::size_t> by_id_;
};

}  // namespace

std::unique_ptr<tokenizer> make_hf_tokenizer(hf_spec spec, special_tokens specials) {
  return std::make_unique<hf_tokenizer>(std::move(spec), std::move(specials));
}

}  // namespace conveyor::tokenizer
