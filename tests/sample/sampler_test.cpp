// The composed Sampler: validation, greedy, bans, determinism and the sampled distribution.
#include "sample/sampler.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>

namespace offgraph::sample {
namespace {

using testing::random_logits;

constexpr float kInf = std::numeric_limits<float>::infinity();

Sampler make(const SamplingParams &p, int32_t vocab) {
  auto s = Sampler::create(p, vocab);
  EXPECT_TRUE(s.ok()) << s.message();
  return std::move(s).value();
}

void expect_invalid(const SamplingParams &p, const std::string &field, int32_t vocab = 100) {
  const Status s = validate(p, vocab);
  ASSERT_FALSE(s.ok()) << field;
  EXPECT_NE(s.message().find(field), std::string::npos) << s.message();
  EXPECT_FALSE(Sampler::create(p, vocab).ok());
}

// Muse Glimmer's recommended sampling (MUSE_GLIMMER.md 11; the architecture row says so, as
// tests/model checks): a realistic non-default set.
SamplingParams muse_glimmer_like() {
  SamplingParams p;
  p.temperature = 1.0f, p.top_p = 0.95f, p.top_k = 64, p.min_p = 0.0f;
  return p;
}

TEST(Validate, DefaultsAreValid) {
  EXPECT_TRUE(validate(SamplingParams{}, 10).ok());
  EXPECT_TRUE(validate(muse_glimmer_like(), 10).ok());
}

TEST(Validate, EachFieldNamed) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto with = [](auto f) {
    SamplingParams p;
    f(p);
    return p;
  };
  expect_invalid(with([](auto &p) { p.temperature = -0.1f; }), "temperature");
  expect_invalid(with([&](auto &p) { p.temperature = nan; }), "temperature");
  expect_invalid(with([](auto &p) { p.temperature = kInf; }), "temperature");
  expect_invalid(with([](auto &p) { p.top_k = -1; }), "top_k");
  expect_invalid(with([](auto &p) { p.top_p = 0.0f; }), "top_p");
  expect_invalid(with([](auto &p) { p.top_p = 1.01f; }), "top_p");
  expect_invalid(with([&](auto &p) { p.top_p = nan; }), "top_p");
  expect_invalid(with([](auto &p) { p.min_p = -0.01f; }), "min_p");
  expect_invalid(with([](auto &p) { p.min_p = 1.5f; }), "min_p");
  expect_invalid(with([&](auto &p) { p.min_p = nan; }), "min_p");
  expect_invalid(with([](auto &p) { p.repetition_penalty = 0.0f; }), "repetition_penalty");
  expect_invalid(with([&](auto &p) { p.repetition_penalty = nan; }), "repetition_penalty");
  expect_invalid(with([&](auto &p) { p.presence_penalty = nan; }), "presence_penalty");
  expect_invalid(with([](auto &p) { p.frequency_penalty = -kInf; }), "frequency_penalty");
  expect_invalid(with([](auto &p) { p.penalty_last_n = -2; }), "penalty_last_n");
  expect_invalid(with([](auto &p) { p.logit_bias[100] = 1.0f; }), "logit_bias");
  expect_invalid(with([](auto &p) { p.logit_bias[-1] = 1.0f; }), "logit_bias");
  expect_invalid(with([&](auto &p) { p.logit_bias[5] = nan; }), "logit_bias");
  expect_invalid(with([](auto &p) { p.logit_bias[5] = kInf; }), "logit_bias");
  EXPECT_TRUE(validate(with([](auto &p) { p.logit_bias[99] = -kInf; }), 100).ok());
  EXPECT_FALSE(validate(SamplingParams{}, 0).ok());
}

TEST(Defaults, Generic) {
  const SamplingParams g;
  EXPECT_EQ(g.temperature, 0.8f);
  EXPECT_EQ(g.top_k, 40);
  EXPECT_EQ(g.top_p, 0.95f);
  EXPECT_EQ(g.min_p, 0.05f);
  EXPECT_EQ(g.repetition_penalty, 1.0f);
}

TEST(Sampler, GreedyIsArgmax) {
  SamplingParams p;
  p.temperature = 0.0f;
  Sampler s = make(p, 1000);
  for (uint32_t seed = 1; seed <= 50; ++seed) {
    const auto l = random_logits(1000, seed);
    const auto best = std::max_element(l.begin(), l.end()) - l.begin();
    EXPECT_EQ(s.sample(l, {}), best);
  }
  std::vector<float> ties(1000, -1.0f);
  ties[700] = ties[300] = ties[301] = 5.0f;
  EXPECT_EQ(s.sample(ties, {}), 300);
}

TEST(Sampler, GreedyAppliesPenaltiesAndBias) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.repetition_penalty = 4.0f;
  p.logit_bias[2] = 0.5f;
  Sampler s = make(p, 4);
  const std::vector<float> l = {3.0f, 2.0f, 1.9f, 0.1f};
  const std::vector<int32_t> h = {0};
  // 0: 3 / 4 = 0.75; 2: 1.9 + 0.5 = 2.4 beats 1: 2.0.
  EXPECT_EQ(s.sample(l, h), 2);
}

