#include "sentencepiece_tokenizer.hpp"

#include <algorithm>
#include <unordered_map>

#include <sentencepiece_processor.h>

#include "utf8.hpp"

namespace conveyor::tokenizer {

namespace {

class sentencepiece_tokenizer final : public tokenizer {
 public:
  explicit sentencepiece_tokenizer(std::unique_ptr<sentencepiece::SentencePieceProcessor> sp) : sp_(std::move(sp)) {}

  /// Control pieces ("<s>", "</s>") and the config's added tokens: libsentencepiece never produces
  /// them from text, HF's LlamaTokenizer splits them out first, and so do we (chat templates need it).
  void set_specials(special_tokens s, const std::vector<added_token>& added) {
    specials_ = std::move(s);
    for (int id = 0; id < sp_->GetPieceSize(); ++id) {
      if (sp_->IsControl(id)) splitters_.push_back({id, sp_->IdToPiece(id), true, false, false});
    }
    for (const auto& a : added) {
      if (std::none_of(splitters_.begin(), splitters_.end(), [&](const added_token& x) { return x.id == a.id; })) {
        splitters_.push_back(a);
      }
    }
    std::stable_sort(splitters_.begin(), splitters_.end(),
                     [](const added_token& x, const added_token& y) { return x.content.size() > y.content.size(); });
    for (const auto& a : splitters_) {
      extra_size_ = std::max(extra_size_, a.id + 1);
      if (a.special) added_special_.emplace(a.id, a.content);
    }
  }

  result<std::vector<std::int32_t>> encode(std::string_view text, const encode_options& o) const override {
    if (auto bad = utf8::first_invalid(text); bad != std::string_view::npos) {
      return make_error(errc::invalid_argument, "the text is not valid UTF-8 (byte " + std::to_string(bad) + ")");
    }
    std::vector<std::int32_t> ids;
    if (o.add_special && specials_.add_bos && specials_.bos_id) ids.push_back(*specials_.bos_id);
    std::size_t stretch = 0;
    for (std::size_t i = 0; i < text.size();) {
      const added_token* hit = nullptr;
      if (o.parse_special) {
        for (const auto& a : splitters_) {
          if (text.compare(i, a.content.size(), a.content) == 0) {
            hit = &a;
            break;
          }
        }
      }
      if (hit == nullptr) {
        ++i;
        continue;
      }
      CONVEYOR_TRY(encode_stretch(text.substr(stretch, i - stretch), ids));
      ids.push_back(hit->id);
      i += hit->content.size();
      stretch = i;
    }
    CONVEYOR_TRY(encode_stretch(text.substr(stretch), ids));
    if (o.add_special && specials_.add_eos && !specials_.eos_ids.empty()) ids.push_back(specials_.eos_ids.front());
    return ids;
  }

  std::string decode(std::span<const std::int32_t> ids, const decode_options& o) const override {
    std::string out;
    std::vector<int> run;
    auto flush = [&] {
      if (run.empty()) return;
      out += sp_->DecodeIds(run);
      run.clear();
    };
    for (std::int32_t id : ids) {
      if (id < 0 || id >= vocab_size()) continue;
      if (is_special(id)) {
        if (o.skip_special) continue;
        flush();
        auto it = added_special_.find(id);
        out += it != added_special_.end() ? it->second : sp_->IdToPiece(id);
        continue;
      }
      if (id >= sp_->GetPieceSize()) continue;  // a non-special added id beyond the model: nothing to say
      run.push_back(id);
    }
    flush();
    return utf8::lossy(out);
  }

  int vocab_size() const override { return std::max(sp_->GetPieceSize(), extra_size_); }

  std::optional<std::int32_t> token_id(std::string_view token) const override {
    for (const auto& a : splitters_) {
      if (a.content == token) return a.id;
    }
    const int id = sp_->PieceToId(std::string(token));
    if (id >= 0 && sp_->IdToPiece(id) == token) return id;
    return std::nullopt;
  }

  bool is_special(std::int32_t id) const override {
    if (added_special_.count(id) != 0) return true;
    return id >= 0 && id < sp_->GetPieceSize() && (sp_->IsControl(id) || sp_->IsUnknown(id));
  }

  const special_tokens& specials() const override { return specials_; }
  std::string_view kind() const override { return "sentencepiece"; }

 private:
  status encode_stretch(std::string_view s, std::vector<std::int32_t>& ids) const {
    if (s.empty()) return ok_status();
    std::vector<int> part;
    const auto st = sp_->Encode(std::string(s), &part);
    if (!st.ok()) return make_error(errc::invalid_argument, "sentencepiece: " + st.ToString());
    ids.insert(ids.end(), part.begin(), part.end());
    return ok_status();
  }

  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  special_tokens specials_;
  std::vector<added_token> splitters_;  // longest first
  std::unordered_map<std::int32_t, std::string> added_special_;
  int extra_size_ = 0;
};

}  // namespace

result<std::unique_ptr<tokenizer>> load_sentencepiece(const std::string& path, const dir_config& config) {
  auto sp = std::make_unique<sentencepiece::SentencePieceProcessor>();
  if (const auto st = sp->Load(path); !st.ok()) {
    return make_error(errc::bad_format, path + ": not a SentencePiece model (" + st.ToString() + ")");
  }
  native_specials n;
  if (sp->bos_id() >= 0) n.bos_id = sp->bos_id();
  if (sp->eos_id() >= 0) n.eos_id = sp->eos_id();
  n.add_bos = true;  // LlamaTokenizer's default; tokenizer_config.json's add_bos_token overrides it
  auto* raw = sp.get();
  auto lookup = [&](const std::string& t) -> std::optional<std::int32_t> {
    for (const auto& a : config.added) {
      if (a.content == t) return a.id;
    }
    const int id = raw->PieceToId(t);
    if (id >= 0 && raw->IdToPiece(id) == t) return id;
    return std::nullopt;
  };
  auto text_of = [&](std::int32_t id) -> std::string {
    for (const auto& a : config.added) {
      if (a.id == id) return a.content;
    }
    return id >= 0 && id < raw->GetPieceSize() ? raw->IdToPiece(id) : std::string();
  };
  auto tok = std::make_unique<sentencepiece_tokenizer>(std::move(sp));
  tok->set_specials(resolve_specials(config, n, lookup, text_of), config.added);
  return std::unique_ptr<tokenizer>(std::move(tok));
}

}  // namespace conveyor::tokenizer
