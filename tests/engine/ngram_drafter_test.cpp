// The n-gram drafter against a naive search of the whole history, over random appends and
// truncations: the same draft, the same match length, every time.
#include "engine/ngram_drafter.h"

#include <gtest/gtest.h>

#include <random>

namespace offgraph::engine {
namespace {

// The definition, directly: earlier occurrences of the last n_min tokens, most recent first, at
// most max_candidates of them; the longest backward match (up to n_max) wins, the most recent
// among equals; the draft is what followed it.
NgramDrafter::Draft naive(const std::vector<int32_t> &h, NgramDrafter::Options o, size_t k) {
  NgramDrafter::Draft best;
  const size_t n = h.size();
  if (k == 0 || n < size_t(o.n_min) + 1) return best;
  int32_t tried = 0, best_end = -1;
  for (size_t end = n - 1; end-- > size_t(o.n_min) - 1 && tried < o.max_candidates;) {
    bool occurs = true;
    for (int32_t i = 0; i < o.n_min; ++i)
      occurs = occurs && h[end - size_t(i)] == h[n - 1 - size_t(i)];
    if (!occurs) continue;
    ++tried;
    int32_t length = 0;
    while (length < o.n_max && size_t(length) <= end &&
           h[end - size_t(length)] == h[n - 1 - size_t(length)])
      ++length;
    if (length > best.match) {
      best.match = length;
      best_end = int32_t(end);
    }
  }
  if (best_end < 0) return best;
  for (size_t i = size_t(best_end) + 1; i < n && best.tokens.size() < k; ++i)
    best.tokens.push_back(h[i]);
  return best;
}

TEST(NgramDrafter, DraftsAreTheNaiveSearchsAcrossAppendsAndTruncations) {
  std::mt19937 rng(17);
  size_t drafts = 0, nonempty = 0, truncations = 0;
  for (int trial = 0; trial < 40; ++trial) {
    NgramDrafter::Options o;
    o.n_min = 1 + int32_t(rng() % 3);
    o.n_max = o.n_min + int32_t(rng() % 6);
    o.max_candidates = 1 + int32_t(rng() % 8);
    NgramDrafter d(o);
    std::vector<int32_t> h;
    const int32_t alphabet = 2 + int32_t(rng() % 5); // small: repeats everywhere
    for (int step = 0; step < 400; ++step) {
      const unsigned op = rng() % 10;
      if (op < 7) {
        const int32_t t = int32_t(rng() % uint32_t(alphabet));
        d.append(t);
        h.push_back(t);
      } else if (op < 8 && !h.empty()) {
        const size_t keep = rng() % (h.size() + 1);
        d.truncate(keep);
        h.resize(keep);
        ++truncations;
      } else if (op < 9) { // a copied stretch, as an echoing answer writes
        const size_t from = h.empty() ? 0 : rng() % h.size(), len = 1 + rng() % 12;
        std::vector<int32_t> copy;
        for (size_t i = from; i < h.size() && copy.size() < len; ++i) copy.push_back(h[i]);
        d.append(copy);
        h.insert(h.end(), copy.begin(), copy.end());
      }
      ASSERT_EQ(d.size(), h.size());
      const size_t k = rng() % 10;
      const NgramDrafter::Draft got = d.draft(k), want = naive(h, o, k);
      ASSERT_EQ(got.match, want.match) << "trial " << trial << " step " << step;
      ASSERT_EQ(got.tokens, want.tokens) << "trial " << trial << " step " << step;
      ++drafts;
      nonempty += !got.tokens.empty();
    }
  }
  EXPECT_GT(drafts, 10000u);
  EXPECT_GT(nonempty, drafts / 2);
  EXPECT_GT(truncations, 1000u);
}

TEST(NgramDrafter, AnEchoedPassageIsDraftedFromWhereItWasSeen) {
  // "... the quick brown fox jumps over the lazy dog ..." then the answer starts quoting it.
  const std::vector<int32_t> prompt = {5, 6, 10, 11, 12, 13, 14, 15, 10, 16, 17, 7, 8};
  NgramDrafter d({.n_min = 2, .n_max = 4, .max_candidates = 8});
  d.append(prompt);
  d.append(std::vector<int32_t>{10, 11}); // "the quick"
  const NgramDrafter::Draft draft = d.draft(5);
  EXPECT_EQ(draft.match, 2);
  EXPECT_EQ(draft.tokens, (std::vector<int32_t>{12, 13, 14, 15, 10}));
  // One token of context is below n_min: nothing to draft from.
  NgramDrafter e({.n_min = 2});
  e.append(7);
  EXPECT_TRUE(e.draft(4).tokens.empty());
  // Truncated back before the quote, the drafter is as if it had never read it.
  d.truncate(prompt.size());
  NgramDrafter fresh({.n_min = 2, .n_max = 4, .max_candidates = 8});
  fresh.append(prompt);
  for (NgramDrafter *x : {&d, &fresh}) x->append(std::vector<int32_t>{10, 16}); // "the lazy"
  EXPECT_EQ(d.draft(3).tokens, (std::vector<int32_t>{17, 7, 8}));
  EXPECT_EQ(d.draft(3).tokens, fresh.draft(3).tokens);
  EXPECT_EQ(d.draft(3).match, fresh.draft(3).match);
  // No limit asked: everything that followed, without overflow.
  EXPECT_EQ(d.draft(SIZE_MAX).tokens, (std::vector<int32_t>{17, 7, 8, 10, 16}));
}

TEST(NgramDrafter, OptionsAreClampedIntoRange) {
  NgramDrafter d({.n_min = 0, .n_max = -3, .max_candidates = 0});
  d.append(std::vector<int32_t>{1, 2, 1});
  const NgramDrafter::Draft draft = d.draft(3); // n_min 1, n_max 1, one candidate
  EXPECT_EQ(draft.match, 1);
  EXPECT_EQ(draft.tokens, (std::vector<int32_t>{2, 1}));
}

} // namespace
} // namespace offgraph::engine
