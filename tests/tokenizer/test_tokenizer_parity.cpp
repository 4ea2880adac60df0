// Our tokenizers against the npm reference implementations on the real vocabularies: Llama 3
// (llama3-tokenizer-js, through our byte-level BPE) and Llama 2 (llama-tokenizer-js, through
// libsentencepiece and through our metaspace BPE). npm_reference.sh extracts the files and the
// reference ids at test time (see README.md); without node or the registry these tests skip.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "conveyor/tokenizer/tokenizer.hpp"

namespace conveyor::tokenizer {
namespace {

namespace fs = std::filesystem;
const fs::path kRef = CONVEYOR_TOKENIZER_REF;

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class Parity : public ::testing::Test {
 protected:
  void SetUp() override {
    if (fs::exists(kRef / "SKIP")) GTEST_SKIP() << "npm reference unavailable: " << read(kRef / "SKIP");
    if (!fs::exists(kRef / "expected.json")) GTEST_SKIP() << "run the tokenizer.npm_reference test first (ctest fixture)";
    expected_ = nlohmann::json::parse(read(kRef / "expected.json"));
  }
  std::string show(const std::string& text) const { return nlohmann::json(text).dump(); }
  nlohmann::json expected_;
};

TEST_F(Parity, Llama3ByteLevelBpeMatchesIdsExactly) {
  const auto t0 = std::chrono::steady_clock::now();
  auto tok = load_tokenizer((kRef / "llama3").string());
  ASSERT_TRUE(tok.ok()) << tok.err().message;
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ((*tok)->vocab_size(), 128256);
  int texts = 0;
  std::size_t tokens = 0;
  for (const auto& e : expected_) {
    const std::string text = e["text"];
    auto ids = (*tok)->encode(text, {.add_special = false});
    ASSERT_TRUE(ids.ok()) << ids.err().message;
    EXPECT_EQ(*ids, e["llama3"].get<std::vector<std::int32_t>>()) << show(text);
    // decode(encode(x)) == x, and our decode agrees with the reference's (specials kept).
    EXPECT_EQ((*tok)->decode(*ids, {.skip_special = false}), text) << show(text);
    EXPECT_EQ((*tok)->decode(e["llama3"].get<std::vector<std::int32_t>>(), {.skip_special = false}),
              e["llama3_decoded"].get<std::string>());
    ++texts;
    tokens += ids->size();
  }
  auto with_bos = (*tok)->encode("Hello world!");
  EXPECT_EQ(*with_bos, (std::vector<std::int32_t>{128000, 9906, 1917, 0}));  // llama3-tokenizer-js README
  std::printf("llama3: %d texts, %zu tokens, all identical; load %.2f s\n", texts, tokens, load_s);
}

void check_llama2(const nlohmann::json& expected, const tokenizer& tok, const char* name) {
  int texts = 0;
  for (const auto& e : expected) {
    if (!e.contains("llama2")) continue;
    const std::string text = e["text"];
    auto ids = tok.encode(text);  // BOS + SentencePiece's dummy prefix, as llama-tokenizer-js by default
    ASSERT_TRUE(ids.ok()) << ids.err().message;
    EXPECT_EQ(*ids, e["llama2"].get<std::vector<std::int32_t>>()) << name << ": " << nlohmann::json(text).dump();
    EXPECT_EQ(tok.decode(*ids), text) << name << ": " << nlohmann::json(text).dump();
    ++texts;
  }
  std::printf("%s: %d texts identical\n", name, texts);
}

TEST_F(Parity, Llama2SentencePieceMatchesIdsExactly) {
  auto tok = load_tokenizer((kRef / "llama2-spm").string());
  ASSERT_TRUE(tok.ok()) << tok.err().message;
  EXPECT_EQ((*tok)->kind(), "sentencepiece");
  check_llama2(expected_, **tok, "llama2 tokenizer.model");
}

TEST_F(Parity, Llama2MetaspaceTokenizerJsonMatchesIdsExactly) {
  auto tok = load_tokenizer((kRef / "llama2-json").string());
  ASSERT_TRUE(tok.ok()) << tok.err().message;
  EXPECT_EQ((*tok)->kind(), "metaspace_bpe");
  check_llama2(expected_, **tok, "llama2 tokenizer.json");
}

}  // namespace
}  // namespace conveyor::tokenizer
