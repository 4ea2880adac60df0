#include "conveyor/engine/ngram_proposer.hpp"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iterator>
#include <string>

namespace conveyor::engine {

result<std::unique_ptr<ngram_proposer>> ngram_proposer::create(const ngram_options& o, std::vector<std::int32_t> corpus) {
  auto bad = [](const std::string& why) { return make_error(errc::invalid_argument, "n-gram proposer: " + why); };
  const std::string range = "must be in [1, " + std::to_string(max_ngram) + "], got ";
  if (o.min_n < 1 || o.min_n > max_ngram) return bad("min n " + range + std::to_string(o.min_n));
  if (o.max_n < 1 || o.max_n > max_ngram) return bad("max n " + range + std::to_string(o.max_n));
  if (o.min_n > o.max_n) {
    return bad("min n (" + std::to_string(o.min_n) + ") is above max n (" + std::to_string(o.max_n) + ")");
  }
  if (corpus.size() >= (1ull << 32)) return bad("the corpus has more than 2^32 tokens");
  std::int32_t top = -1;
  for (std::size_t i = 0; i < corpus.size(); ++i) {
    if (corpus[i] < 0) return bad("corpus token " + std::to_string(i) + " is negative (" + std::to_string(corpus[i]) + ")");
    top = std::max(top, corpus[i]);
  }
  std::unique_ptr<ngram_proposer> p(new ngram_proposer(o, std::move(corpus)));
  p->max_corpus_id_ = top;
  return p;
}

status ngram_proposer::check_vocabulary(int vocab_size) const {
  if (max_corpus_id_ < vocab_size) return ok_status();
  return make_error(errc::invalid_argument, "the n-gram corpus holds token id " + std::to_string(max_corpus_id_) +
                                                ", outside the model's vocabulary of " + std::to_string(vocab_size));
}

std::vector<std::int32_t> ngram_proposer::lookup(std::span<const std::int32_t> history, int k) const {
  const int len = static_cast<int>(history.size());
  auto own = [&](int n) { return n < len ? lookup_in_sequence(history, n, n, k) : std::vector<std::int32_t>{}; };
  auto stored = [&](int n) {
    auto c = n <= len ? index_.continuation(history.subspan(len - n), k) : std::span<const std::int32_t>{};
    return std::vector<std::int32_t>(c.begin(), c.end());
  };
  // The longest match wins, the sequence's own tokens at equal length. Whether the last n tokens
  // occur is monotone in n (an occurrence of n of them holds one of the last n - 1), so the
  // longest n is found by bisection: ~log2(max_n - min_n) lookups rather than one per length,
  // which matters when a decode step costs ~0.1 ms (a corpus lookup is a binary search of ~1 M entries).
  auto longest = [&](auto&& find) {
    std::vector<std::int32_t> best;
    int lo = options_.min_n, hi = std::min(options_.max_n, len), found = 0;
    while (lo <= hi) {
      const int mid = lo + (hi - lo) / 2;
      auto hit = find(mid);
      if (hit.empty()) {
        hi = mid - 1;
      } else {
        found = mid;
        best = std::move(hit);
        lo = mid + 1;
      }
    }
    return std::pair<int, std::vector<std::int32_t>>(found, std::move(best));
  };
  auto [n_own, from_own] = longest(own);
  if (index_.size() == 0) return from_own;
  auto [n_stored, from_stored] = longest(stored);
  return n_own >= n_stored ? from_own : from_stored;
}

std::vector<proposal> ngram_proposer::propose(const std::vector<draft_query>& queries) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<proposal> out(queries.size());
  for (std::size_t i = 0; i < queries.size(); ++i) out[i].tokens = lookup(queries[i].history, queries[i].k);
  counters_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

result<std::unique_ptr<ngram_proposer>> make_ngram_proposer(const ngram_options& options, const std::string& corpus_path) {
  std::vector<std::int32_t> corpus;
  if (!corpus_path.empty()) {
    auto ids = read_token_ids(corpus_path);
    if (!ids) return make_error(ids.err().code, "n-gram corpus: " + ids.err().message);
    corpus = std::move(ids).value();
  }
  return ngram_proposer::create(options, std::move(corpus));
}

result<std::vector<std::int32_t>> read_token_ids(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(errc::io, "cannot read the token file " + path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::int32_t> ids;
  std::size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (c == ' ' || c == '\n' || c == '\r' || c == '\t' || c == ',') {
      ++i;
      continue;
    }
    if (c < '0' || c > '9') {
      return make_error(errc::invalid_argument, path + ": byte " + std::to_string(i) + " ('" + std::string(1, c) +
                                                    "') is not part of a token id (decimal ids, whitespace between)");
    }
    std::int64_t v = 0;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
      v = v * 10 + (text[i] - '0');
      if (v > INT32_MAX) return make_error(errc::invalid_argument, path + ": token id " + std::to_string(ids.size()) + " is too large");
      ++i;
    }
    ids.push_back(static_cast<std::int32_t>(v));
  }
  return ids;
}

}  // namespace conveyor::engine
