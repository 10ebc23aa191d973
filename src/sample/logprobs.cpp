#include "sample/logprobs.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>

namespace offgraph::sample {

TokenLogprobs token_logprobs(std::span<const float> logits, int32_t token, int32_t top) {
  assert(token >= 0 && size_t(token) < logits.size() && top >= 0 && top <= kMaxTopLogprobs);
  double max = -std::numeric_limits<double>::infinity();
  for (float l : logits) max = std::max(max, double(l));
  double sum = 0;
  for (float l : logits) sum += std::exp(double(l) - max);
  const double log_z = max + std::log(sum);
  TokenLogprobs out;
  out.token = token;
  out.logprob = float(double(logits[size_t(token)]) - log_z);
  if (top == 0) return out;
  // The k best by logit (then lower id): one pass keeping a sorted list of k.
  auto better = [&](int32_t a, int32_t b) {
    return logits[size_t(a)] > logits[size_t(b)] ||
           (logits[size_t(a)] == logits[size_t(b)] && a < b);
  };
  std::vector<int32_t> best;
  best.reserve(size_t(top) + 1);
  for (int32_t i = 0; i < int32_t(logits.size()); ++i) {
    if (int32_t(best.size()) == top && !better(i, best.back())) continue;
    best.insert(std::upper_bound(best.begin(), best.end(), i, better), i);
    if (int32_t(best.size()) > top) best.pop_back();
  }
  for (int32_t i : best) out.top.emplace_back(i, float(double(logits[size_t(i)]) - log_z));
  return out;
}

} // namespace offgraph::sample
