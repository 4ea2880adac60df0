#include <gtest/gtest.h>

#include <set>

#include "conveyor/engine/kv_cache.hpp"

namespace conveyor::engine {
namespace {

TEST(kv_block_manager, grows_tables_and_frees_blocks) {
  kv_block_manager m(8, 4);
  ASSERT_TRUE(m.reserve(1, 5).ok());
  EXPECT_EQ(m.table(1).size(), 2u);
  ASSERT_TRUE(m.reserve(1, 8).ok());
  EXPECT_EQ(m.table(1).size(), 2u);
  ASSERT_TRUE(m.reserve(2, 17).ok());
  EXPECT_EQ(m.table(2).size(), 5u);
  EXPECT_EQ(m.free_blocks(), 1);
  std::set<int> all(m.table(1).begin(), m.table(1).end());
  all.insert(m.table(2).begin(), m.table(2).end());
  EXPECT_EQ(all.size(), 7u) << "a block was handed out twice";
  m.release(1);
  EXPECT_EQ(m.free_blocks(), 3);
  EXPECT_FALSE(m.has(1));
}

TEST(kv_block_manager, truncate_returns_blocks_past_the_kept_tokens) {
  kv_block_manager m(8, 4);
  ASSERT_TRUE(m.reserve(1, 14).ok());  // 4 blocks
  const auto before = m.table(1);
  m.truncate(1, 9);  // rejected drafts: keep 9 tokens = 3 blocks
  EXPECT_EQ(m.table(1), std::vector<std::int32_t>(before.begin(), before.begin() + 3));
  EXPECT_EQ(m.free_blocks(), 5);
  m.truncate(1, 12);  // a block boundary: still 3
  EXPECT_EQ(m.table(1).size(), 3u);
  m.truncate(7, 1);  // unknown sequence: nothing
  EXPECT_EQ(m.free_blocks(), 5);
  ASSERT_TRUE(m.reserve(1, 14).ok());
  EXPECT_EQ(m.table(1).size(), 4u);
}

TEST(kv_block_manager, running_out_is_an_error_and_changes_nothing) {
  kv_block_manager m(2, 4);
  ASSERT_TRUE(m.reserve(1, 4).ok());
  auto st = m.reserve(2, 9);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.err().code, errc::out_of_memory);
  EXPECT_FALSE(m.has(2));
  EXPECT_EQ(m.free_blocks(), 1);
}

}  // namespace
}  // namespace conveyor::engine
