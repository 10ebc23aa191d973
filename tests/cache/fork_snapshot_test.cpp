#include "cache/sequence.h"
#include "test_util.h"

#include <gtest/gtest.h>

namespace offgraph::cache {
namespace {

using testing::make_layout;
using testing::runs;
using testing::step;

TEST(Fork, FlatCopiesThePrefixAtAnyLength) {
  Sequence s(make_layout({0}, 100, 4));
  for (int i = 0; i < 10; ++i) step(s, 4);
  for (int32_t n : {1, 17, 40}) {
    auto f = s.plan_fork(n);
    ASSERT_TRUE(f.ok()) << n;
    ASSERT_EQ(f->copies.size(), 1u);
    EXPECT_EQ(f->copies[0].rows, runs({{0, n}}));
    Sequence child = s.forked(*f);
    EXPECT_EQ(child.length(), n);
    EXPECT_NE(child.uid(), s.uid());
    EXPECT_EQ(child.rewind_floor(), 0);
  }
  EXPECT_FALSE(s.plan_fork(41).ok());
  EXPECT_FALSE(s.plan_fork(-1).ok());
}

TEST(Fork, RingCopiesOnlyTheWindowBeforeTheForkPoint) {
  Sequence s(make_layout({0, 4}, 100, 2)); // ring R = 5
  while (s.length() < 12) step(s, 1);
  auto f = s.plan_fork(11); // floor is hw - m = 10
  ASSERT_TRUE(f.ok()) << f.message();
  ASSERT_EQ(f->copies.size(), 2u);
  EXPECT_EQ(f->copies[0].cache, 0);
  EXPECT_EQ(f->copies[0].rows, runs({{0, 11}}));
  EXPECT_EQ(f->copies[1].cache, 1);
  // Positions 8, 9, 10 live in slots 3, 4, 0.
  EXPECT_EQ(f->copies[1].rows, runs({{3, 2}, {0, 1}}));
  Sequence child = s.forked(*f);
  EXPECT_EQ(child.length(), 11);
  EXPECT_EQ(child.rewind_floor(), 11); // nothing older was copied
  EXPECT_FALSE(child.rewind(10).ok());
  auto p = child.plan(1, 11, 2);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->read, runs({{3, 2}, {0, 3}})); // positions 8..12
}

TEST(Fork, RingRefusesWhenTheWindowIsGone) {
  Sequence s(make_layout({4}, 100, 2));
  while (s.length() < 12) step(s, 1);
  auto f = s.plan_fork(9);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.message().find("lengths >= 10"), std::string::npos) << f.message();
  EXPECT_TRUE(s.plan_fork(0).ok()); // an empty child needs nothing
}

TEST(Snapshot, RestoreReturnsToAPromptBoundaryAfterTheRingWrapped) {
  Sequence s(make_layout({0, 4}, 100, 2)); // ring R = 5
  while (s.length() < 9) step(s, 1);
  RingSnapshot snap = s.describe_snapshot(); // end of the prompt at 9
  EXPECT_EQ(snap.length, 9);
  ASSERT_EQ(snap.rows.size(), 1u); // only the ring needs saving
  EXPECT_EQ(snap.rows[0].cache, 1);
  EXPECT_EQ(snap.rows[0].rows, runs({{1, 3}})); // positions 6, 7, 8
  EXPECT_EQ(snap.total_rows(), 3);
  while (s.length() < 20) step(s, 1); // generation overwrites the ring
  ASSERT_FALSE(s.rewind(9).ok());
  ASSERT_TRUE(s.restore(snap).ok());
  EXPECT_EQ(s.length(), 9);
  EXPECT_EQ(s.rewind_floor(), 9);
  EXPECT_EQ(s.high_water(), 11);
  auto p = s.plan(1, 9, 2);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->read_base_pos, 6);
  EXPECT_EQ(p->read, runs({{1, 4}, {0, 1}})); // positions 6..10
}

TEST(Snapshot, AReachRestoresTheLengthsBeforeIt) {
  Sequence s(make_layout({0, 4}, 100, 2)); // ring R = 5: at hw 9 it holds positions 4..8
  while (s.length() < 9) step(s, 1);
  RingSnapshot snap = s.describe_snapshot(5);
  EXPECT_EQ(snap.reach, 2); // cut to what the ring holds: 9 + max_write - hw
  ASSERT_EQ(snap.rows.size(), 1u);
  EXPECT_EQ(snap.rows[0].rows, runs({{4, 1}, {0, 4}})); // positions 4..8
  while (s.length() < 20) step(s, 1);
  Status far = s.restore(snap, 6);
  ASSERT_FALSE(far.ok());
  EXPECT_NE(far.message().find("reaches back only to 7"), std::string::npos) << far.message();
  ASSERT_TRUE(s.restore(snap, 7).ok());
  EXPECT_EQ(s.length(), 7);
  EXPECT_EQ(s.rewind_floor(), 7);
  EXPECT_EQ(s.high_water(), 9); // positions 7, 8 restored too, labelled as the future: masked
  auto p = s.plan(1, 7, 2);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->read_base_pos, 4);
  EXPECT_EQ(p->read, runs({{4, 1}, {0, 4}})); // positions 4..8
  // Right after the restore the ring holds no position past the window before 7: no reach; one
  // step later, one.
  EXPECT_EQ(s.describe_snapshot(5).reach, 0);
  step(s, 1);
  EXPECT_EQ(s.describe_snapshot(5).reach, 1);
  // The restore at 7 truncated below 8 and 9, which were rewritten since: a restore there is
  // stale, one at 7 is not.
  step(s, 1);
  Status stale = s.restore(snap, 9);
  ASSERT_FALSE(stale.ok());
  EXPECT_NE(stale.message().find("rewound to 7"), std::string::npos) << stale.message();
  EXPECT_TRUE(s.restore(snap, 7).ok());
}

