// tokenizer.model through libsentencepiece, on a model trained by the test (libsentencepiece_train).
#include <gtest/gtest.h>
#include <sentencepiece_trainer.h>

#include <sstream>

#include "conveyor/tokenizer/tokenizer.hpp"
#include "tokenizer_test_util.hpp"

namespace conveyor::tokenizer {
namespace {

using testing::make_temp_dir;
using testing::write_file;

class SentencePiece : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::filesystem::path(make_temp_dir("spm"));
    std::ostringstream text;
    for (int i = 0; i < 200; ++i) {
      text << "the quick brown fox jumps over the lazy dog " << i << "\n"
           << "a stitch in time saves nine; all that glitters is not gold\n";
    }
    write_file(*dir_ / "corpus.txt", text.str());
    const std::string args = "--input=" + (*dir_ / "corpus.txt").string() + " --model_prefix=" +
                             (*dir_ / "tokenizer").string() +
                             " --vocab_size=400 --model_type=bpe --normalization_rule_name=identity"
                             " --remove_extra_whitespaces=false --byte_fallback=true --character_coverage=1.0"
                             " --unk_id=0 --bos_id=1 --eos_id=2 --pad_id=-1 --minloglevel=2";
    const auto st = sentencepiece::SentencePieceTrainer::Train(args);
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }
  static std::filesystem::path* dir_;
};
std::filesystem::path* SentencePiece::dir_ = nullptr;

TEST_F(SentencePiece, EncodesWithBosAndRoundTrips) {
  auto t = load_tokenizer(dir_->string());
  ASSERT_TRUE(t.ok()) << t.err().message;
  EXPECT_EQ((*t)->kind(), "sentencepiece");
  EXPECT_EQ((*t)->specials().bos_id, 1);
  EXPECT_EQ((*t)->specials().eos_ids, std::vector<std::int32_t>{2});
  auto r = (*t)->encode("the quick brown fox");
  ASSERT_TRUE(r.ok());
  ASSERT_FALSE(r->empty());
  EXPECT_EQ(r->front(), 1);
  EXPECT_LT(r->size(), 12u);  // merged pieces, not 19 characters
  EXPECT_EQ((*t)->decode(*r), "the quick brown fox");
  // Characters the model never saw go through byte fallback and come back whole.
  for (const std::string s : {"naïve 日本 👋🏽", "  two  spaces", "digits 0123456789"}) {
    auto x = (*t)->encode(s, {.add_special = false});
    ASSERT_TRUE(x.ok());
    EXPECT_EQ((*t)->decode(*x), s);
  }
}

TEST_F(SentencePiece, ControlTokensInTextAndConfigOverrides) {
  write_file(*dir_ / "tokenizer_config.json", R"({"add_bos_token": false, "chat_template": "<|user|>"})");
  auto t = load_tokenizer(dir_->string());
  std::filesystem::remove(*dir_ / "tokenizer_config.json");
  ASSERT_TRUE(t.ok()) << t.err().message;
  EXPECT_FALSE((*t)->specials().add_bos);
  EXPECT_EQ((*t)->specials().chat_template, "<|user|>");
  auto r = (*t)->encode("the dog</s>");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->back(), 2);
  EXPECT_EQ((*t)->decode(*r), "the dog");
  EXPECT_EQ((*t)->decode(*r, {.skip_special = false}), "the dog</s>");
  EXPECT_TRUE((*t)->is_special(1));
  EXPECT_EQ((*t)->token_id("</s>"), 2);
}

TEST_F(SentencePiece, ABrokenModelFileIsBadFormat) {
  auto dir = make_temp_dir("spm-bad");
  write_file(dir / "tokenizer.model", "not a protobuf at all");
  auto t = load_tokenizer(dir.string());
  std::filesystem::remove_all(dir);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.err().code, errc::bad_format);
}

}  // namespace
}  // namespace conveyor::tokenizer
