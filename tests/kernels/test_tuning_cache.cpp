// The CUDA backend's GEMM tuning cache file (kernels/cuda/tuning_cache.hpp): what one process
// timed, the next reads back exactly; other devices' lines and damaged lines are skipped, not fatal;
// merging keeps what is already there.
#include "../../kernels/cuda/tuning_cache.hpp"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#ifdef CONVEYOR_HAVE_CUDA
#include "conveyor/kernels/cuda_backend.hpp"
#endif

namespace conveyor::kernels::cuda {
namespace {

tuned_gemm plain(int rows, int cols, int bucket, bool use_lt, std::uint64_t word) {
  tuned_gemm e;
  e.shape = {rows, cols, bucket, 0};
  e.use_lt = use_lt;
  e.ms = 0.0123f;
  e.ms_default = 0.0145f;
  e.algo = {word, 0, ~0ull, 7, 0, 0, 1ull << 63, 42};
  return e;
}

tuned_gemm split(int rows, int cols, int bucket, int margin, int splits) {
  tuned_gemm e;
  e.kind = tuned_gemm::kind_t::split;
  e.shape = {rows, cols, bucket, margin};
  e.splits = splits;
  e.algo = {1, 2, 3, 4, 5, 6, 7, 0xdeadbeefcafef00dull};
  return e;
}

bool same(const tuned_gemm& a, const tuned_gemm& b) {
  return a.kind == b.kind && a.shape == b.shape && a.use_lt == b.use_lt && a.splits == b.splits && a.algo == b.algo &&
         a.ms == b.ms && a.ms_default == b.ms_default;
}

std::string temp_dir() {
  const auto d = std::filesystem::temp_directory_path() / ("conveyor-tuning-" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  return d.string();
}

TEST(tuning_cache, entries_read_back_exactly_and_other_devices_are_skipped) {
  const std::vector<tuned_gemm> mine = {plain(2048, 8192, 64, true, 0x1234), plain(3072, 2048, 128, false, 0),
                                        split(2048, 8192, 128, 1001, 4), split(2048, 2048, 64, 1001, 0)};
  std::string text = "# a comment\n\n";
  for (const auto& e : mine) text += format_tuned_gemm(e, "H100_sm90_lt130200") + "\n";
  text += format_tuned_gemm(plain(1, 2, 4, true, 9), "H200_sm90_lt130200") + "\n";  // another GPU
  const auto got = parse_tuning_cache(text, "H100_sm90_lt130200", "f");
  EXPECT_TRUE(got.warnings.empty()) << got.warnings.front();
  ASSERT_EQ(got.entries.size(), mine.size());
  for (std::size_t i = 0; i < mine.size(); ++i) EXPECT_TRUE(same(got.entries[i], mine[i])) << i;
  EXPECT_EQ(parse_tuning_cache(text, "H200_sm90_lt130200", "f").entries.size(), 1u);
}

TEST(tuning_cache, damaged_lines_are_named_and_skipped) {
  const std::string good = format_tuned_gemm(plain(2048, 8192, 64, true, 5), "dev");
  const std::string text = good + "\n" + "dev plain 2048 8192\n" + "dev plain 0 8192 64 0 1 0.1 0.1 1 2 3 4 5 6 7 8\n" +
                           "dev split 1 2 4 5 -1 1 2 3 4 5 6 7 8\n" + "dev plain 1 2 4 0 2 0.1 0.1 1 2 3 4 5 6 7 8\n" +
                           good + " extra\n" + "garbage\n";
  const auto got = parse_tuning_cache(text, "dev", "cache.txt");
  ASSERT_EQ(got.entries.size(), 1u);
  ASSERT_EQ(got.warnings.size(), 6u);
  EXPECT_NE(got.warnings[0].find("cache.txt line 2"), std::string::npos) << got.warnings[0];
  EXPECT_NE(got.warnings[5].find("line 7"), std::string::npos) << got.warnings[5];
}

TEST(tuning_cache, merging_keeps_what_is_there_and_adds_new_shapes) {
  const std::string dir = temp_dir();
  const std::string path = dir + "/sub/gemm-tuning.txt";
  auto missing = read_tuning_cache(path, "dev");
  ASSERT_TRUE(missing.ok());
  EXPECT_TRUE(missing->entries.empty());

  ASSERT_TRUE(merge_tuning_cache(path, "dev", {plain(8, 8, 1, true, 1)}).ok());  // creates the directory
  ASSERT_TRUE(merge_tuning_cache(path, "other", {plain(8, 8, 1, true, 9)}).ok());
  // A second process timed the same shape differently: the first choice stays; its new shape is added.
  ASSERT_TRUE(merge_tuning_cache(path, "dev", {plain(8, 8, 1, false, 2), split(8, 8, 1, 500, 2)}).ok());
  auto got = read_tuning_cache(path, "dev");
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->entries.size(), 2u);
  EXPECT_TRUE(same(got->entries[0], plain(8, 8, 1, true, 1)));
  EXPECT_TRUE(same(got->entries[1], split(8, 8, 1, 500, 2)));
  EXPECT_EQ(read_tuning_cache(path, "other")->entries.size(), 1u);
  EXPECT_TRUE(std::filesystem::exists(path + ".lock"));

  // A directory where the file should be: an error naming the path, not a crash.
  const std::string blocked = dir + "/blocked";
  std::filesystem::create_directories(blocked + "/gemm-tuning.txt");
  const auto st = merge_tuning_cache(blocked + "/gemm-tuning.txt", "dev", {plain(8, 8, 1, true, 1)});
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.err().message.find(blocked), std::string::npos) << st.err().message;
  std::filesystem::remove_all(dir);
}

#ifdef CONVEYOR_HAVE_CUDA
// Where servers keep the file: CONVEYOR_CACHE_DIR, else the XDG cache, else ~/.cache; "off": none.
TEST(tuning_cache, the_default_path_follows_the_cache_directories) {
  auto set = [](const char* name, const char* v) { v == nullptr ? ::unsetenv(name) : ::setenv(name, v, 1); };
  const char* keep[] = {"CONVEYOR_CACHE_DIR", "XDG_CACHE_HOME", "HOME"};
  std::vector<std::string> saved;
  std::vector<bool> had;
  for (const char* k : keep) {
    had.push_back(std::getenv(k) != nullptr);
    saved.push_back(had.back() ? std::getenv(k) : "");
  }
  set("CONVEYOR_CACHE_DIR", "/c");
  set("XDG_CACHE_HOME", "/x");
  set("HOME", "/h");
  EXPECT_EQ(kernels::default_gemm_tuning_cache(), "/c/gemm-tuning.txt");
  set("CONVEYOR_CACHE_DIR", nullptr);
  EXPECT_EQ(kernels::default_gemm_tuning_cache(), "/x/conveyor/gemm-tuning.txt");
  set("XDG_CACHE_HOME", nullptr);
  EXPECT_EQ(kernels::default_gemm_tuning_cache(), "/h/.cache/conveyor/gemm-tuning.txt");
  set("CONVEYOR_CACHE_DIR", "off");
  EXPECT_EQ(kernels::default_gemm_tuning_cache(), "");
  set("CONVEYOR_CACHE_DIR", nullptr);
  set("HOME", nullptr);
  EXPECT_EQ(kernels::default_gemm_tuning_cache(), "");
  for (std::size_t i = 0; i < 3; ++i) set(keep[i], had[i] ? saved[i].c_str() : nullptr);
}
#endif

}  // namespace
}  // namespace conveyor::kernels::cuda
