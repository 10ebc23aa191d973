// PageAllocator and PageTable against a naive model: tables as plain lists of page ids, with the
// reference counts recounted from every table after each of 100,000 random operations (append,
// share a prefix, copy on write, trim, drop), under a small pool so that exhaustion happens often.
#include "cache/pages.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

namespace offgraph::cache {
namespace {

TEST(Pages, PoolRowsFollowTheTable) {
  PageTable t{{5, 2, 9}};
  EXPECT_EQ(PageTable::pages_for(0, 4), 0);
  EXPECT_EQ(PageTable::pages_for(1, 4), 1);
  EXPECT_EQ(PageTable::pages_for(4, 4), 1);
  EXPECT_EQ(PageTable::pages_for(5, 4), 2);
  EXPECT_EQ(t.pool_row(0, 4), 20);
  EXPECT_EQ(t.pool_row(3, 4), 23);
  EXPECT_EQ(t.pool_row(4, 4), 8);
  EXPECT_EQ(t.pool_row(11, 4), 39);
}

TEST(Pages, FreedPagesAreReusedMostRecentFirstAndThePoolIsBounded) {
  PageAllocator a(3);
  const PageId p0 = *a.allocate(), p1 = *a.allocate(), p2 = *a.allocate();
  EXPECT_EQ(std::set<PageId>({p0, p1, p2}).size(), 3u);
  EXPECT_FALSE(a.allocate().has_value());
  a.retain(p1);
  EXPECT_EQ(a.shared(), 1);
  EXPECT_FALSE(a.release(p1)); // still held once
  EXPECT_EQ(a.shared(), 0);
  EXPECT_TRUE(a.release(p0));
  EXPECT_TRUE(a.release(p2));
  EXPECT_EQ(a.in_use(), 1);
  EXPECT_EQ(*a.allocate(), p2); // the most recently freed: its memory is warm
  EXPECT_EQ(*a.allocate(), p0);
  EXPECT_EQ(a.touched(), 3);
}

// Giving free pages' memory back: against a naive model that knows, per page, whether it holds
// memory (from its allocation until take_cold hands it out) and the order pages were freed in.
TEST(Pages, TakeColdHandsOutTheLeastRecentlyFreedPagesThatHoldMemory) {
  std::mt19937_64 rng(37);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  constexpr int32_t kMaxPages = 16;
  PageAllocator pool(kMaxPages);
  std::vector<PageId> held;      // pages in use (one holder each)
  std::vector<PageId> freed;     // the naive free list, least recently freed first
  std::map<PageId, bool> backed; // whether the page holds memory
  int64_t taken = 0;
  for (int op = 0; op < 50000; ++op) {
    switch (uniform(0, 2)) {
    case 0: { // allocate: the most recently freed, which holds memory once written
      auto p = pool.allocate();
      if (!p) break;
      if (!freed.empty()) {
        ASSERT_EQ(*p, freed.back());
        freed.pop_back();
      }
      backed[*p] = true;
      held.push_back(*p);
      break;
    }
    case 1: { // free a random page in use
      if (held.empty()) break;
      const size_t i = size_t(uniform(0, int(held.size()) - 1));
      ASSERT_TRUE(pool.release(held[i]));
      freed.push_back(held[i]);
      held.erase(held.begin() + long(i));
      break;
    }
    case 2: { // give back all but `keep` of the free pages holding memory
      const int32_t keep = uniform(0, 4);
      std::vector<PageId> want;
      int32_t warm = 0;
      for (PageId p : freed) warm += backed[p];
      for (PageId p : freed)
        if (backed[p] && warm - int32_t(want.size()) > keep) want.push_back(p);
      const std::vector<PageId> got = pool.take_cold(keep);
      ASSERT_EQ(got, want);
      for (PageId p : got) backed[p] = false;
      taken += int64_t(got.size());
      break;
    }
    }
    int32_t warm = 0;
    for (PageId p : freed) warm += backed[p];
    ASSERT_EQ(pool.free_warm(), warm) << "op " << op;
  }
  EXPECT_GT(taken, 1000); // the case ran
}

TEST(Pages, RandomSharingMatchesANaiveRecount) {
  std::mt19937_64 rng(2026);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  constexpr int32_t kMaxPages = 12;
  PageAllocator pool(kMaxPages);
  std::vector<PageTable> tables(6);
  // What each page holds in the naive model: the "content" written into it, so that a shared page
  // being written (a copy on write that did not happen) would show as a changed content.
  std::map<PageId, uint64_t> content;
  std::vector<std::vector<uint64_t>> expected(tables.size()); // per table, per page: its content
  uint64_t next_content = 1;
  int64_t exhausted = 0, copies = 0, shares = 0;
  for (int op = 0; op < 100000; ++op) {
    const size_t t = size_t(uniform(0, int(tables.size()) - 1));
    PageTable &table = tables[t];
    // Appends weigh three times the rest, so tables grow until the pool runs out.
    switch (std::max(0, uniform(-2, 4))) {
    case 0: { // append a page
      auto p = pool.allocate();
      if (!p) {
        EXPECT_EQ(pool.in_use(), kMaxPages);
        ++exhausted;
        break;
      }
      ASSERT_EQ(content.count(*p), 0u) << "page " << *p << " handed out twice";
      content[*p] = next_content;
      table.pages.push_back(*p);
      expected[t].push_back(next_content++);
      break;
    }
    case 1: { // another table becomes a prefix of this one (a fork)
      const size_t u = size_t(uniform(0, int(tables.size()) - 1));
      if (u == t) break;
      const size_t n = size_t(uniform(0, int(table.pages.size())));
      for (PageId p : tables[u].pages) pool.release(p);
      tables[u].pages.assign(table.pages.begin(), table.pages.begin() + long(n));
      expected[u].assign(expected[t].begin(), expected[t].begin() + long(n));
      for (PageId p : tables[u].pages) pool.retain(p);
      shares += n > 0;
      break;
    }
    case 2: { // write into page i: copy it first when shared
      if (table.pages.empty()) break;
      const size_t i = size_t(uniform(0, int(table.pages.size()) - 1));
      if (pool.refs(table.pages[i]) > 1) {
        auto copy = pool.allocate();
        if (!copy) {
          ++exhausted;
          break;
        }
        content[*copy] = content[table.pages[i]];
        pool.release(table.pages[i]);
        table.pages[i] = *copy;
        ++copies;
      }
      content[table.pages[i]] = expected[t][i] = next_content++;
      break;
    }
    case 3: { // trim to a shorter length (a rewind)
      const size_t keep = size_t(uniform(0, int(table.pages.size())));
      while (table.pages.size() > keep) {
        pool.release(table.pages.back());
        table.pages.pop_back();
        expected[t].pop_back();
      }
      break;
    }
    case 4: // drop the table (a removed sequence)
      for (PageId p : table.pages) pool.release(p);
      table.pages.clear();
      expected[t].clear();
      break;
    }
    // Recount: every page's references are exactly its table entries; contents are intact.
    std::map<PageId, int32_t> refs;
    for (size_t k = 0; k < tables.size(); ++k)
      for (size_t i = 0; i < tables[k].pages.size(); ++i) {
        ++refs[tables[k].pages[i]];
        ASSERT_EQ(content[tables[k].pages[i]], expected[k][i])
            << "table " << k << " page " << i << " after op " << op;
      }
    int32_t shared = 0;
    for (const auto &[p, n] : refs) {
      ASSERT_EQ(pool.refs(p), n) << "page " << p;
      shared += n > 1;
    }
    ASSERT_EQ(pool.in_use(), int32_t(refs.size()));
    ASSERT_EQ(pool.shared(), shared);
    ASSERT_LE(pool.touched(), kMaxPages);
    std::erase_if(content, [&](const auto &kv) { return refs.count(kv.first) == 0; });
  }
  EXPECT_GT(exhausted, 100);
  EXPECT_GT(copies, 1000);
  EXPECT_GT(shares, 1000);
}

} // namespace
} // namespace offgraph::cache
