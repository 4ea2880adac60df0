// bench/flag_values.hpp: a flag's whole value must be a number in range, or the bench stops with a
// line naming the flag and the value (std::atoi read "2x" as 2 and "abc" as 0).
#include "../../bench/flag_values.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

using conveyor::bench::parse_int_flag;
using conveyor::bench::parse_int_list_flag;
using conveyor::bench::parse_real_flag;

TEST(flag_values, integers_take_the_whole_value) {
  std::string why;
  EXPECT_EQ(parse_int_flag("--n", "64", 1, 100, why), 64);
  EXPECT_TRUE(why.empty());
  for (const char* bad : {"2x", "abc", "", " 5", "5 ", "0x10", "1e2", "101", "0", "99999999999999999999"}) {
    why.clear();
    parse_int_flag("--n", bad, 1, 100, why);
    EXPECT_NE(why.find("--n"), std::string::npos) << bad;
    EXPECT_NE(why.find(std::string("\"") + bad + "\""), std::string::npos) << why;
  }
}

TEST(flag_values, reals_are_finite_and_in_range) {
  std::string why;
  EXPECT_DOUBLE_EQ(parse_real_flag("--rate", "0.5", 1e-6, 1e9, why), 0.5);
  EXPECT_DOUBLE_EQ(parse_real_flag("--rate", "1e3", 1e-6, 1e9, why), 1000.0);
  EXPECT_TRUE(why.empty());
  for (const char* bad : {"abc", "2x", "", "nan", "inf", "-1", "0", "1e999"}) {
    why.clear();
    parse_real_flag("--rate", bad, 1e-6, 1e9, why);
    EXPECT_NE(why.find("--rate: \""), std::string::npos) << bad;
    EXPECT_NE(why.find("[1e-06, 1e+09]"), std::string::npos) << why;
  }
}

TEST(flag_values, lists_stop_at_the_first_bad_item) {
  std::string why;
  EXPECT_EQ(parse_int_list_flag("--batches", "1,8,,64", 1, 4096, why), (std::vector<int>{1, 8, 64}));
  EXPECT_TRUE(why.empty());
  parse_int_list_flag("--batches", "1,x,64", 1, 4096, why);
  EXPECT_NE(why.find("\"x\""), std::string::npos) << why;
}
