// The gateway's plain parts without a server: stop strings held back across pieces, request parsing.
#include <gtest/gtest.h>

#include "generation.hpp"
#include "openai_request.hpp"

namespace conveyor::http {
namespace {

TEST(StopText, HoldsBackAPossibleStartAndCutsAtTheStop) {
  stop_text s({"END", "\n\n"});
  bool hit = false;
  EXPECT_EQ(s.push("hello E", hit), "hello ");
  EXPECT_FALSE(hit);
  EXPECT_EQ(s.push("N", hit), "");
  EXPECT_EQ(s.push("X more", hit), "ENX more");
  EXPECT_EQ(s.push(" then\n", hit), " then");
  EXPECT_EQ(s.push("\nafter", hit), "");
  EXPECT_TRUE(hit);
  stop_text none({});
  EXPECT_EQ(none.push("anything END", hit), "anything END");
  EXPECT_FALSE(hit);
  stop_text tail({"xyz"});
  EXPECT_EQ(tail.push("abcxy", hit), "abc");
  EXPECT_EQ(tail.flush(), "xy");
}

TEST(OpenAIRequest, DefaultsAndFields) {
  request_context ctx{nullptr, "m", 1024, 512};
  auto r = parse_completion_request(R"({"prompt": [1, 2], "temperature": 0.5, "top_p": 0.9, "top_k": 40, "seed": 7,
                                        "stop_token_ids": [5], "max_tokens": 9})",
                                    false, ctx);
  ASSERT_TRUE(std::holds_alternative<completion_request>(r));
  const auto& c = std::get<completion_request>(r);
  EXPECT_EQ(c.generate.prompt, (std::vector<std::int32_t>{1, 2}));
  EXPECT_EQ(c.generate.max_new_tokens, 9);
  EXPECT_FLOAT_EQ(c.generate.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(c.generate.sampling.top_p, 0.9f);
  EXPECT_EQ(c.generate.sampling.top_k, 40);
  EXPECT_EQ(c.generate.sampling.seed, 7u);
  EXPECT_EQ(c.generate.stop_ids, std::vector<std::int32_t>{5});
  auto d = parse_completion_request(R"({"prompt": [[3]]})", false, ctx);
  ASSERT_TRUE(std::holds_alternative<completion_request>(d));
  EXPECT_EQ(std::get<completion_request>(d).generate.max_new_tokens, 16);  // OpenAI's default
  EXPECT_FLOAT_EQ(std::get<completion_request>(d).generate.sampling.temperature, 1.0f);
  auto batch = parse_completion_request(R"({"prompt": [[3], [4]]})", false, ctx);
  ASSERT_TRUE(std::holds_alternative<api_error>(batch));
  EXPECT_NE(std::get<api_error>(batch).message.find("one request per prompt"), std::string::npos);
  auto stops = parse_completion_request(R"({"prompt": [1], "stop": "x"})", false, ctx);
  ASSERT_TRUE(std::holds_alternative<api_error>(stops));  // no tokenizer: stop strings can't be matched
  EXPECT_EQ(std::get<api_error>(stops).param, "stop");
}

}  // namespace
}  // namespace conveyor::http
