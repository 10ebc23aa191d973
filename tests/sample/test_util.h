// Shared helpers for the sample tests: reproducible random logits that are never zero.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace offgraph::sample::testing {

// std::mt19937's raw output is fixed by the standard (distributions are not), so the logits are
// the same everywhere. Values lie in [-scale, scale] with |v| >= 1e-3 * scale: never zero, which
// would hide sign bugs in the repetition penalty.
inline std::vector<float> random_logits(size_t n, uint32_t seed, float scale = 4.0f) {
  std::mt19937 gen(seed);
  std::vector<float> out(n);
  for (auto &v : out) {
    const double u = static_cast<double>(gen()) / 4294967296.0; // [0, 1)
    double x = (2.0 * u - 1.0) * scale;
    if (x > -1e-3 * scale && x < 1e-3 * scale) x = (x < 0 ? -1e-3 : 1e-3) * scale;
    v = static_cast<float>(x);
  }
  return out;
}

inline std::vector<int32_t> random_ids(size_t n, int32_t vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<int32_t> out(n);
  for (auto &v : out) v = static_cast<int32_t>(gen() % static_cast<uint32_t>(vocab));
  return out;
}

} // namespace offgraph::sample::testing
