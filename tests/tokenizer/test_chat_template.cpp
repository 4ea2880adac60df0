// Chat messages rendered in each family's format, detected from tokenizer_config.json's template.
#include <gtest/gtest.h>

#include "conveyor/tokenizer/chat_template.hpp"
#include "tokenizer_test_util.hpp"

namespace conveyor::tokenizer {
namespace {

std::unique_ptr<tokenizer> with_template(const std::string& jinja) {
  auto dir = testing::make_temp_dir("chat");
  testing::write_file(dir / "tokenizer.json", testing::tiny_byte_level_json().dump());
  testing::write_file(dir / "tokenizer_config.json", nlohmann::json{{"chat_template", jinja}, {"eos_token", "<|end_of_text|>"}}.dump());
  auto t = load_tokenizer(dir.string());
  std::filesystem::remove_all(dir);
  EXPECT_TRUE(t.ok());
  return std::move(*t);
}

const std::vector<chat_message> kChat = {{"system", "Be brief."}, {"user", " Hi! "}};

TEST(ChatTemplate, DetectsTheFamilies) {
  EXPECT_EQ(detect_chat_format("{{ '<|start_header_id|>' + role }}"), chat_format::llama3);
  EXPECT_EQ(detect_chat_format("{{ '<|im_start|>' + message['role'] }}"), chat_format::chatml);
  EXPECT_EQ(detect_chat_format("{{ '<|user|>\\n' + message['content'] + eos_token }}"), chat_format::zephyr);
  EXPECT_EQ(detect_chat_format("{{ bos_token + '[INST] ' + content }}"), chat_format::llama2);
  EXPECT_EQ(detect_chat_format(""), chat_format::plain);
}

TEST(ChatTemplate, Llama3) {
  auto t = with_template("<|start_header_id|>");
  auto r = render_chat(*t, kChat);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->prompt,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(r->stop_ids, std::vector<std::int32_t>{302});
  auto ids = t->encode(r->prompt, {.add_special = false});
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->front(), 300);  // BOS written by the format, parsed as the special token
}

TEST(ChatTemplate, ChatmlZephyrLlama2AndPlain) {
  EXPECT_EQ(render_chat(*with_template("<|im_start|>"), kChat)->prompt,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n Hi! <|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(render_chat(*with_template("<|user|>"), kChat)->prompt,
            "<|system|>\nBe brief.<|end_of_text|>\n<|user|>\n Hi! <|end_of_text|>\n<|assistant|>\n");
  EXPECT_EQ(render_chat(*with_template("[INST]"), kChat)->prompt,
            "<|begin_of_text|>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi! [/INST]");
  EXPECT_EQ(render_chat(*with_template(""), kChat)->prompt, "<|begin_of_text|>system: Be brief.\nuser:  Hi! \nassistant:");
  EXPECT_FALSE(render_chat(*with_template(""), {}).ok());
  EXPECT_FALSE(render_chat(*with_template("[INST]"), {{"tool", "x"}}).ok());
}

}  // namespace
}  // namespace conveyor::tokenizer
