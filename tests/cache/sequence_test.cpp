#include "cache/sequence.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <random>

namespace offgraph::cache {
namespace {

using testing::make_layout;
using testing::runs;
using testing::step;

// CACHE_CONTRACT.md §4 ring example: w = 4, m = w = 4, R = 7.
TEST(SequencePlan, ContractRingExample) {
  Sequence s(make_layout({4}, 100, 4));
  auto p = s.plan(0, 0, 4);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->write, runs({{0, 4}}));
  EXPECT_EQ(p->read, runs({{0, 4}}));
  EXPECT_EQ(p->read_base_pos, 0);
  ASSERT_TRUE(s.commit(*p).ok());
  step(s, 1); // 4
  step(s, 1); // 5
  step(s, 1); // 6
  p = s.plan(0, 7, 1);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->write, runs({{0, 1}}));
  EXPECT_EQ(p->read, runs({{4, 3}, {0, 1}}));
  EXPECT_EQ(p->read_base_pos, 4);
  auto refused = s.plan(0, 7, 5);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("max_write 4"), std::string::npos) << refused.message();
}

TEST(SequencePlan, FlatReadsEverythingFromZero) {
  Sequence s(make_layout({0}, 100, 8));
  step(s, 8);
  auto p = s.plan(0, 8, 3);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->write, runs({{8, 3}}));
  EXPECT_EQ(p->read, runs({{0, 11}}));
  EXPECT_EQ(p->read_base_pos, 0);
}

TEST(SequencePlan, WrapSplitsBothWritesAndReadsInTwo) {
  Sequence s(make_layout({4}, 100, 3)); // R = 6
  step(s, 3);
  step(s, 2); // length 5
  auto p = s.plan(0, 5, 3);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->write, runs({{5, 1}, {0, 2}}));
  // Reads positions 2..7: slots 2..5 then 0..1.
  EXPECT_EQ(p->read, runs({{2, 4}, {0, 2}}));
  EXPECT_EQ(p->read_base_pos, 2);
}

TEST(SequencePlan, StepThatExactlyFillsTheRing) {
  Sequence s(make_layout({4}, 100, 3)); // R = 6
  step(s, 3);
  auto p = s.plan(0, 3, 3); // positions 3..5 fill slots 3..5; the ring is then full
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->write, runs({{3, 3}}));
  EXPECT_EQ(p->read, runs({{0, 6}}));
  ASSERT_TRUE(s.commit(*p).ok());
  p = s.plan(0, 6, 3); // wraps exactly at the boundary: a single run from slot 0
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->write, runs({{0, 3}}));
  EXPECT_EQ(p->read, runs({{3, 3}, {0, 3}}));
  EXPECT_EQ(p->read_base_pos, 3);
}

TEST(SequencePlan, SharedLayerReplansAreIdenticalAndCommitIsIdempotent) {
  std::vector<LayerSpec> layers = {testing::layer(4), testing::layer(0), testing::layer(4),
                                   testing::layer(0)};
  auto g = Geometry::build(layers, 2);
  ASSERT_TRUE(g.ok());
  auto l = Layout::make(std::move(g).value(), Policy{64, 4, 16});
  ASSERT_TRUE(l.ok());
  Sequence s(*l);
  step(s, 4);
  step(s, 3);
  const Geometry &geo = s.layout().geometry();
  for (int layer = 0; layer < geo.n_layers(); ++layer) {
    auto first = s.plan(geo.cache_of_layer(layer), 7, 2);
    auto again = s.plan(geo.cache_of_layer(layer), 7, 2);
    ASSERT_TRUE(first.ok() && again.ok());
    EXPECT_EQ(first->write, again->write);
    EXPECT_EQ(first->read, again->read);
    EXPECT_EQ(first->read_base_pos, again->read_base_pos);
  }
  auto donor = s.plan(geo.cache_of_layer(2), 7, 2);
  auto shared = s.plan(geo.cache_of_layer(2), 7, 2);
  ASSERT_TRUE(s.commit(*donor).ok());
  ASSERT_TRUE(s.commit(*shared).ok()); // the shared layer's repeat commits nothing new
  ASSERT_TRUE(s.commit(*donor).ok());
  EXPECT_EQ(s.length(), 9);
  EXPECT_EQ(s.high_water(), 9);
}

