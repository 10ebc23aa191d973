#include "cache/layout.h"
#include "test_util.h"

#include <gtest/gtest.h>

namespace offgraph::cache {
namespace {

using testing::layer;
using testing::make_layout;

Geometry geometry(std::vector<int32_t> windows) {
  std::vector<LayerSpec> layers;
  for (int32_t w : windows) layers.push_back(layer(w));
  return Geometry::build(layers, 0).value();
}

TEST(Layout, RingHoldsTheWindowPlusItsReach) {
  auto l = make_layout({2048, 0}, 131072, 512);
  EXPECT_TRUE(l->cache(0).ring());
  // The default reach of 32, not room for a whole step of 512 (docs/architecture.md).
  EXPECT_EQ(l->cache(0).max_rows, 2048 + 32);
  EXPECT_EQ(l->ring_lead(), 33);
  // A reach of max_write - 1 or more gives CACHE_CONTRACT.md §11's w + m - 1.
  auto g = Geometry::build(std::vector<LayerSpec>{testing::layer(2048)});
  auto wide = Layout::make(*g, Policy{131072, 512, 64, 600});
  ASSERT_TRUE(wide.ok()) << wide.message();
  EXPECT_EQ((*wide)->cache(0).max_rows, 2559);
  EXPECT_EQ((*wide)->ring_lead(), 512);
  // No reach: the window alone (a decode step writes its row, then attends it).
  auto none = Layout::make(*g, Policy{131072, 512, 64, 0});
  ASSERT_TRUE(none.ok()) << none.message();
  EXPECT_EQ((*none)->cache(0).max_rows, 2048);
  EXPECT_FALSE(Layout::make(*g, Policy{131072, 512, 64, -1}).ok());
  EXPECT_FALSE(l->cache(1).ring());
  EXPECT_EQ(l->cache(1).max_rows, 131072);
  EXPECT_EQ(l->page_rows(), 64); // the default page
}

TEST(Layout, RingThatCouldNeverWrapIsStoredFlat) {
  // w + m - 1 = 10 >= capacity 10: a ring would never wrap, so grow lazily instead.
  auto l = make_layout({6, 5}, 10, 5);
  EXPECT_FALSE(l->cache(0).ring());
  EXPECT_EQ(l->cache(0).max_rows, 10);
  EXPECT_EQ(l->cache(0).window(), 6);
  // w + m - 1 = 9 < 10: a ring.
  EXPECT_TRUE(l->cache(1).ring());
  EXPECT_EQ(l->cache(1).max_rows, 9);
}

TEST(Layout, PolicyValidationNamesTheProblem) {
  struct Case {
    Policy policy;
    const char *mentions;
  } cases[] = {
      {{0, 1, 1}, "capacity 0"},
      {{-5, 1, 1}, "capacity -5"},
      {{16, 0, 1}, "max_write 0"},
      {{16, -2, 1}, "max_write -2"},
      {{16, 17, 1}, "exceeds the capacity"},
      {{16, 4, 0}, "page_rows 0"},
      {{16, 4, -1}, "page_rows -1"},
      {{(1 << 29) + 1, 4, 1}, "supported maximum"},
  };
  for (const Case &c : cases) {
    auto l = Layout::make(geometry({4, 0}), c.policy);
    ASSERT_FALSE(l.ok()) << c.mentions;
    EXPECT_NE(l.message().find(c.mentions), std::string::npos) << l.message();
  }
}

TEST(Layout, PageRowsClampToCapacity) {
  EXPECT_EQ(make_layout({0}, 100, 4, 512)->page_rows(), 100);
  EXPECT_EQ(make_layout({0}, 100, 4, 7)->page_rows(), 7);
  EXPECT_EQ(make_layout({0}, 100, 4, 1)->page_rows(), 1);
}

TEST(Layout, RowsRequiredAndTheoreticalMinimum) {
  auto l = make_layout({4, 0}, 100, 3); // ring R = 6
  EXPECT_EQ(l->rows_required(0, 50), 6);
  EXPECT_EQ(l->rows_required(1, 50), 50);
  EXPECT_EQ(l->min_rows(0, 2), 2);
  EXPECT_EQ(l->min_rows(0, 50), 4); // the window
  EXPECT_EQ(l->min_rows(1, 50), 50);
}

} // namespace
} // namespace offgraph::cache