TEST(Sampler, NegativeInfinityBiasBans) {
  SamplingParams p;
  p.temperature = 1.5f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.logit_bias[7] = -kInf;
  p.logit_bias[8] = -kInf;
  Sampler s = make(p, 10);
  auto l = random_logits(10, 9);
  l[7] = 20.0f; // would win almost every draw
  for (int i = 0; i < 2000; ++i) {
    const int32_t t = s.sample(l, {});
    ASSERT_NE(t, 7);
    ASSERT_NE(t, 8);
    ASSERT_GE(t, 0);
  }
  p.temperature = 0.0f;
  Sampler g = make(p, 10);
  EXPECT_NE(g.sample(l, {}), 7);
}

TEST(Sampler, TopKSkipsBannedTokens) {
  // Banned tokens must not use up top-k slots: the survivors are the next best three.
  SamplingParams p;
  p.temperature = 100.0f; // near uniform over the survivors
  p.top_k = 3;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.logit_bias[1] = -kInf;
  p.logit_bias[4] = -kInf;
  Sampler s = make(p, 8);
  const std::vector<float> l = {0.1f, 9.0f, 5.0f, 0.3f, 8.0f, 6.0f, 7.0f, -1.0f};
  std::set<int32_t> seen;
  for (int i = 0; i < 500; ++i) seen.insert(s.sample(l, {}));
  EXPECT_EQ(seen, (std::set<int32_t>{2, 5, 6}));
}

TEST(Sampler, DeterministicPerSeed) {
  const int32_t vocab = 5000;
  auto run = [&](uint64_t seed) {
    SamplingParams p = muse_glimmer_like();
    p.seed = seed;
    p.repetition_penalty = 1.1f;
    Sampler s = make(p, vocab);
    std::vector<int32_t> out;
    for (uint32_t step = 0; step < 200; ++step) {
      out.push_back(s.sample(random_logits(vocab, step + 1, 2.0f), out));
    }
    return out;
  };
  const auto a = run(1234);
  EXPECT_EQ(a, run(1234));
  EXPECT_NE(a, run(1235));
  EXPECT_TRUE(std::none_of(a.begin(), a.end(), [](int32_t t) { return t < 0; }));

  // reseed replays the stream.
  SamplingParams p;
  p.seed = 9;
  Sampler s = make(p, vocab);
  const auto l = random_logits(vocab, 77, 1.0f);
  std::vector<int32_t> first, second;
  for (int i = 0; i < 50; ++i) first.push_back(s.sample(l, {}));
  s.reseed(9);
  for (int i = 0; i < 50; ++i) second.push_back(s.sample(l, {}));
  EXPECT_EQ(first, second);
}

// Exact probabilities of the chain, computed the long way in double: full sort, top-k, softmax
// at temperature 1, nucleus, min-p, then softmax at the temperature over what is left.
std::vector<double> exact_probs(const std::vector<float> &l, const SamplingParams &p) {
  std::vector<size_t> order(l.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return l[a] > l[b]; });
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < order.size()) {
    order.resize(static_cast<size_t>(p.top_k));
  }
  auto probs_of = [&](const std::vector<size_t> &keep, double t) {
    double z = 0;
    std::vector<double> q;
    for (size_t i : keep) q.push_back(std::exp((l[i] - l[keep[0]]) / t));
    for (double v : q) z += v;
    for (double &v : q) v /= z;
    return q;
  };
  auto q = probs_of(order, 1.0);
  double cum = 0;
  size_t n = 0;
  while (n < order.size()) {
    cum += q[n++];
    if (cum >= p.top_p) break;
  }
  order.resize(n);
  q = probs_of(order, 1.0);
  std::vector<size_t> kept;
  for (size_t i = 0; i < order.size(); ++i) {
    if (q[i] >= p.min_p * q[0]) kept.push_back(order[i]);
  }
  q = probs_of(kept, p.temperature);
  std::vector<double> out(l.size(), 0.0);
  for (size_t i = 0; i < kept.size(); ++i) out[kept[i]] = q[i];
  return out;
}

