// PrefixTree against a naive model: sequences as token lists, snapshots as token prefixes with a
// reach (the depths before theirs they also resume).
// 100,000 random operations over a 3-token alphabet (so that prefixes are shared, split and
// merged all the time): every match, refusal and orphaned snapshot must be what the lists say,
// and the tree's own invariants (PrefixTree::check) must hold (checked every 16th operation).
#include "engine/prefix_tree.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

namespace offgraph::engine {
namespace {

using Tokens = std::vector<int32_t>;

size_t lcp(const Tokens &a, const Tokens &b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

bool is_prefix(const Tokens &p, const Tokens &of) {
  return p.size() <= of.size() && std::equal(p.begin(), p.end(), of.begin());
}

TEST(PrefixTree, ASmallExample) {
  PrefixTree t;
  ASSERT_TRUE(t.insert_sequence(Tokens{1, 2, 3, 4}, 0));
  ASSERT_TRUE(t.insert_sequence(Tokens{1, 2, 5}, 1));
  ASSERT_FALSE(t.insert_sequence(Tokens{9}, 1)); // id in use
  EXPECT_EQ(t.n_nodes(), 3u);                    // [1 2] -> [3 4], [5]
  ASSERT_TRUE(t.insert_snapshot(Tokens{1, 2}, 7));
  ASSERT_TRUE(t.insert_snapshot(Tokens{1}, 8));     // splits [1 2]
  EXPECT_FALSE(t.insert_snapshot(Tokens{1, 3}, 9)); // on no sequence's path
  EXPECT_EQ(t.n_nodes(), 4u);
  auto m = t.match(Tokens{1, 2, 3, 9}, 100);
  EXPECT_EQ(m.depth, 3);
  EXPECT_EQ(m.sequences, std::vector<int32_t>{0});
  ASSERT_TRUE(m.snapshot);
  EXPECT_EQ(*m.snapshot, 7);
  EXPECT_EQ(m.snapshot_depth, 2);
  m = t.match(Tokens{1, 2, 3, 9}, 1); // snapshots deeper than 1 not offered
  EXPECT_EQ(*m.snapshot, 8);
  EXPECT_EQ(t.prefixes_of(Tokens{1, 2, 5, 6}), std::vector<int32_t>{1});
  EXPECT_TRUE(t.remove_sequence(0).empty()); // [1 2] still on 1's path: both snapshots stay
  EXPECT_EQ(t.remove_sequence(1), (std::vector<PrefixTree::SnapshotId>{7, 8}));
  EXPECT_EQ(t.n_nodes(), 0u);
  EXPECT_EQ(t.check(), "");
}

// A snapshot with a reach resumes a prompt that leaves its path a few tokens before it: on the
// path, past the divergence, and on a branch the prompt left earlier.
TEST(PrefixTree, SnapshotsReachBackToADivergence) {
  PrefixTree t;
  ASSERT_TRUE(t.insert_sequence(Tokens{1, 2, 3, 4, 5, 6}, 0));
  ASSERT_TRUE(t.insert_snapshot(Tokens{1, 2, 3, 4, 5}, 7, 2)); // resumes at 3, 4 or 5
  auto m = t.match(Tokens{1, 2, 3, 4, 9}, 100);                // leaves the path at 4
  EXPECT_EQ(m.depth, 4);
  ASSERT_TRUE(m.snapshot);
  EXPECT_EQ(*m.snapshot, 7);
  EXPECT_EQ(m.snapshot_depth, 5);
  EXPECT_EQ(m.restore_depth, 4);
  m = t.match(Tokens{1, 2, 3, 4, 9}, 3); // the limit, still within reach
  EXPECT_EQ(m.restore_depth, 3);
  m = t.match(Tokens{1, 2, 9}, 100); // 3 positions short: out of reach
  EXPECT_FALSE(m.snapshot);
  // A second sequence branching at 3: the prompt follows it, leaving the snapshot's path at 3.
  ASSERT_TRUE(t.insert_sequence(Tokens{1, 2, 3, 8, 8, 8}, 1));
  m = t.match(Tokens{1, 2, 3, 8, 8, 8, 8}, 100);
  EXPECT_EQ(m.depth, 6);
  ASSERT_TRUE(m.snapshot);
  EXPECT_EQ(m.restore_depth, 3);
  EXPECT_EQ(m.sequences, std::vector<int32_t>{1});
  EXPECT_EQ(m.snapshot_source, 0); // the pages under the snapshot are sequence 0's
  ASSERT_TRUE(t.snapshot_at(Tokens{1, 2, 3, 4, 5}));
  EXPECT_EQ(*t.snapshot_at(Tokens{1, 2, 3, 4, 5}), std::make_pair(int64_t(7), 2));
  EXPECT_FALSE(t.snapshot_at(Tokens{1, 2, 3, 4}));
  EXPECT_FALSE(t.snapshot_at(Tokens{1, 2, 3, 4, 5, 6, 7}));
  // A snapshot on the prompt's own path that resumes deeper wins.
  ASSERT_TRUE(t.insert_snapshot(Tokens{1, 2, 3, 8}, 9, 0));
  m = t.match(Tokens{1, 2, 3, 8, 8, 8, 8}, 100);
  EXPECT_EQ(*m.snapshot, 9);
  EXPECT_EQ(m.restore_depth, 4);
  EXPECT_EQ(t.check(), "");
}

TEST(PrefixTree, RandomOperationsMatchNaiveLists) {
  std::mt19937_64 rng(15);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto random_tokens = [&](size_t n) {
    Tokens t(n);
    for (auto &x : t) x = uniform(0, 2);
    return t;
  };
  PrefixTree tree;
  std::map<int32_t, Tokens> seqs;
  std::map<int64_t, Tokens> snaps;
  std::map<int64_t, int32_t> reach; // per snapshot
  int32_t next_seq = 0;
  int64_t next_snap = 0;
  int64_t matches = 0, snapshot_hits = 0, reached_back = 0, orphans = 0, refused = 0;
  // A prompt that shares a prefix with some sequence, then goes its own way.
  auto prompt_like = [&]() {
    if (seqs.empty() || uniform(0, 9) == 0) return random_tokens(size_t(uniform(1, 20)));
    auto it = seqs.begin();
    std::advance(it, uniform(0, int(seqs.size()) - 1));
    Tokens p(it->second.begin(), it->second.begin() + uniform(0, int(it->second.size())));
    Tokens tail = random_tokens(size_t(uniform(0, 8)));
    p.insert(p.end(), tail.begin(), tail.end());
    if (p.empty()) p.push_back(0);
    return p;
  };
  for (int op = 0; op < 100000; ++op) {
    const int kind = uniform(0, 9);
    if (kind <= 2 && seqs.size() < 40) { // insert a sequence
      const Tokens t = prompt_like();
      ASSERT_TRUE(tree.insert_sequence(t, next_seq));
      seqs[next_seq++] = t;
    } else if (kind <= 4 && !seqs.empty()) { // remove one; its orphaned snapshots come back
      auto it = seqs.begin();
      std::advance(it, uniform(0, int(seqs.size()) - 1));
      std::vector<int64_t> got = tree.remove_sequence(it->first);
      seqs.erase(it);
      std::vector<int64_t> expect;
      for (auto s = snaps.begin(); s != snaps.end();) {
        const bool on_path = std::any_of(seqs.begin(), seqs.end(), [&](const auto &q) {
          return is_prefix(s->second, q.second);
        });
        if (!on_path)
          expect.push_back(s->first), reach.erase(s->first), s = snaps.erase(s);
        else
          ++s;
      }
      std::sort(got.begin(), got.end());
      ASSERT_EQ(got, expect) << "op " << op;
      orphans += int64_t(got.size());
    } else if (kind <= 6) { // a snapshot at some prefix (a random one is often on no path)
      const Tokens p = prompt_like();
      const bool on_path = std::any_of(seqs.begin(), seqs.end(),
                                       [&](const auto &q) { return is_prefix(p, q.second); });
      std::optional<int64_t> replaced;
      const int32_t r = uniform(0, 3) == 0 ? 0 : uniform(1, 4);
      const bool ok = tree.insert_snapshot(p, next_snap, r, &replaced);
      ASSERT_EQ(ok, on_path) << "op " << op;
      if (ok) {
        auto old =
            std::find_if(snaps.begin(), snaps.end(), [&](const auto &s) { return s.second == p; });
        ASSERT_EQ(replaced.has_value(), old != snaps.end());
        if (old != snaps.end()) {
          ASSERT_EQ(*replaced, old->first);
          reach.erase(old->first);
          snaps.erase(old);
        }
        snaps[next_snap] = p;
        reach[next_snap] = std::min(r, int32_t(p.size()));
      } else {
        ++refused;
      }
      ++next_snap;
    } else if (kind == 7 && !snaps.empty()) { // drop a snapshot
      auto it = snaps.begin();
      std::advance(it, uniform(0, int(snaps.size()) - 1));
      ASSERT_TRUE(tree.remove_snapshot(it->first));
      reach.erase(it->first);
      snaps.erase(it);
    } else { // match
      const Tokens p = prompt_like();
      const int32_t limit = uniform(0, 25);
      const PrefixTree::Match m = tree.match(p, limit);
      size_t depth = 0;
      for (const auto &[id, t] : seqs) depth = std::max(depth, lcp(t, p));
      ASSERT_EQ(m.depth, int32_t(depth)) << "op " << op;
      std::vector<int32_t> expect;
      if (depth > 0) {
        for (const auto &[id, t] : seqs)
          if (lcp(t, p) == depth) expect.push_back(id);
      }
      std::vector<int32_t> got = m.sequences;
      std::sort(got.begin(), got.end());
      ASSERT_EQ(got, expect) << "op " << op;
      // A snapshot S resumes p at x = min(|S|, limit, lcp(S, p)) when x >= |S| - reach.
      auto resumes_at = [&](int64_t id) {
        const Tokens &s = snaps.at(id);
        const int32_t x = std::min({int32_t(s.size()), limit, int32_t(lcp(s, p))});
        return x >= int32_t(s.size()) - reach.at(id) ? x : 0;
      };
      int32_t best = 0;
      for (const auto &[id, s] : snaps) best = std::max(best, resumes_at(id));
      ASSERT_EQ(m.snapshot.has_value(), best > 0) << "op " << op;
      if (best > 0) {
        ASSERT_EQ(m.restore_depth, best) << "op " << op;
        ASSERT_EQ(resumes_at(*m.snapshot), best) << "op " << op;
        ASSERT_EQ(m.snapshot_depth, int32_t(snaps.at(*m.snapshot).size()));
        ASSERT_TRUE(seqs.count(m.snapshot_source)) << "op " << op;
        ASSERT_TRUE(is_prefix(snaps.at(*m.snapshot), seqs.at(m.snapshot_source))) << "op " << op;
        ++snapshot_hits;
        if (best < m.snapshot_depth) ++reached_back;
      }
      // Proper prefixes of p among the sequences.
      std::vector<int32_t> pre = tree.prefixes_of(p), pre_expect;
      for (const auto &[id, t] : seqs)
        if (t.size() < p.size() && is_prefix(t, p)) pre_expect.push_back(id);
      std::sort(pre.begin(), pre.end());
      ASSERT_EQ(pre, pre_expect) << "op " << op;
      ++matches;
    }
    ASSERT_EQ(tree.n_sequences(), seqs.size());
    ASSERT_EQ(tree.n_snapshots(), snaps.size());
    if (op % 16 == 0) {
      ASSERT_EQ(tree.check(), "") << "op " << op;
    }
  }
  EXPECT_GT(matches, 10000);
  EXPECT_GT(snapshot_hits, 1000);
  EXPECT_GT(reached_back, 100);
  EXPECT_GT(orphans, 100);
  EXPECT_GT(refused, 100);
}

} // namespace
} // namespace offgraph::engine
