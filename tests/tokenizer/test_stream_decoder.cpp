// Incremental decoding: the pieces a stream emits join to the whole decode, and none cuts a character.
#include <gtest/gtest.h>

#include "conveyor/tokenizer/stream_decoder.hpp"
#include "tokenizer_test_util.hpp"

namespace conveyor::tokenizer {
namespace {

TEST(StreamDecoder, PiecesJoinToTheWholeTextOneIdAtATime) {
  auto dir = testing::make_temp_dir("stream");
  testing::write_file(dir / "tokenizer.json", testing::tiny_byte_level_json().dump());
  auto t = load_tokenizer(dir.string());
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(t.ok());
  const std::string text = "hello wörld 日本語 👋🏽 done<|eot_id|>";
  auto ids = (*t)->encode(text, {.add_special = false});
  ASSERT_TRUE(ids.ok());
  stream_decoder d(**t);
  std::string joined;
  int empty_pushes = 0;
  for (std::int32_t id : *ids) {
    const std::string piece = d.push(std::span<const std::int32_t>(&id, 1));
    EXPECT_EQ(piece.find("\xEF\xBF\xBD"), std::string::npos) << "a piece cut a character";
    empty_pushes += piece.empty();
    joined += piece;
  }
  joined += d.finish();
  EXPECT_EQ(joined, "hello wörld 日本語 👋🏽 done");  // the special token is skipped
  EXPECT_GT(empty_pushes, 0);                       // multi-byte characters waited for their last byte
}

TEST(StreamDecoder, AnUnfinishedCharacterComesOutAtFinish) {
  auto dir = testing::make_temp_dir("stream2");
  testing::write_file(dir / "tokenizer.json", testing::tiny_byte_level_json().dump());
  auto t = load_tokenizer(dir.string());
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(t.ok());
  stream_decoder d(**t);
  const std::int32_t ok[] = {'o', 'k'}, half[] = {0xE6};  // then the first byte of a CJK character
  EXPECT_EQ(d.push(ok), "ok");
  EXPECT_EQ(d.push(half), "");
  EXPECT_EQ(d.finish(), "\xEF\xBF\xBD");
}

}  // namespace
}  // namespace conveyor::tokenizer
