// Log-probabilities against a direct computation: a full sort and a long-double log-sum-exp.
#include "sample/logprobs.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

namespace offgraph::sample {
namespace {

TEST(Logprobs, MatchAFullSortAndALongDoubleSoftmax) {
  std::mt19937 rng(41);
  for (int trial = 0; trial < 50; ++trial) {
    const size_t n = 1 + rng() % 3000;
    std::vector<float> logits(n);
    std::normal_distribution<float> d(0, 4);
    for (float &l : logits) l = d(rng);
    // Ties and a banned token, which the order must settle by id.
    if (n > 10) logits[7] = logits[3], logits[9] = -INFINITY;
    long double z = 0;
    for (float l : logits) z += std::exp((long double)l);
    const long double log_z = std::log(z);
    std::vector<int32_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return logits[size_t(a)] != logits[size_t(b)] ? logits[size_t(a)] > logits[size_t(b)] : a < b;
    });
    const int32_t token = int32_t(rng() % n);
    const int32_t k = int32_t(rng() % (kMaxTopLogprobs + 1));
    const TokenLogprobs got = token_logprobs(logits, token, k);
    EXPECT_EQ(got.token, token);
    EXPECT_NEAR(got.logprob, double((long double)logits[size_t(token)] - log_z), 1e-5);
    ASSERT_EQ(got.top.size(), std::min<size_t>(size_t(k), n));
    double mass = 0;
    for (size_t i = 0; i < got.top.size(); ++i) {
      EXPECT_EQ(got.top[i].first, order[i]) << "rank " << i << " of " << n;
      EXPECT_NEAR(got.top[i].second, double((long double)logits[size_t(order[i])] - log_z), 1e-5);
      mass += std::exp(double(got.top[i].second));
    }
    EXPECT_LE(mass, 1 + 1e-6);
  }
}

TEST(Logprobs, ABannedTokenHasMinusInfinity) {
  const std::vector<float> logits = {1.0f, -INFINITY, 2.0f};
  const TokenLogprobs got = token_logprobs(logits, 1, 3);
  EXPECT_TRUE(std::isinf(got.logprob) && got.logprob < 0);
  ASSERT_EQ(got.top.size(), 3u);
  EXPECT_EQ(got.top[0].first, 2);
  EXPECT_EQ(got.top[2].first, 1);
}

} // namespace
} // namespace offgraph::sample
