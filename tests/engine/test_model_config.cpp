#include <gtest/gtest.h>

#include <cmath>

#include "conveyor/engine/model_config.hpp"

namespace conveyor::engine {
namespace {

const char* base_config = R"({"model_type":"llama","vocab_size":100,"hidden_size":64,"intermediate_size":128,
  "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"rms_norm_eps":1e-5 %s})";

std::string with(const std::string& extra) {
  char buf[2048];
  std::snprintf(buf, sizeof buf, base_config, extra.c_str());
  return buf;
}

TEST(model_config, reads_llama_defaults) {
  auto c = parse_model_config(with(""), "config.json");
  ASSERT_TRUE(c.ok()) << c.err().message;
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->num_kv_heads, 2);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_EQ(c->rope.type, "default");
  EXPECT_DOUBLE_EQ(c->rope.theta, 10000.0);
}

TEST(model_config, explicit_head_dim_and_biases) {
  auto c = parse_model_config(with(R"(,"head_dim":32,"attention_bias":true,"mlp_bias":true)"), "c");
  ASSERT_TRUE(c.ok()) << c.err().message;
  EXPECT_EQ(c->head_dim, 32);
  EXPECT_TRUE(c->qkv_bias && c->o_bias && c->mlp_bias);
}

TEST(model_config, both_rope_spellings_agree) {
  auto legacy = parse_model_config(
      with(R"(,"rope_theta":500000.0,"rope_scaling":{"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,
           "high_freq_factor":4.0,"original_max_position_embeddings":8192})"),
      "c");
  auto v5 = parse_model_config(
      with(R"(,"rope_parameters":{"rope_theta":500000.0,"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,
           "high_freq_factor":4.0,"original_max_position_embeddings":8192})"),
      "c");
  ASSERT_TRUE(legacy.ok()) << legacy.err().message;
  ASSERT_TRUE(v5.ok()) << v5.err().message;
  EXPECT_EQ(legacy->rope.type, "llama3");
  const auto a = compute_rope_tables(*legacy);
  const auto b = compute_rope_tables(*v5);
  EXPECT_EQ(a.inv_freq, b.inv_freq);
  // llama3 keeps high frequencies and divides low ones by the factor.
  auto plain = parse_model_config(with(R"(,"rope_theta":500000.0)"), "c");
  const auto p = compute_rope_tables(*plain);
  EXPECT_FLOAT_EQ(a.inv_freq[0], p.inv_freq[0]);
  EXPECT_NEAR(a.inv_freq.back(), p.inv_freq.back() / 8.0f, 1e-12);
}

TEST(model_config, legacy_type_key_for_linear_scaling) {
  auto c = parse_model_config(with(R"(,"rope_scaling":{"type":"linear","factor":2.0})"), "c");
  ASSERT_TRUE(c.ok()) << c.err().message;
  EXPECT_EQ(c->rope.type, "linear");
  auto t = compute_rope_tables(*c);
  EXPECT_FLOAT_EQ(t.inv_freq[0], 0.5f);
}

TEST(model_config, qwen2_has_qkv_bias_and_mistral_a_window) {
  std::string q = with("");
  q.replace(q.find("llama"), 5, "qwen2");
  auto c = parse_model_config(q, "c");
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_FALSE(c->o_bias);
  std::string m = with(R"(,"sliding_window":4096)");
  m.replace(m.find("llama"), 5, "mistral");
  auto mc = parse_model_config(m, "c");
  ASSERT_TRUE(mc.ok());
  EXPECT_EQ(mc->sliding_window, std::vector<int>({4096, 4096}));
}

TEST(model_config, errors_name_the_problem) {
  auto expect_error = [](const std::string& text, const std::string& needle) {
    auto c = parse_model_config(text, "dir/config.json");
    ASSERT_FALSE(c.ok()) << "accepted: " << text;
    EXPECT_NE(c.err().message.find(needle), std::string::npos) << c.err().message;
    EXPECT_NE(c.err().message.find("dir/config.json"), std::string::npos) << c.err().message;
  };
  expect_error("{not json", "malformed JSON");
  expect_error(R"({"model_type":"gpt2"})", "gpt2");
  expect_error(R"({"model_type":"llama"})", "vocab_size");
  expect_error(with(R"(,"num_key_value_heads":3)"), "multiple");
  expect_error(with(R"(,"head_dim":"x")"), "head_dim");
  expect_error(with(R"(,"rope_scaling":{"rope_type":"dynamic","factor":2.0})"), "dynamic");
  expect_error(with(R"(,"hidden_act":"gelu")"), "gelu");
  expect_error(with(R"(,"rope_scaling":{"rope_type":"llama3","factor":8.0})"), "original_max_position_embeddings");
  expect_error(with(R"(,"tie_word_embeddings":"yes")"), "tie_word_embeddings");
}

// Found by fuzz/model_config: a float far outside int's range was converted to int to test whether it
// was whole (undefined behaviour); now it is an out-of-range error like any other (fuzz/regressions/).
TEST(model_config, huge_numbers_for_integer_keys_are_out_of_range) {
  for (const char* value : {"4444444444444444444444444444444192", "1e300", "18446744073709551615", "-9.9e30"}) {
    auto c = parse_model_config(with(std::string(R"(,"head_dim":)") + value), "config.json");
    ASSERT_FALSE(c.ok()) << value;
    EXPECT_NE(c.err().message.find("\"head_dim\""), std::string::npos) << c.err().message;
    EXPECT_NE(c.err().message.find("out of range"), std::string::npos) << c.err().message;
  }
  auto rope = parse_model_config(
      with(R"(,"rope_scaling":{"rope_type":"yarn","factor":4.0,"original_max_position_embeddings":1e300})"), "c");
  ASSERT_FALSE(rope.ok());
  EXPECT_NE(rope.err().message.find("original_max_position_embeddings\" is out of range"), std::string::npos)
      << rope.err().message;
  auto whole = parse_model_config(with(R"(,"head_dim":32.0)"), "config.json");
  ASSERT_TRUE(whole.ok()) << whole.err().message;
  EXPECT_EQ(whole->head_dim, 32);
}

}  // namespace
}  // namespace conveyor::engine
