// Geometry: the model's facts about its caches. Which layer writes which cache, and for each
// cache its attention kind (full or sliding window), KV heads and head dims. It comes from model
// metadata, never from code constants, and knows nothing of runtime sizes (see layout.h).
#pragma once

#include "base/status.h"

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace offgraph::cache {

// Index of a cache within a Geometry: dense, 0..n_caches()-1, in order of the owning layers.
using CacheId = int32_t;

// How a layer attends. A window of w means a query at position p sees keys [p - w + 1, p];
// 0 means full causal attention (keys [0, p]).
struct AttentionKind {
  int32_t window = 0;

  bool sliding() const { return window > 0; }
  bool operator==(const AttentionKind &) const = default;
  std::string describe() const;
};

// One model layer, as the model's metadata describes it.
struct LayerSpec {
  AttentionKind attention;
  int32_t n_kv_heads = 0;
  int32_t k_head_dim = 0;
  int32_t v_head_dim = 0;
};

// One cache: owned by exactly one layer (its donor); shared layers read it too.
struct CacheSpec {
  AttentionKind attention;
  int32_t n_kv_heads = 0;
  int32_t k_head_dim = 0;
  int32_t v_head_dim = 0;
  int32_t owner_layer = 0; // the layer that computes and writes this cache's K/V

  // Elements (not bytes: dtypes are the byte layer's business) of K and V for one token.
  int64_t k_elements_per_token() const { return int64_t(n_kv_heads) * k_head_dim; }
  int64_t v_elements_per_token() const { return int64_t(n_kv_heads) * v_head_dim; }
};

class Geometry {
public:
  // Builds the layer -> cache map. With n_kv_shared_layers = n > 0, layers
  // [n_layers - n, n_layers) are shared: each has no cache of its own and reads the cache of its
  // donor, the last layer before the shared block with the same attention kind (YOCO, as
  // transformers' store_full_length_kv). n = 0 means no sharing. Every other layer owns a cache.
  static Result<Geometry> build(std::span<const LayerSpec> layers, int32_t n_kv_shared_layers = 0);

  int32_t n_layers() const { return int32_t(layer_cache_.size()); }
  int32_t n_caches() const { return int32_t(caches_.size()); }
  int32_t n_kv_shared_layers() const { return n_kv_shared_layers_; }

  CacheId cache_of_layer(int32_t layer) const { return layer_cache_.at(size_t(layer)); }
  bool is_shared_layer(int32_t layer) const {
    return caches_.at(size_t(cache_of_layer(layer))).owner_layer != layer;
  }
  const CacheSpec &cache(CacheId id) const { return caches_.at(size_t(id)); }
  const std::vector<CacheSpec> &caches() const { return caches_; }

private:
  std::vector<CacheId> layer_cache_;
  std::vector<CacheSpec> caches_;
  int32_t n_kv_shared_layers_ = 0;
};

} // namespace offgraph::cache