TEST(SequencePlan, PositionsMustContinueTheSequence) {
  Sequence s(make_layout({0, 4}, 100, 4));
  step(s, 4);
  for (int32_t pos : {0, 3, 5, 100}) {
    auto p = s.plan(0, pos, 1);
    ASSERT_FALSE(p.ok()) << pos;
    EXPECT_NE(p.message().find("length is 4"), std::string::npos) << p.message();
  }
}

TEST(SequencePlan, RefusesBadCacheEmptyStepAndCapacityOverflow) {
  Sequence s(make_layout({0}, 6, 4));
  EXPECT_FALSE(s.plan(1, 0, 1).ok());
  EXPECT_FALSE(s.plan(-1, 0, 1).ok());
  EXPECT_FALSE(s.plan(0, 0, 0).ok());
  step(s, 4);
  EXPECT_TRUE(s.can_extend(2));
  EXPECT_FALSE(s.can_extend(3));
  auto p = s.plan(0, 4, 3);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.message().find("capacity of 6"), std::string::npos) << p.message();
  EXPECT_TRUE(s.plan(0, 4, 2).ok());
}

TEST(SequencePlan, StaleCommitIsRefused) {
  Sequence s(make_layout({4}, 100, 4));
  step(s, 4);
  auto p = s.plan(0, 4, 2);
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(s.rewind(2).ok());
  EXPECT_FALSE(s.commit(*p).ok()); // planned before the rewind
  EXPECT_EQ(s.length(), 2);
  auto q = s.plan(0, 2, 2);
  ASSERT_TRUE(q.ok());
  ASSERT_TRUE(s.commit(*q).ok());
  ASSERT_TRUE(s.rewind(3).ok());
  EXPECT_FALSE(s.commit(*q).ok()); // a repeat only counts while it is the latest step
}

TEST(SequenceRewind, FlatRewindsAnywhere) {
  Sequence s(make_layout({0}, 100, 8));
  for (int i = 0; i < 6; ++i) step(s, 8);
  EXPECT_EQ(s.rewind_floor(), 0);
  ASSERT_TRUE(s.rewind(1).ok());
  EXPECT_EQ(s.length(), 1);
  EXPECT_FALSE(s.rewind(2).ok()); // cannot grow
  EXPECT_FALSE(s.rewind(-1).ok());
}

// CACHE_CONTRACT.md §5 example 1: w = 4, positions 0..20 written (hw = 21).
TEST(SequenceRewind, HighWaterFloorDependsOnMaxWrite) {
  struct Case {
    int32_t max_write, floor;
  } cases[] = {{1, 20}, {3, 18}, {5, 16}};
  for (const Case &c : cases) {
    Sequence s(make_layout({4}, 100, c.max_write));
    while (s.length() < 21) step(s, 1);
    EXPECT_EQ(s.rewind_floor(), c.floor) << "m=" << c.max_write;
    Status below = s.rewind(c.floor - 1);
    ASSERT_FALSE(below.ok()) << "m=" << c.max_write;
    EXPECT_NE(below.message().find("lowest reachable length is " + std::to_string(c.floor)),
              std::string::npos)
        << below.message();
    EXPECT_EQ(s.length(), 21); // a refusal changes nothing
    EXPECT_TRUE(s.rewind(c.floor).ok()) << "m=" << c.max_write;
  }
}

// CACHE_CONTRACT.md §5 example 2: a rewind never lowers the high-water mark.
TEST(SequenceRewind, HighWaterNeverDrops) {
  Sequence s(make_layout({4}, 100, 2)); // R = 5
  while (s.length() < 10) step(s, 1);
  ASSERT_TRUE(s.rewind(8).ok());
  step(s, 1);
  EXPECT_EQ(s.high_water(), 10);
  EXPECT_FALSE(s.rewind(6).ok());
  EXPECT_TRUE(s.rewind(8).ok());
}

// The older rule floor = length - w is unsafe when m < w: here it would allow 17.
TEST(SequenceRewind, OldLengthMinusWindowRuleWouldBeUnsafe) {
  Sequence s(make_layout({4}, 100, 1)); // R = 4
  while (s.length() < 21) step(s, 1);
  EXPECT_FALSE(s.rewind(17).ok());
}

TEST(SequenceRewind, RingNotYetWrappedRewindsAnywhere) {
  Sequence s(make_layout({4}, 100, 4)); // R = 7
  step(s, 4);
  step(s, 3); // hw = 7 = R: nothing overwritten
  EXPECT_EQ(s.rewind_floor(), 0);
  EXPECT_TRUE(s.rewind(1).ok());
}

