#include "model/graph.h"

#include <algorithm>

namespace offgraph::model {

ggml_tensor *GraphBuilder::rms_norm(ggml_tensor *x, ggml_tensor *gain, float eps) const {
  x = ggml_rms_norm(ctx_, x, eps);
  return gain ? ggml_mul(ctx_, x, gain) : x;
}

ggml_tensor *GraphBuilder::input_rows(ggml_tensor *tok_embd) const {
  ggml_tensor *x = ggml_get_rows(ctx_, tok_embd, in_.tokens);
  if (!in_.embeddings) return x;
  return ggml_set_rows(ctx_, x, in_.embeddings, in_.embedding_at);
}

ggml_tensor *GraphBuilder::rope(ggml_tensor *x, const RopeParams &p,
                                ggml_tensor *freq_factors) const {
  // YaRN off: no extrapolation mix; beta_fast/beta_slow are ggml's defaults, unused without it.
  constexpr float kExtFactor = 0.0f, kBetaFast = 32.0f, kBetaSlow = 1.0f;
  return ggml_rope_ext(ctx_, x, in_.positions, freq_factors, p.n_rot, p.mode, p.n_ctx_orig, p.base,
                       p.freq_scale, kExtFactor, p.attn_factor, kBetaFast, kBetaSlow);
}

GraphBuilder::Qkv GraphBuilder::project_qkv(int32_t layer, const LayerWeights &l,
                                            ggml_tensor *x) const {
  const LayerConfig &c = config().layer(layer);
  const int64_t n = n_tokens();
  if (!l.wqkv)
    return {ggml_reshape_3d(ctx_, l.wq.apply(ctx_, x), c.head_dim_k, c.n_head, n),
            ggml_reshape_3d(ctx_, l.wk.apply(ctx_, x), c.head_dim_k, c.n_head_kv, n),
            ggml_reshape_3d(ctx_, l.wv.apply(ctx_, x), c.head_dim_v, c.n_head_kv, n)};
  ggml_tensor *qkv = l.wqkv.apply(ctx_, x); // [QW + KW + VW, n]
  // Contiguous copies of the three row ranges: the attention kernels and set_rows take
  // contiguous heads. Only fused files pay for them. Separate biases beside the fused weight
  // (the binder checked that all three are there) are added to each part.
  auto part = [&](int64_t dim, int64_t heads, int64_t offset, ggml_tensor *bias) {
    ggml_tensor *y =
        ggml_cont(ctx_, ggml_view_3d(ctx_, qkv, dim, heads, n, ggml_row_size(qkv->type, dim),
                                     qkv->nb[1], ggml_row_size(qkv->type, offset)));
    return bias ? ggml_add(ctx_, y, ggml_reshape_2d(ctx_, bias, dim, heads)) : y;
  };
  return {part(c.head_dim_k, c.n_head, 0, l.wq.b),
          part(c.head_dim_k, c.n_head_kv, c.q_width(), l.wk.b),
          part(c.head_dim_v, c.n_head_kv, c.q_width() + c.k_width(), l.wv.b)};
}

Result<ggml_tensor *> GraphBuilder::attend(int32_t layer, ggml_tensor *q, ggml_tensor *k,
                                           ggml_tensor *v, float scale) const {
  const cache::Geometry &geo = model_.geometry();
  const cache::CacheId cache = geo.cache_of_layer(layer);
  if (geo.is_shared_layer(layer)) {
    // A shared layer computes no K/V: the op re-serves its donor's cache with the donor's k and
    // v (CACHE_CONTRACT.md 10), which the step writes only once.
    const auto donor = donor_kv_.find(cache);
    if (k || v || donor == donor_kv_.end())
      return Status::error(
          "layer " + std::to_string(layer) + " shares the cache of layer " +
              std::to_string(geo.cache(cache).owner_layer) +
              (k || v ? " but computed K/V of its own" : ", which the graph has not attended yet"),
          StatusCode::kInternal);
    k = donor->second.first, v = donor->second.second;
  } else {
    if (!k || !v)
      return Status::error("layer " + std::to_string(layer) + " owns a cache but gave no K/V",
                           StatusCode::kInternal);
    donor_kv_[cache] = {k, v};
  }
  ggml_tensor *out = nullptr;
  int64_t t0 = 0;
  for (size_t s = 0; s < batch_.spans.size(); ++s) {
    const int64_t T = batch_.spans[s].n_tokens;
    auto cols = [&](ggml_tensor *x) {
      return ggml_view_3d(ctx_, x, x->ne[0], x->ne[1], T, x->nb[1], x->nb[2],
                          size_t(t0) * x->nb[2]);
    };
    auto o = step_.update_and_attend(ctx_, cols(q), cols(k), cols(v), int32_t(s), cache, scale);
    if (!o.ok()) return o.status();
    out = out ? ggml_concat(ctx_, out, *o, 2) : *o;
    t0 += T;
  }
  return ggml_reshape_2d(ctx_, out, out->ne[0] * out->ne[1], out->ne[2]);
}

ggml_tensor *GraphBuilder::scaled_logits(ggml_tensor *logits) const {
  const ModelConfig &c = config();
  if (c.softcap > 0) {
    if (model_.devices().is_cpu(model_.output_device()))
      return softcap_logits(ctx_, logits, model_.softcap());
    const SoftcapParams &p = *model_.softcap();
    return ggml_scale(ctx_, ggml_tanh(ctx_, ggml_scale(ctx_, logits, p.pre)), p.cap);
  }
  return c.logit_scale == 1.0f ? logits : ggml_scale(ctx_, logits, c.logit_scale);
}

ggml_tensor *GraphBuilder::layer_input(int32_t layer, ggml_tensor *x) const {
  const auto &wanted = batch_.hidden_layers;
  if (hidden_ && std::binary_search(wanted.begin(), wanted.end(), layer)) hidden_->push_back(x);
  return x;
}

} // namespace offgraph::model