TEST(Snapshot, AReachIsCutOnlyByRingsThatWrapped) {
  // Windows 1 and 4 with max_write 2: rings of 2 and 5 slots. At length 3 neither the window-4
  // ring (hw 3 <= 5) has wrapped nor does the window-1 ring need any row to resume (it reads
  // only a step's own rows), though it wrapped: the reach is the whole length, saved for the
  // window-4 ring alone.
  Sequence s(make_layout({0, 1, 4}, 100, 2));
  while (s.length() < 3) step(s, 1);
  RingSnapshot snap = s.describe_snapshot(5);
  EXPECT_EQ(snap.reach, 3);
  ASSERT_EQ(snap.rows.size(), 1u);
  EXPECT_EQ(snap.rows[0].cache, 2);
  EXPECT_EQ(snap.rows[0].rows, runs({{0, 3}})); // positions 0..2
  while (s.length() < 8) step(s, 1);            // now the window-4 ring has wrapped: hw 8 > 5
  EXPECT_EQ(s.describe_snapshot(5).reach, 2);   // 8 + max_write - hw
}

TEST(Snapshot, RestoreWithinTheSlackKeepsOlderRowsReachable) {
  Sequence s(make_layout({4}, 100, 3)); // R = 6
  while (s.length() < 10) step(s, 1);
  RingSnapshot snap = s.describe_snapshot();
  step(s, 1); // hw 11 <= 10 + 3: the snapshot's window was not overwritten
  ASSERT_TRUE(s.restore(snap).ok());
  EXPECT_EQ(s.high_water(), 11);
  EXPECT_EQ(s.rewind_floor(), 8); // as a plain rewind would allow
}

TEST(Snapshot, RestoreRefusesStaleOrForeignSnapshots) {
  auto layout = make_layout({4}, 100, 2);
  Sequence s(layout), other(layout);
  while (s.length() < 9) step(s, 1);
  RingSnapshot snap = s.describe_snapshot();

  Status foreign = other.restore(snap);
  ASSERT_FALSE(foreign.ok());
  EXPECT_NE(foreign.message().find("another sequence"), std::string::npos);

  ASSERT_TRUE(s.rewind(8).ok()); // truncates below the snapshot...
  step(s, 2);                    // ...and rewrites positions 8, 9
  step(s, 1);
  Status stale = s.restore(snap);
  ASSERT_FALSE(stale.ok());
  EXPECT_NE(stale.message().find("rewound to 8"), std::string::npos) << stale.message();

  RingSnapshot later = s.describe_snapshot(); // at 11
  ASSERT_TRUE(s.rewind(10).ok());
  Status too_long = s.restore(later);
  ASSERT_FALSE(too_long.ok());
  EXPECT_NE(too_long.message().find("holds only 10"), std::string::npos) << too_long.message();
}

TEST(Snapshot, TruncationsAboveTheBoundaryKeepItValid) {
  Sequence s(make_layout({4}, 100, 2));
  while (s.length() < 9) step(s, 1);
  RingSnapshot at9 = s.describe_snapshot();
  while (s.length() < 15) step(s, 1);
  RingSnapshot at15 = s.describe_snapshot();
  while (s.length() < 20) step(s, 1);
  ASSERT_TRUE(s.restore(at15).ok()); // a truncation to 15 >= 9
  while (s.length() < 25) step(s, 1);
  ASSERT_TRUE(s.restore(at9).ok());
  EXPECT_EQ(s.length(), 9);
  while (s.length() < 25) step(s, 1);
  EXPECT_FALSE(s.restore(at15).ok()); // positions 9..14 were rewritten since
}

TEST(Snapshot, FlatOnlyModelsNeedNoRows) {
  Sequence s(make_layout({0, 0}, 100, 4));
  step(s, 4);
  RingSnapshot snap = s.describe_snapshot();
  EXPECT_TRUE(snap.rows.empty());
  step(s, 4);
  ASSERT_TRUE(s.restore(snap).ok());
  EXPECT_EQ(s.length(), 4);
}

} // namespace
} // namespace offgraph::cache
