// Helpers of the store tests: layouts from layer specs, a store on the CPU, random inputs, and one
// step through every layer computed by the Runner.
#pragma once

#include "cache/geometry.h"
#include "kv/kv_store.h"
#include "runner.h"

#include "ggml-cpu.h"

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

namespace offgraph::kv::testing {

inline std::shared_ptr<const cache::Layout> make_layout(std::vector<cache::LayerSpec> layers,
                                                        int32_t shared, cache::Policy policy) {
  auto geo = cache::Geometry::build(layers, shared);
  EXPECT_TRUE(geo.ok()) << geo.message();
  auto layout = cache::Layout::make(std::move(geo).value(), policy);
  EXPECT_TRUE(layout.ok()) << layout.message();
  return *layout;
}

inline std::unique_ptr<KvStore> make_store(std::shared_ptr<const cache::Layout> layout,
                                           StorageTypes types) {
  auto store = KvStore::create(std::move(layout), types, ggml_backend_cpu_buffer_type());
  EXPECT_TRUE(store.ok()) << store.message();
  return std::move(store).value();
}

inline std::vector<float> randn(std::mt19937_64 &rng, size_t n) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float &f : x) f = d(rng);
  return x;
}

// One step of n tokens on `seq` through every layer; layer l's q, k, v come from `inputs(l)`.
struct LayerInputs {
  std::vector<float> q, k, v;
  int32_t n_q_heads;
};
// `kernels`, if given, receives the name of the op that attended each layer.
inline std::vector<std::vector<float>> run_step(KvStore &store, SeqId seq, int32_t n,
                                                const std::vector<LayerInputs> &inputs,
                                                std::vector<std::string> *kernels = nullptr) {
  Step step(store);
  auto span = step.add_span({seq, store.sequence(seq)->length(), n});
  EXPECT_TRUE(span.ok()) << span.message();
  if (!span.ok()) return {};
  std::vector<Call> calls;
  const cache::Geometry &geo = store.layout().geometry();
  for (int32_t l = 0; l < geo.n_layers(); ++l) {
    Call c;
    c.span = *span;
    c.cache = geo.cache_of_layer(l);
    c.n_q_heads = inputs[size_t(l)].n_q_heads;
    c.scale = 0.125f;
    c.q = inputs[size_t(l)].q;
    c.k = inputs[size_t(l)].k;
    c.v = inputs[size_t(l)].v;
    calls.push_back(std::move(c));
  }
  Runner runner;
  EXPECT_TRUE(runner.run(step, store.layout(), calls));
  EXPECT_TRUE(step.commit().ok());
  std::vector<std::vector<float>> outs;
  for (Call &c : calls) {
    outs.push_back(std::move(c.out));
    if (kernels) kernels->push_back(c.kernel);
  }
  return outs;
}

// Random inputs for every layer; a shared layer gets its donor's K/V (what YOCO computes).
inline std::vector<LayerInputs> random_inputs(std::mt19937_64 &rng, const cache::Layout &layout,
                                              int32_t n, int32_t q_heads) {
  const cache::Geometry &geo = layout.geometry();
  std::vector<LayerInputs> in(size_t(geo.n_layers()));
  for (int32_t l = 0; l < geo.n_layers(); ++l) {
    const cache::CacheSpec &s = layout.cache(geo.cache_of_layer(l)).spec;
    in[size_t(l)].n_q_heads = q_heads;
    in[size_t(l)].q = randn(rng, size_t(n * q_heads * s.k_head_dim));
    if (geo.is_shared_layer(l)) {
      in[size_t(l)].k = in[size_t(s.owner_layer)].k;
      in[size_t(l)].v = in[size_t(s.owner_layer)].v;
    } else {
      in[size_t(l)].k = randn(rng, size_t(n * s.n_kv_heads * s.k_head_dim));
      in[size_t(l)].v = randn(rng, size_t(n * s.n_kv_heads * s.v_head_dim));
    }
  }
  return in;
}

inline cache::LayerSpec layer(int32_t window, int32_t heads = 2, int32_t k_dim = 64,
                              int32_t v_dim = 32) {
  return {cache::AttentionKind{window}, heads, k_dim, v_dim};
}

} // namespace offgraph::kv::testing
