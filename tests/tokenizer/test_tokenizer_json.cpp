// tokenizer.json loading and byte-level BPE on a tokenizer small enough to reason about by hand.
#include <gtest/gtest.h>

#include "conveyor/tokenizer/tokenizer.hpp"
#include "tokenizer_test_util.hpp"

namespace conveyor::tokenizer {
namespace {

using ids = std::vector<std::int32_t>;
using testing::make_temp_dir;
using testing::tiny_byte_level_json;
using testing::write_file;

std::unique_ptr<tokenizer> load_tiny(const nlohmann::json& doc, const std::string& extra_config = "",
                                     const std::string& generation_config = "") {
  auto dir = make_temp_dir("tok");
  write_file(dir / "tokenizer.json", doc.dump());
  if (!extra_config.empty()) write_file(dir / "tokenizer_config.json", extra_config);
  if (!generation_config.empty()) write_file(dir / "generation_config.json", generation_config);
  auto t = load_tokenizer(dir.string());
  std::filesystem::remove_all(dir);
  EXPECT_TRUE(t.ok()) << (t.ok() ? "" : t.err().message);
  return t.ok() ? std::move(*t) : nullptr;
}

TEST(TokenizerJson, MergesInRankOrderAndBosFromTheTemplate) {
  auto t = load_tiny(tiny_byte_level_json());
  ASSERT_TRUE(t);
  EXPECT_EQ(t->kind(), "byte_level_bpe");
  EXPECT_EQ(t->vocab_size(), 306);
  // "hello" merges fully; " world" pre-tokenizes as one word and merges Ġ+w, Ġw+o; the rest are bytes.
  auto r = t->encode("hello world");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, (ids{300, 259, 261, 'r', 'l', 'd'}));
  auto plain = t->encode("hello world", {.add_special = false});
  EXPECT_EQ(*plain, (ids{259, 261, 'r', 'l', 'd'}));
  EXPECT_EQ(t->specials().bos_id, 300);
  EXPECT_TRUE(t->specials().add_bos);
  EXPECT_EQ(t->decode(*r), "hello world");
  EXPECT_EQ(t->decode(*r, {.skip_special = false}), "<|begin_of_text|>hello world");
}

TEST(TokenizerJson, AddedTokensSplitTheTextUnlessParsingIsOff) {
  auto t = load_tiny(tiny_byte_level_json());
  ASSERT_TRUE(t);
  auto r = t->encode("hi<|eot_id|>hello<tool>", {.add_special = false});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, (ids{'h', 'i', 302, 259, 305}));
  // With parse_special off, special tokens are text; the non-special <tool> still matches (as in HF).
  auto raw = t->encode("<|eot_id|><tool>", {.add_special = false, .parse_special = false});
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ(raw->back(), 305);
  EXPECT_EQ(t->decode(*raw), "<|eot_id|><tool>");
  EXPECT_TRUE(t->is_special(302));
  EXPECT_FALSE(t->is_special(305));
  EXPECT_FALSE(t->is_special(259));
  EXPECT_EQ(t->token_id("<|eot_id|>"), 302);
  EXPECT_EQ(t->token_id("hello"), 259);
  EXPECT_FALSE(t->token_id("nope").has_value());
}

TEST(TokenizerJson, EveryByteStringRoundTrips) {
  auto t = load_tiny(tiny_byte_level_json());
  ASSERT_TRUE(t);
  for (const std::string s : {"", " ", "  \t\n x", "héllo wörld — 日本語 👋🏽", "a\r\nb", "12345 3.14"}) {
    auto r = t->encode(s, {.add_special = false});
    ASSERT_TRUE(r.ok()) << s;
    EXPECT_EQ(t->decode(*r), s);
  }
}

