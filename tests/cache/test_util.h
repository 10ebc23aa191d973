// Small builders shared by the cache tests.
#pragma once

#include "cache/layout.h"
#include "cache/sequence.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

namespace offgraph::cache::testing {

inline LayerSpec layer(int32_t window, int32_t kv_heads = 2, int32_t k_dim = 8, int32_t v_dim = 8) {
  return LayerSpec{AttentionKind{window}, kv_heads, k_dim, v_dim};
}

// A layout whose caches are given by their windows (0 = full attention), no sharing.
inline std::shared_ptr<const Layout> make_layout(std::vector<int32_t> windows, int32_t capacity,
                                                 int32_t max_write, int32_t page_rows = 64) {
  std::vector<LayerSpec> layers;
  for (int32_t w : windows) layers.push_back(layer(w));
  auto g = Geometry::build(layers, 0);
  EXPECT_TRUE(g.ok()) << g.message();
  auto l = Layout::make(std::move(g).value(), Policy{capacity, max_write, page_rows});
  EXPECT_TRUE(l.ok()) << l.message();
  return std::move(l).value();
}

inline Runs runs(std::initializer_list<Run> list) {
  Runs r;
  for (const Run &x : list) r.run[size_t(r.count++)] = x;
  return r;
}

// Plans and commits one step of n tokens on every cache; fails the test on any refusal.
inline void step(Sequence &s, int32_t n) {
  std::vector<StepPlan> plans;
  for (CacheId id = 0; id < s.layout().n_caches(); ++id) {
    auto p = s.plan(id, s.length(), n);
    ASSERT_TRUE(p.ok()) << p.message();
    plans.push_back(*p);
  }
  for (const StepPlan &p : plans) ASSERT_TRUE(s.commit(p).ok());
}

} // namespace offgraph::cache::testing

namespace offgraph::cache {
inline std::ostream &operator<<(std::ostream &o, const Run &r) {
  return o << "{" << r.start << "," << r.len << "}";
}
inline std::ostream &operator<<(std::ostream &o, const Runs &r) {
  o << "[";
  for (const Run &x : r) o << x;
  return o << "]";
}
} // namespace offgraph::cache