TEST(SequenceRewind, RewindToZeroIsAClearAndAlwaysAllowed) {
  Sequence s(make_layout({4}, 100, 2));
  while (s.length() < 30) step(s, 2);
  EXPECT_FALSE(s.rewind(1).ok());
  ASSERT_TRUE(s.rewind(0).ok());
  EXPECT_EQ(s.length(), 0);
  EXPECT_EQ(s.high_water(), 0);
  step(s, 2);
  EXPECT_TRUE(s.rewind(1).ok());
}

TEST(SequenceRewind, MixedCacheTakesTheStrictestLayer) {
  Sequence s(make_layout({0, 8, 3}, 100, 2)); // rings of 9 and 4 rows
  while (s.length() < 7) step(s, 1);
  // hw = 7: the window-3 ring (R = 4) wrapped, the window-8 ring (R = 9) did not.
  EXPECT_EQ(s.rewind_floor(), 5);
  Status st = s.rewind(4);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("cache 2"), std::string::npos) << st.message();
}

TEST(SequenceRingSlots, SlotPositionsFollowTheHighWaterMark) {
  // CACHE_CONTRACT.md §4 alternative addressing: w = 4, m = 4, R = 7, positions 0..9 written.
  const int32_t expected[] = {7, 8, 9, 3, 4, 5, 6};
  for (int32_t slot = 0; slot < 7; ++slot)
    EXPECT_EQ(ring_slot_position(7, 10, slot), expected[slot]);
  EXPECT_EQ(ring_slot_position(7, 3, 2), 2);
  EXPECT_EQ(ring_slot_position(7, 3, 3), -1);
}

} // namespace
} // namespace offgraph::cache

namespace offgraph::cache {
namespace {

// Speculative decoding's rule against the high-water rule it derives from: after a verify span of
// 1 + k tokens (k <= max_draft_tokens()), a rewind to any length that keeps the span's first token
// is accepted; one more drafted token would make the span too long or some such rewind refused.
// Random walks over ring and mixed layouts, with ordinary rewinds in between (which leave the
// high-water mark above the length).
TEST(SequenceRewind, MaxDraftTokensIsTheLongestSpanEveryRejectionCanRewind) {
  std::mt19937 rng(17);
  auto uniform = [&](int32_t lo, int32_t hi) {
    return std::uniform_int_distribution<int32_t>(lo, hi)(rng);
  };
  int64_t checked = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const int32_t window = uniform(1, 12), m = uniform(1, 10), capacity = uniform(20, 80);
    const bool mixed = trial % 2 == 1;
    Sequence s(make_layout(mixed ? std::vector<int32_t>{window, 0} : std::vector<int32_t>{window},
                           capacity, m));
    while (s.length() < capacity - 1) {
      const int32_t k = s.max_draft_tokens();
      ASSERT_GE(k, 0);
      ASSERT_LE(k, m - 1);
      // Maximal: one more drafted token is refused by the plan or by some rewind.
      if (s.length() + k + 2 <= capacity) {
        Sequence more = s;
        bool refused = !more.plan(0, more.length(), k + 2).ok();
        if (!refused) {
          testing::step(more, k + 2);
          for (int32_t to = s.length() + 1; to <= s.length() + k + 2 && !refused; ++to) {
            Sequence back = more;
            refused = !back.rewind(to).ok();
          }
        }
        EXPECT_TRUE(refused) << "k " << k << " is not the most: window " << window << ", m " << m
                             << ", length " << s.length() << ", hw " << s.high_water();
      }
      const int32_t drafted = uniform(0, k), length = s.length();
      testing::step(s, 1 + drafted);
      for (int32_t to = length + 1; to <= length + 1 + drafted; ++to) {
        Sequence back = s;
        ASSERT_TRUE(back.rewind(to).ok()) << "window " << window << ", m " << m << ", k " << k;
        ++checked;
      }
      ASSERT_TRUE(s.rewind(length + 1 + uniform(0, drafted)).ok());
      if (uniform(0, 5) == 0) {
        ASSERT_TRUE(s.rewind(uniform(std::max(1, s.rewind_floor()), s.length())).ok());
      }
    }
  }
  EXPECT_GT(checked, 10000);
}

} // namespace
} // namespace offgraph::cache