TEST(TokenizerJson, InvalidUtf8IsAnErrorAndBrokenIdsDecodeLossily) {
  auto t = load_tiny(tiny_byte_level_json());
  ASSERT_TRUE(t);
  auto r = t->encode(std::string("ok\xC3", 3));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.err().code, errc::invalid_argument);
  EXPECT_NE(r.err().message.find("UTF-8"), std::string::npos);
  // Half of "é" (0xC3 0xA9), then an unknown id: U+FFFD, nothing for the unknown id.
  EXPECT_EQ(t->decode(ids{'a', 0xC3, 99999, -1}), "a\xEF\xBF\xBD");
}

TEST(TokenizerJson, ConfigFilesOverrideAndAddEosIds) {
  auto t = load_tiny(tiny_byte_level_json(), R"({"add_bos_token": false, "eos_token": "<|eot_id|>"})",
                     R"({"eos_token_id": [301, 302]})");
  ASSERT_TRUE(t);
  EXPECT_FALSE(t->specials().add_bos);
  EXPECT_EQ(t->specials().eos_ids, (ids{302, 301}));
  EXPECT_EQ(t->specials().eos_token, "<|eot_id|>");
  EXPECT_EQ(*t->encode("hello"), (ids{259}));
}

TEST(TokenizerJson, IgnoreMergesTakesWholeWordsFromTheVocabulary) {
  auto doc = tiny_byte_level_json();
  // A vocabulary word that the merges cannot reach: only ignore_merges finds it.
  doc["model"]["vocab"]["xyz"] = 270;
  auto without = load_tiny(doc);
  ASSERT_TRUE(without);
  EXPECT_EQ(*without->encode("xyz", {.add_special = false}), (ids{'x', 'y', 'z'}));
  doc["model"]["ignore_merges"] = true;
  auto with = load_tiny(doc);
  ASSERT_TRUE(with);
  EXPECT_EQ(*with->encode("xyz", {.add_special = false}), (ids{270}));
}

TEST(TokenizerJson, ErrorsNameWhatIsWrong) {
  auto dir = make_temp_dir("tok-bad");
  auto t = load_tokenizer(dir.string());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.err().code, errc::not_found);

  write_file(dir / "tokenizer.json", "{ not json");
  t = load_tokenizer(dir.string());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.err().code, errc::bad_format);

  auto doc = tiny_byte_level_json();
  doc["pre_tokenizer"] = {{"type", "Whitespace"}};
  write_file(dir / "tokenizer.json", doc.dump());
  t = load_tokenizer(dir.string());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.err().code, errc::unsupported);
  EXPECT_NE(t.err().message.find("pre_tokenizer.type = Whitespace"), std::string::npos) << t.err().message;

  doc = tiny_byte_level_json();
  doc["model"]["merges"].push_back("q nothere");
  write_file(dir / "tokenizer.json", doc.dump());
  t = load_tokenizer(dir.string());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.err().code, errc::bad_format);
  EXPECT_NE(t.err().message.find("merge 6"), std::string::npos) << t.err().message;

  doc = tiny_byte_level_json();
  doc["model"]["type"] = "WordPiece";
  write_file(dir / "tokenizer.json", doc.dump());
  t = load_tokenizer(dir.string());
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.err().message.find("WordPiece"), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(TokenizerJson, SplitPreTokenizerWithLlama3PatternAndNfc) {
  auto doc = tiny_byte_level_json();
  doc["normalizer"] = {{"type", "NFC"}};
  doc["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       nlohmann::json::array(
           {{{"type", "Split"},
             {"pattern", {{"Regex", R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}}},
             {"behavior", "Isolated"},
             {"invert", false}},
            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
  auto t = load_tiny(doc);
  ASSERT_TRUE(t);
  // NFC turns e + U+0301 into é (0xC3 0xA9) before the bytes are spelled.
  EXPECT_EQ(*t->encode("e\xCC\x81", {.add_special = false}), (ids{0xC3, 0xA9}));
  EXPECT_EQ(t->decode(*t->encode("12345 hello", {.add_special = false})), "12345 hello");
}

}  // namespace
}  // namespace conveyor::tokenizer
