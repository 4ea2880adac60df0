// conveyor_bench --timeline's tables (bench/timeline_report.hpp) on hand-made spans: the marginal
// times of overlapping (programmatic dependent) kernels, gaps, graph launches, and the summary.
#include "timeline_report.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

namespace conveyor::bench {
namespace {

gpu_span kernel(const std::string& name, std::uint64_t start, std::uint64_t end, std::uint32_t correlation) {
  gpu_span s;
  s.name = name;
  s.start = start;
  s.end = end;
  s.correlation = correlation;
  return s;
}

// Captures what a print function writes.
template <class F>
std::string printed(F f) {
  char* buf = nullptr;
  std::size_t len = 0;
  std::FILE* out = open_memstream(&buf, &len);
  f(out);
  std::fclose(out);
  std::string s(buf, len);
  std::free(buf);
  return s;
}

TEST(timeline_report, marginals_of_overlapping_kernels_sum_to_the_span) {
  // b starts under a (PDL) and ends 3 after it; c starts under b and ends before it (adds nothing);
  // d starts after a gap of 2.
  const std::vector<gpu_span> spans = {kernel("d", 20, 25, 7), kernel("a", 0, 10, 7), kernel("b", 4, 13, 7),
                                       kernel("c", 11, 12, 7), kernel("other", 1, 100, 8)};
  const auto rows = launch_rows(spans, 7);
  ASSERT_EQ(rows.size(), 4u);
  std::vector<std::string> names;
  for (const auto& r : rows) names.push_back(r.span->name);
  EXPECT_EQ(names, (std::vector<std::string>{"a", "b", "c", "d"}));  // by start
  EXPECT_EQ(rows[0].marginal, 10u);
  EXPECT_EQ(rows[1].marginal, 3u);
  EXPECT_EQ(rows[2].marginal, 0u);
  EXPECT_EQ(rows[3].marginal, 12u);  // the gap (13 -> 20) counts against the late kernel
  EXPECT_EQ(rows[3].gap, 7u);
  std::uint64_t sum = 0;
  for (const auto& r : rows) sum += r.marginal;
  EXPECT_EQ(sum, 25u);  // first start to last end
  EXPECT_TRUE(launch_rows(spans, 99).empty());
}

TEST(timeline_report, graph_launches_are_the_calls_with_many_kernels_oldest_first) {
  std::vector<gpu_span> spans;
  for (int i = 0; i < 10; ++i) spans.push_back(kernel("k", 1000 + i, 1001 + i, 5));  // launched second
  for (int i = 0; i < 10; ++i) spans.push_back(kernel("k", 10 + i, 11 + i, 9));      // launched first
  spans.push_back(kernel("argmax", 30, 31, 6));                                    // one kernel: no graph
  gpu_span copy = kernel("memcpy DtoH", 32, 33, 4);
  copy.kind = gpu_span::span_kind::memcpy;
  for (int i = 0; i < 12; ++i) spans.push_back(copy);  // copies do not make a launch
  EXPECT_EQ(graph_launches(spans, 8), (std::vector<std::uint32_t>{9, 5}));
  EXPECT_EQ(graph_launches(spans, 10), (std::vector<std::uint32_t>{}));
}

TEST(timeline_report, summary_sums_marginals_per_name_and_shows_what_ran_between_launches) {
  std::vector<gpu_span> spans;
  for (std::uint32_t c : {1u, 2u}) {
    const std::uint64_t t0 = c == 1 ? 0 : 100000;
    spans.push_back(kernel("gemv", t0, t0 + 10000, c));
    spans.push_back(kernel("attention", t0 + 5000, t0 + 14000, c));
  }
  spans.push_back(kernel("argmax", 20000, 25000, 3));
  const std::string out = printed([&](std::FILE* f) { print_summary(f, "x", spans, {1, 2}); });
  EXPECT_NE(out.find("2 graph launches, mean span 14.0 us"), std::string::npos) << out;
  EXPECT_NE(out.find("gemv"), std::string::npos);
  // attention's marginal is 4 us a launch (14 - 10), gemv's 10.
  EXPECT_NE(out.find("attention                                                   1.0      9.00      4.00      4.00"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("between launches 0 and 1: 86.0 us, busy 5.0: argmax@6.0+5.0"), std::string::npos) << out;
  const std::string none = printed([&](std::FILE* f) { print_summary(f, "y", spans, {}); });
  EXPECT_NE(none.find("no graph launch recorded"), std::string::npos);
  const std::string one = printed([&](std::FILE* f) { print_launch(f, "z", spans, 2); });
  EXPECT_NE(one.find("one graph launch, 2 spans, 14.0 us"), std::string::npos) << one;
}

TEST(timeline_report, gaps_between_launches_count_idle_time_apart_from_other_work) {
  // Three launches of 10 us, started at 0, 30 and 50 us. In the first gap (10..30) two overlapping
  // copies cover 12..16 and 14..20 (union 8 us: 12 idle); the second gap (40..50) has a copy
  // reaching from inside launch 2 (38..44: 4 us of it in the gap) and one after the next launch began.
  std::vector<gpu_span> spans;
  for (std::uint32_t c : {1u, 2u, 3u}) {
    const std::uint64_t t0 = c == 1 ? 0 : c == 2 ? 30000 : 50000;
    spans.push_back(kernel("k", t0, t0 + 6000, c));
    spans.push_back(kernel("k", t0 + 4000, t0 + 10000, c));
  }
  spans.push_back(kernel("copy", 12000, 16000, 9));
  spans.push_back(kernel("copy", 14000, 20000, 10));
  spans.push_back(kernel("copy", 38000, 44000, 11));
  spans.push_back(kernel("copy", 55000, 56000, 12));
  const launch_gaps g = gaps_between(spans, {3, 1, 2});
  EXPECT_EQ(g.launches, 3u);
  EXPECT_DOUBLE_EQ(g.span.mean_us, 10.0);
  EXPECT_DOUBLE_EQ(g.period.mean_us, 25.0);  // 30 and 20
  EXPECT_DOUBLE_EQ(g.period.max_us, 30.0);
  EXPECT_DOUBLE_EQ(g.busy_between.mean_us, 6.0);  // 8 and 4
  EXPECT_DOUBLE_EQ(g.idle.mean_us, 9.0);          // 12 and 6
  EXPECT_DOUBLE_EQ(g.idle.max_us, 12.0);
  const std::string out = printed([&](std::FILE* f) { print_gaps(f, "served", g); });
  EXPECT_NE(out.find("timeline served: 3 graph launches"), std::string::npos) << out;
  EXPECT_NE(out.find("device idle between launches             9.0"), std::string::npos) << out;
  const launch_gaps none = gaps_between(spans, {});
  EXPECT_EQ(none.launches, 0u);
  EXPECT_DOUBLE_EQ(none.idle.mean_us, 0.0);
}

}  // namespace
}  // namespace conveyor::bench
