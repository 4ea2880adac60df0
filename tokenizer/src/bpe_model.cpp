#include "bpe_model.hpp"

#include <cstdio>
#include <queue>

#include "utf8.hpp"

namespace conveyor::tokenizer {

result<bpe_model> bpe_model::create(std::unordered_map<std::string, std::int32_t> vocab,
                                    const std::vector<std::pair<std::string, std::string>>& merges,
                                    const bpe_options& options) {
  bpe_model m;
  m.options_ = options;
  std::int32_t max_id = -1;
  for (const auto& [piece, id] : vocab) {
    if (id < 0) return make_error(errc::bad_format, "tokenizer.json: model.vocab[\"" + piece + "\"] is negative");
    max_id = std::max(max_id, id);
  }
  m.pieces_.assign(static_cast<std::size_t>(max_id + 1), std::string());
  m.byte_of_.assign(m.pieces_.size(), -1);
  for (auto& b : m.byte_ids_) b = -1;
  for (const auto& [piece, id] : vocab) {
    m.pieces_[static_cast<std::size_t>(id)] = piece;
    unsigned value = 0;
    char tail = 0;
    if (piece.size() == 6 && std::sscanf(piece.c_str(), "<0x%2X%c", &value, &tail) == 2 && tail == '>') {
      m.byte_of_[static_cast<std::size_t>(id)] = static_cast<std::int16_t>(value);
      m.byte_ids_[value] = id;
    }
  }
  m.vocab_ = std::move(vocab);
  m.merges_.reserve(merges.size());
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    auto ia = m.vocab_.find(a), ib = m.vocab_.find(b), im = m.vocab_.find(a + b);
    if (ia == m.vocab_.end() || ib == m.vocab_.end() || im == m.vocab_.end()) {
      return make_error(errc::bad_format, "tokenizer.json: merge " + std::to_string(rank) + " (\"" + a + "\", \"" + b +
                                              "\") names a piece that is not in the vocabulary");
    }
    // A pair listed twice keeps its first (best) rank, as HF does.
    m.merges_.emplace(pair_key(ia->second, ib->second), merge_entry{static_cast<std::int32_t>(rank), im->second});
  }
  return m;
}

const std::string* bpe_model::piece(std::int32_t id) const {
  if (id < 0 || id >= size() || pieces_[static_cast<std::size_t>(id)].empty()) return nullptr;
  return &pieces_[static_cast<std::size_t>(id)];
}

std::optional<std::int32_t> bpe_model::id(std::string_view piece) const {
  auto it = vocab_.find(std::string(piece));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

int bpe_model::byte_of(std::int32_t id) const {
  if (id < 0 || id >= size()) return -1;
  return byte_of_[static_cast<std::size_t>(id)];
}

void bpe_model::initial_symbols(std::string_view word, std::vector<std::int32_t>& ids) const {
  bool last_unk = false;
  std::string ch;
  for (std::size_t i = 0; i < word.size();) {
    std::size_t n = std::min(utf8::sequence_length(static_cast<unsigned char>(word[i])), word.size() - i);
    ch.assign(word.substr(i, n));
    i += n;
    if (auto it = vocab_.find(ch); it != vocab_.end()) {
      ids.push_back(it->second);
      last_unk = false;
      continue;
    }
    if (options_.byte_fallback) {
      bool all = true;
      for (char c : ch) all = all && byte_ids_[static_cast<unsigned char>(c)] >= 0;
      if (all) {
        for (char c : ch) ids.push_back(byte_ids_[static_cast<unsigned char>(c)]);
        last_unk = false;
        continue;
      }
    }
    if (!options_.unk_id) continue;  // HF drops it too when the model has no unk token
    if (options_.fuse_unk && last_unk) continue;
    ids.push_back(*options_.unk_id);
    last_unk = true;
  }
}

void bpe_model::encode_word(std::string_view word, std::vector<std::int32_t>& out) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    if (auto it = vocab_.find(std::string(word)); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  std::vector<std::int32_t> ids;
  initial_symbols(word, ids);
  const int n = static_cast<int>(ids.size());
  if (n < 2) {
    out.insert(out.end(), ids.begin(), ids.end());
    return;
  }
  // Symbols in a doubly linked list over `ids`; a min-heap of candidate merges ordered by (rank,
  // position) so that the best-ranked, leftmost pair merges first (HF's BPE::merge_word). Stale heap
  // entries are recognised by checking the pair still stands there.
  std::vector<int> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct candidate {
    std::int32_t rank;
    int pos;
    std::int32_t left, right;
    bool operator>(const candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<candidate, std::vector<candidate>, std::greater<>> heap;
  auto consider = [&](int pos) {
    if (pos < 0 || next[pos] < 0) return;
    auto it = merges_.find(pair_key(ids[pos], ids[next[pos]]));
    if (it != merges_.end()) heap.push({it->second.rank, pos, ids[pos], ids[next[pos]]});
  };
  for (int i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    const candidate c = heap.top();
    heap.pop();
    if (!alive[c.pos] || ids[c.pos] != c.left || next[c.pos] < 0 || ids[next[c.pos]] != c.right) continue;
    const int r = next[c.pos];
    ids[c.pos] = merges_.at(pair_key(c.left, c.right)).merged;
    alive[r] = false;
    next[c.pos] = next[r];
    if (next[r] >= 0) prev[next[r]] = c.pos;
    consider(prev[c.pos]);
    consider(c.pos);
  }
  for (int i = 0; i >= 0; i = next[i]) out.push_back(ids[i]);
}

}  // namespace conveyor::tokenizer
