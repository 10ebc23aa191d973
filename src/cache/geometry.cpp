#include "cache/geometry.h"

#include <limits>

namespace offgraph::cache {

namespace {

// Sizes above this would overflow int32 arithmetic on positions and rows (window + max_write).
constexpr int32_t kMaxExtent = 1 << 30;

std::string layer_name(size_t i) { return "layer " + std::to_string(i); }

Status check_layer(const LayerSpec &l, size_t i) {
  if (l.attention.window < 0)
    return Status::error(layer_name(i) + ": sliding window " + std::to_string(l.attention.window) +
                         " is negative (use 0 for full attention, or a window >= 1)");
  if (l.attention.window > kMaxExtent)
    return Status::error(layer_name(i) + ": sliding window " + std::to_string(l.attention.window) +
                         " exceeds the supported maximum " + std::to_string(kMaxExtent));
  const struct {
    const char *what;
    int32_t value;
  } sizes[] = {
      {"KV head count", l.n_kv_heads}, {"K head dim", l.k_head_dim}, {"V head dim", l.v_head_dim}};
  for (const auto &s : sizes) {
    if (s.value < 1)
      return Status::error(layer_name(i) + ": " + s.what + " is " + std::to_string(s.value) +
                           ", must be >= 1");
    if (s.value > (1 << 20))
      return Status::error(layer_name(i) + ": " + s.what + " " + std::to_string(s.value) +
                           " is implausibly large (limit 1048576)");
  }
  return ok_status();
}

} // namespace

std::string AttentionKind::describe() const {
  return sliding() ? "sliding window " + std::to_string(window) : std::string("full attention");
}

Result<Geometry> Geometry::build(std::span<const LayerSpec> layers, int32_t n_kv_shared_layers) {
  const size_t n = layers.size();
  if (n == 0) return Status::error("geometry: the model declares no layers");
  if (n > size_t(std::numeric_limits<int32_t>::max()))
    return Status::error("geometry: too many layers");
  if (n_kv_shared_layers < 0 || size_t(n_kv_shared_layers) >= n)
    return Status::error("geometry: " + std::to_string(n_kv_shared_layers) +
                         " KV-shared layers out of " + std::to_string(n) +
                         " (must be >= 0 and leave at least one layer with its own cache)");
  for (size_t i = 0; i < n; ++i)
    if (Status s = check_layer(layers[i], i); !s.ok()) return s;

  Geometry g;
  g.n_kv_shared_layers_ = n_kv_shared_layers;
  g.layer_cache_.resize(n);
  // Guard n = 0 explicitly: slicing "all but the last n" must not become "nothing".
  const size_t first_shared = n - size_t(n_kv_shared_layers);
  for (size_t i = 0; i < first_shared; ++i) {
    const LayerSpec &l = layers[i];
    g.layer_cache_[i] = CacheId(g.caches_.size());
    g.caches_.push_back({l.attention, l.n_kv_heads, l.k_head_dim, l.v_head_dim, int32_t(i)});
  }
  for (size_t i = first_shared; i < n; ++i) {
    const LayerSpec &l = layers[i];
    size_t donor = first_shared;
    for (size_t j = first_shared; j-- > 0;) {
      if (layers[j].attention == l.attention) {
        donor = j;
        break;
      }
    }
    if (donor == first_shared)
      return Status::error(layer_name(i) +
                           " shares its KV cache but no layer before the shared "
                           "block (layers 0.." +
                           std::to_string(first_shared - 1) + ") has its " +
                           l.attention.describe() + " to donate it");
    const CacheSpec &d = g.caches_[size_t(g.layer_cache_[donor])];
    if (d.n_kv_heads != l.n_kv_heads || d.k_head_dim != l.k_head_dim ||
        d.v_head_dim != l.v_head_dim)
      return Status::error(layer_name(i) + " shares the cache of " + layer_name(donor) +
                           " but declares " + std::to_string(l.n_kv_heads) + " KV heads x K " +
                           std::to_string(l.k_head_dim) + " / V " + std::to_string(l.v_head_dim) +
                           " against the donor's " + std::to_string(d.n_kv_heads) + " x K " +
                           std::to_string(d.k_head_dim) + " / V " + std::to_string(d.v_head_dim));
    g.layer_cache_[i] = g.layer_cache_[donor];
  }
  return g;
}

} // namespace offgraph::cache
