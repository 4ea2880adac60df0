#include "conveyor/engine/ngram_match.hpp"

#include <algorithm>
#include <unordered_map>

namespace conveyor::engine {

std::vector<std::int32_t> lookup_in_sequence(std::span<const std::int32_t> tokens, int min_n, int max_n, int k) {
  const long len = static_cast<long>(tokens.size());
  if (k <= 0) return {};
  for (int n = std::min<long>(max_n, len - 1); n >= std::max(min_n, 1); --n) {
    const auto suffix = tokens.subspan(len - n);
    // Latest first: start i of an earlier occurrence ends before the last token (i + n < len).
    for (long i = len - n - 1; i >= 0; --i) {
      if (tokens[i + n - 1] != suffix[n - 1] || !std::equal(suffix.begin(), suffix.end(), tokens.begin() + i)) continue;
      const long from = i + n;
      const long to = std::min(len, from + k);
      return std::vector<std::int32_t>(tokens.begin() + from, tokens.begin() + to);
    }
  }
  return {};
}

std::uint64_t ngram_hash(std::span<const std::int32_t> tokens) {
  std::uint64_t h = 0x9e3779b97f4a7c15ull ^ tokens.size();
  for (std::int32_t t : tokens) {
    h ^= static_cast<std::uint32_t>(t) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 31;
  }
  return h;
}

ngram_index::ngram_index(std::vector<std::int32_t> corpus, int min_n, int max_n)
    : corpus_(std::move(corpus)), min_n_(min_n) {
  const std::size_t size = corpus_.size();
  for (int n = min_n; n <= max_n; ++n) {
    std::vector<entry> t;
    if (size > static_cast<std::size_t>(n)) t.reserve(size - n);
    for (std::size_t i = 0; i + n < size; ++i) {
      t.push_back({ngram_hash(std::span<const std::int32_t>(corpus_.data() + i, n)), static_cast<std::uint32_t>(i + n)});
    }
    // Sorted by hash, occurrences in corpus order within a hash. One entry is kept per n-gram: the
    // latest occurrence among those followed by the n-gram's most frequent next token (REST ranks
    // continuations by frequency too): a common n-gram's latest occurrence is often followed by a
    // rare token, and a wrong first token wastes the whole proposal.
    std::stable_sort(t.begin(), t.end(), [](const entry& a, const entry& b) { return a.hash < b.hash; });
    std::vector<entry> kept;
    std::unordered_map<std::int32_t, int> count;
    for (std::size_t lo = 0, hi = 0; lo < t.size(); lo = hi) {
      while (hi < t.size() && t[hi].hash == t[lo].hash) ++hi;
      std::size_t best = hi - 1;
      if (hi - lo > 1) {
        count.clear();
        int best_count = 0;
        for (std::size_t i = lo; i < hi; ++i) {  // corpus order: ">=" leaves the latest of a tie
          const int c = ++count[corpus_[t[i].next]];
          if (c >= best_count) best_count = c;
        }
        for (std::size_t i = hi; i-- > lo;) {
          if (count[corpus_[t[i].next]] == best_count) {
            best = i;
            break;
          }
        }
      }
      kept.push_back(t[best]);
    }
    tables_.push_back(std::move(kept));
  }
}

std::span<const std::int32_t> ngram_index::continuation(std::span<const std::int32_t> pattern, int k) const {
  const long n = static_cast<long>(pattern.size());
  if (k <= 0 || n < min_n_ || n >= min_n_ + static_cast<long>(tables_.size())) return {};
  const auto& t = tables_[n - min_n_];
  const std::uint64_t h = ngram_hash(pattern);
  const auto it = std::lower_bound(t.begin(), t.end(), h, [](const entry& e, std::uint64_t v) { return e.hash < v; });
  if (it == t.end() || it->hash != h) return {};
  // A hash collision would point at another n-gram: check the tokens.
  const std::size_t at = it->next;
  if (!std::equal(pattern.begin(), pattern.end(), corpus_.begin() + (at - n))) return {};
  const std::size_t len = std::min<std::size_t>(k, corpus_.size() - at);
  return std::span<const std::int32_t>(corpus_.data() + at, len);
}

}  // namespace conveyor::engine