TEST(Sampler, EmpiricalDistributionMatchesExact) {
  struct Case {
    float temperature;
    int32_t top_k;
    float top_p;
    float min_p;
  };
  const Case cases[] = {
      {1.0f, 0, 1.0f, 0.0f}, {0.7f, 6, 1.0f, 0.0f},  {1.3f, 0, 0.8f, 0.0f},
      {0.9f, 7, 0.9f, 0.1f}, {2.0f, 5, 0.95f, 0.0f},
  };
  const int32_t vocab = 10;
  const int draws = 100000;
  uint32_t seed = 1;
  for (const Case &c : cases) {
    SamplingParams p;
    p.temperature = c.temperature;
    p.top_k = c.top_k;
    p.top_p = c.top_p;
    p.min_p = c.min_p;
    p.seed = 1000 + seed;
    const auto l = random_logits(vocab, seed++, 1.5f);
    const auto want = exact_probs(l, p);
    Sampler s = make(p, vocab);
    std::vector<int> counts(vocab, 0);
    for (int i = 0; i < draws; ++i) ++counts[static_cast<size_t>(s.sample(l, {}))];

    double chi2 = 0;
    int df = -1;
    for (int32_t t = 0; t < vocab; ++t) {
      const double e = want[static_cast<size_t>(t)] * draws;
      if (e == 0) {
        EXPECT_EQ(counts[static_cast<size_t>(t)], 0) << "token " << t << " was filtered out";
        continue;
      }
      ++df;
      const double d = counts[static_cast<size_t>(t)] - e;
      chi2 += d * d / e;
    }
    // 99.9th percentile of chi-square with up to 9 degrees of freedom is 27.9.
    EXPECT_LT(chi2, 27.9) << "df " << df << " temperature " << c.temperature;
  }
}

TEST(Sampler, LargeVocabTopKStaysInTopK) {
  const int32_t vocab = 200000;
  SamplingParams p = muse_glimmer_like();
  p.seed = 5;
  Sampler s = make(p, vocab);
  const auto l = random_logits(static_cast<size_t>(vocab), 21, 6.0f);
  std::vector<float> sorted = l;
  std::nth_element(sorted.begin(), sorted.begin() + 63, sorted.end(), std::greater<float>());
  const float kth = sorted[63];
  for (int i = 0; i < 20; ++i) {
    const int32_t t = s.sample(l, {});
    ASSERT_GE(t, 0);
    EXPECT_GE(l[static_cast<size_t>(t)], kth);
  }
  // No top-k: top-p alone over the full vocabulary must still work.
  p.top_k = 0;
  p.top_p = 0.9f;
  Sampler s2 = make(p, vocab);
  EXPECT_GE(s2.sample(l, {}), 0);
}

TEST(Sampler, BadInputsAreErrors) {
  SamplingParams p;
  p.repetition_penalty = 1.2f;
  Sampler s = make(p, 10);
  auto l = random_logits(10, 3);
  EXPECT_FALSE(s.sample_checked(std::span<const float>(l).first(9), {}).ok());
  EXPECT_EQ(s.sample(std::span<const float>(l).first(9), {}), Sampler::kNoToken);
  const std::vector<int32_t> bad_history = {3, -1};
  auto r = s.sample_checked(l, bad_history);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("history"), std::string::npos);
  // Ids past the vocabulary name image rows: no penalty, nothing touched past the logits.
  std::vector<float> penalised = l, with_rows = l;
  apply_penalties(penalised, std::vector<int32_t>{3, 7}, p);
  apply_penalties(with_rows, std::vector<int32_t>{3, 10, 7, 2000000000}, p);
  EXPECT_EQ(penalised, with_rows);
  EXPECT_NE(penalised, l);
  // ... nor take a place in the window: the last 2 tokens are 3 and 7 however many rows follow.
  SamplingParams last2 = p;
  last2.penalty_last_n = 2;
  std::vector<float> windowed = l;
  apply_penalties(windowed, std::vector<int32_t>{5, 3, 7, 10, 11, 12, 2000000000}, last2);
  EXPECT_EQ(windowed, penalised);
  // A negative id is an error wherever the window the penalties read holds it, rows skipped.
  Sampler s2 = make(last2, 10);
  EXPECT_FALSE(s2.sample_checked(l, std::vector<int32_t>{-1, 10, 11, 7}).ok());
  EXPECT_TRUE(s2.sample_checked(l, std::vector<int32_t>{-1, 3, 10, 11, 7}).ok());
  EXPECT_TRUE(s.sample_checked(l, std::vector<int32_t>{3, 10, 2000000000}).ok());
  auto nan_l = l;
  nan_l[4] = std::numeric_limits<float>::quiet_NaN();
  r = s.sample_checked(nan_l, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("token 4"), std::string::npos) << r.message();
  std::vector<float> banned(10, -kInf);
  r = s.sample_checked(banned, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("banned"), std::string::npos);
}

} // namespace
} // namespace offgraph::sample
