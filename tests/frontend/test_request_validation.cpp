// validate_request on its own: each bad field is named, with its value and what is allowed.
#include <gtest/gtest.h>

#include <cmath>

#include "conveyor/frontend/request_validation.hpp"

namespace conveyor::frontend {
namespace {

service::generate_request ok_request() {
  service::generate_request r;
  r.prompt = {1, 2, 3};
  r.max_new_tokens = 4;
  return r;
}

const request_limits kLimits{1024, 512, 8};

std::string message_of(const service::generate_request& r) {
  auto s = validate_request(r, kLimits);
  return s.ok() ? "" : s.err().message;
}

TEST(RequestValidation, AcceptsAGoodRequest) {
  EXPECT_TRUE(validate_request(ok_request(), kLimits).ok());
  auto r = ok_request();
  r.prompt.assign(508, 1023);  // exactly fills the context
  EXPECT_TRUE(validate_request(r, kLimits).ok());
  r.prompt.push_back(1);  // 509 + 1 new token = 510
  r.max_new_tokens = 1;
  EXPECT_TRUE(validate_request(r, kLimits).ok());
  r.prompt.assign(100000, 5000);
  EXPECT_TRUE(validate_request(r, request_limits{}).ok()) << "zero limits mean not checked";
}

TEST(RequestValidation, NamesTheBadField) {
  auto r = ok_request();
  r.prompt.clear();
  EXPECT_EQ(message_of(r), "prompt is empty: send at least one token id");
  r = ok_request();
  r.prompt[2] = 1024;
  EXPECT_EQ(message_of(r), "prompt id 1024 at position 2 is outside the vocabulary [0, 1024)");
  r = ok_request();
  r.prompt.assign(509, 1);
  EXPECT_EQ(message_of(r), "prompt (509 tokens) + maxNewTokens (4) exceeds the context limit of 512 tokens");
  r = ok_request();
  r.max_new_tokens = -2;
  EXPECT_EQ(message_of(r), "maxNewTokens must be at least 1, got -2");
  r.max_new_tokens = 0;
  EXPECT_EQ(message_of(r), "maxNewTokens must be at least 1, got 0");
  r = ok_request();
  r.sampling.top_p = 0.0f;
  EXPECT_EQ(message_of(r), "sampling.topP must be in (0, 1], got 0");
  r.sampling.top_p = std::nanf("");
  EXPECT_EQ(message_of(r), "sampling.topP must be in (0, 1], got nan");
  r = ok_request();
  r.sampling.temperature = INFINITY;
  EXPECT_EQ(message_of(r), "sampling.temperature must be in [0, 100], got inf");
  r = ok_request();
  r.sampling.top_k = -1;
  EXPECT_EQ(message_of(r), "sampling.topK must be >= 0 (0 = no limit), got -1");
  r = ok_request();
  r.stop_ids.assign(9, 2);
  EXPECT_EQ(message_of(r), "stopIds has 9 ids, at most 8 are allowed");
  r = ok_request();
  r.stop_ids = {-1};
  EXPECT_EQ(message_of(r), "stop id -1 at position 0 is outside the vocabulary [0, 1024)");
  r = ok_request();
  r.deadline_s = NAN;
  EXPECT_EQ(message_of(r), "deadlineS must be a finite number >= 0 (0 = server default), got nan");
  EXPECT_EQ(validate_request(r, kLimits).err().code, errc::invalid_argument);
}

}  // namespace
}  // namespace conveyor::frontend
