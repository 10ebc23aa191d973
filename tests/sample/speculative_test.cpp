// Speculative acceptance against its promise: greedy verification writes what greedy decoding
// writes, and speculative sampling emits tokens distributed as the target's, whatever the draft's
// distribution (chi-square at p = 0.001, fixed seeds), also for one-hot (n-gram) drafts.
#include "sample/speculative.h"

#include <gtest/gtest.h>

#include <random>

namespace offgraph::sample {
namespace {

TEST(Speculative, GreedyKeepsDraftsWhileTheyAreTheTargetsChoice) {
  const std::vector<int32_t> target = {4, 7, 7, 2};
  EXPECT_EQ(verify_greedy(std::vector<int32_t>{4, 7, 7}, target).accepted, 3u);
  EXPECT_EQ(verify_greedy(std::vector<int32_t>{4, 7, 7}, target).next, 2);
  const SpeculativeVerdict v = verify_greedy(std::vector<int32_t>{4, 8, 7}, target);
  EXPECT_EQ(v.accepted, 1u);
  EXPECT_EQ(v.next, 7); // the correction: what greedy writes there
  EXPECT_EQ(verify_greedy(std::vector<int32_t>{5}, target).accepted, 0u);
  EXPECT_EQ(verify_greedy(std::vector<int32_t>{5}, target).next, 4);
  EXPECT_EQ(verify_greedy(std::vector<int32_t>{}, target).next, 4);
}

std::vector<double> random_distribution(std::mt19937 &rng, size_t n, bool sparse) {
  std::vector<double> p(n);
  double total = 0;
  for (double &x : p) {
    x = sparse && rng() % 3 == 0 ? 0.0 : std::uniform_real_distribution<double>(0.05, 1)(rng);
    total += x;
  }
  if (total == 0) p[0] = total = 1;
  for (double &x : p) x /= total;
  return p;
}

// Pearson's statistic of observed counts against probabilities, over the cells with p > 0; a
// count in a cell with p = 0 is an outright failure.
double chi_square(const std::vector<size_t> &counts, const std::vector<double> &p, size_t n,
                  size_t &cells) {
  double x = 0;
  cells = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == 0) {
      EXPECT_EQ(counts[i], 0u) << "token " << i << " has no probability but was emitted";
      continue;
    }
    const double e = p[i] * double(n);
    x += (double(counts[i]) - e) * (double(counts[i]) - e) / e;
    ++cells;
  }
  return x;
}

// chi-square critical values at p = 0.001 by degrees of freedom.
double critical(size_t dof) {
  static const double v[] = {0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12};
  return v[std::min<size_t>(dof, 8)];
}

TEST(Speculative, SampledTokensFollowTheTargetWhateverTheDraft) {
  std::mt19937 rng(29);
  std::mt19937_64 draws(31);
  std::uniform_real_distribution<double> unit(0, 1);
  auto uniform = [&] { return unit(draws); };
  constexpr size_t kVocab = 6, kDraft = 3, kTrials = 200000;
  for (int setting = 0; setting < 7; ++setting) {
    const bool one_hot = setting == 4 || setting == 5; // an n-gram drafter: q one-hot at its token
    const bool elsewhere = setting == 6; // drafts q gives no weight to (q one-hot at another)
    std::vector<std::vector<double>> target, draft;
    for (size_t i = 0; i <= kDraft; ++i)
      target.push_back(random_distribution(rng, kVocab, setting % 2));
    for (size_t i = 0; i < kDraft; ++i)
      draft.push_back(random_distribution(rng, kVocab, setting % 3 == 0));
    std::vector<int32_t> fixed(kDraft);
    for (size_t i = 0; i < kDraft; ++i) fixed[i] = int32_t(rng() % kVocab);
    std::vector<std::vector<size_t>> counts(kDraft + 1, std::vector<size_t>(kVocab, 0));
    std::vector<size_t> emitted(kDraft + 1, 0);
    size_t accepted = 0;
    for (size_t t = 0; t < kTrials; ++t) {
      std::vector<int32_t> d(kDraft);
      std::vector<std::vector<double>> q = draft;
      for (size_t i = 0; i < kDraft; ++i) {
        if (one_hot || elsewhere) {
          d[i] = fixed[i];
          q[i].assign(kVocab, 0.0);
          q[i][(size_t(d[i]) + (elsewhere ? 1 : 0)) % kVocab] = 1.0;
        } else {
          std::discrete_distribution<int32_t> from(draft[i].begin(), draft[i].end());
          d[i] = from(draws);
        }
      }
      const SpeculativeVerdict v = verify_sampled(d, target, q, uniform);
      ASSERT_LE(v.accepted, kDraft);
      ASSERT_GE(v.next, 0);
      ASSERT_LT(v.next, int32_t(kVocab));
      accepted += v.accepted;
      std::vector<int32_t> out(d.begin(), d.begin() + long(v.accepted));
      out.push_back(v.next);
      // Position i's distribution does not depend on the tokens before it here, so the emitted
      // token at each position must follow that position's target distribution.
      for (size_t i = 0; i < out.size(); ++i) {
        ++counts[i][size_t(out[i])];
        ++emitted[i];
      }
    }
    // Every position reached often enough, the bonus draw (position kDraft) included.
    size_t checked = 0;
    for (size_t i = 0; i <= kDraft; ++i) {
      if (emitted[i] < 2000) continue;
      size_t cells = 0;
      const double x = chi_square(counts[i], target[i], emitted[i], cells);
      if (cells < 2) continue; // one possible token: nothing to compare
      EXPECT_LT(x, critical(cells - 1)) << "setting " << setting << " position " << i;
      ++checked;
    }
    EXPECT_GE(checked, elsewhere ? 1u : 2u) << "setting " << setting;
    if (elsewhere)
      EXPECT_EQ(accepted, 0u); // q could not have drawn them: never kept
    else
      EXPECT_GT(accepted, kTrials / 10) << "setting " << setting; // drafts were kept
  }
}

} // namespace
} // namespace offgraph::sample
