// Gemma 4 (general.architecture = gemma4), dense text models: E2B/E4B shapes with per-layer
// embeddings and their last layers reading the KV of donor layers, and 31B-shaped files. Per
// layer: sliding or global attention with per-kind head sizes and rotation (NEOX RoPE; global
// layers' proportional RoPE through rope_freqs), per-layer KV heads, QK RMSNorm with gains and a
// weightless V norm, attention scale 1, V = K where a layer has no V projection, sandwich norms,
// a GELU-gated MLP, the per-layer embedding's gated residual, and an output scale. Embeddings
// scaled by sqrt(E); final logit soft-cap. Mixture-of-experts files (26B-A4B) are refused.
// Facts: llama.cpp's src/models/gemma4.cpp and conversion/gemma.py in the pinned tree.
#include "model/arch.h"
#include "model/cpu_matmul.h"
#include "model/graph.h"
#include "model/weights.h"

#include <cmath>

namespace offgraph::model {

namespace {

Status read_config(ConfigReader &keys, ModelConfig &c) {
  const std::string &path = keys.file().path();
  const std::string &p = keys.prefix();
  int32_t n_expert = 0;
  OFFGRAPH_TRY(keys.u32("expert_count", n_expert, 0, 1 << 16, false));
  if (n_expert > 0)
    return Status::error(path + ": key '" + p + "expert_count' = " + std::to_string(n_expert) +
                         ": mixture-of-experts gemma4 files (26B-A4B) are not supported yet "
                         "(dense only)");
  keys.set_neutral(p + "expert_used_count", {0});
  keys.set_neutral(p + "expert_feed_forward_length", {0});

  // Which layers slide: a per-layer bool array, required (llama.cpp reads it with get_arr).
  auto pattern = keys.bool_array("attention.sliding_window_pattern");
  if (!pattern.ok()) return pattern.status();
  if (!*pattern)
    return Status::error(path + ": key '" + p +
                         "attention.sliding_window_pattern' (a bool per layer) is missing");
  if (int32_t((*pattern)->size()) != c.n_layer)
    return Status::error(path + ": key '" + p + "attention.sliding_window_pattern' has " +
                         std::to_string((*pattern)->size()) + " entries for " +
                         std::to_string(c.n_layer) + " layers");
  for (int32_t i = 0; i < c.n_layer; ++i) c.layers[size_t(i)].sliding = (**pattern)[size_t(i)];
  OFFGRAPH_TRY(keys.u32("attention.sliding_window", c.window, 1, int64_t(1) << 29, true));
  OFFGRAPH_TRY(read_sliding_shapes(keys, c, true));
  for (size_t i = 0; i < c.layers.size(); ++i)
    if (c.layers[i].head_dim_k != c.layers[i].head_dim_v) // llama.cpp requires it too
      return Status::error(path + ": gemma4 needs equal K and V head sizes; layer " +
                           std::to_string(i) + " has " + std::to_string(c.layers[i].head_dim_k) +
                           " and " + std::to_string(c.layers[i].head_dim_v));

  c.rope_base_swa = 10000.0f; // llama.cpp's default here, not rope.freq_base
  OFFGRAPH_TRY(keys.f32("rope.freq_base_swa", c.rope_base_swa, 1e-3f, 1e12f, false));
  OFFGRAPH_TRY(read_rope_scaling(keys, c));
  c.rope_mode = GGML_ROPE_TYPE_NEOX;
  c.attn_scale = 1.0f; // the QK norms carry the scale
  c.softcap = 30.0f;   // llama.cpp's default when the key is absent
  OFFGRAPH_TRY(keys.f32("final_logit_softcapping", c.softcap, 0.0f, 1e6f, false));
  keys.set_neutral(p + "logit_scale", {0, 1});

  int32_t per_layer = 0;
  OFFGRAPH_TRY(keys.u32("embedding_length_per_layer_input", per_layer, 0, 1 << 16, true));
  c.n_embd_per_layer = per_layer;

  // KV sharing: the last n layers read a donor's cache. Geometry::build takes the last earlier
  // layer of the same kind (transformers' rule); llama.cpp takes layer n_kv - 2 for a sliding and
  // n_kv - 1 for a global one. They agree when the last two layers that own a cache are a
  // sliding one then a global one, as in every released file; a file where they disagree would
  // run another model in llama.cpp than in transformers, and is refused.
  OFFGRAPH_TRY(
      keys.u32("attention.shared_kv_layers", c.n_kv_shared_layers, 0, c.n_layer - 1, false));
  if (c.n_kv_shared_layers > 0) {
    const int32_t n_kv = c.n_layer - c.n_kv_shared_layers;
    if (n_kv < 2 || !c.sliding(n_kv - 2) || c.sliding(n_kv - 1))
      return Status::error(path + ": key '" + p +
                           "attention.shared_kv_layers' = " + std::to_string(c.n_kv_shared_layers) +
                           ": the last two layers that keep their KV (" + std::to_string(n_kv - 2) +
                           ", " + std::to_string(n_kv - 1) +
                           ") must be a sliding then a global one, the donors transformers and "
                           "llama.cpp both choose");
  }
  return ok_status();
}

// llama.cpp's gemma4 loader: no biases; projection scales where a quantizer wrote them. Binding
// order is the order synth writes tensors in (it plans files from this function). Shared
// layers compute Q only: their K (and V) projections and K norm are optional there, checked
// and counted as read when present, never computed.
Status bind_weights(TensorBinder &b, const ModelConfig &c, Weights &w) {
  const int64_t E = c.n_embd, V = c.n_vocab, L = c.n_layer, P = c.n_embd_per_layer;
  constexpr Projection kScaleOnly = Projection::ScaleOnly;
  OFFGRAPH_TRY(b.bind(w.tok_embd, "token_embd.weight", {E, V}, Role::Embedding));
  OFFGRAPH_TRY(b.bind(w.output_norm, "output_norm.weight", {E}, Role::Vector));
  OFFGRAPH_TRY(b.bind(w.output, "output", E, V, kScaleOnly, false));
  if (!w.output) w.output.w = w.tok_embd; // tied: the embedding is the head
  bool any_global = false;
  for (const LayerConfig &l : c.layers) any_global = any_global || !l.sliding;
  if (any_global) { // the global layers' head size: the proportional RoPE's factors
    int32_t global_dim = 0;
    for (const LayerConfig &l : c.layers)
      if (!l.sliding) global_dim = l.head_dim_k;
    OFFGRAPH_TRY(b.bind(w.rope_freqs, "rope_freqs.weight", {global_dim / 2}, Role::Vector));
  }
  if (P > 0) {
    OFFGRAPH_TRY(
        b.bind(w.ple_tok_embd, "per_layer_token_embd.weight", {P * L, V}, Role::Embedding));
    OFFGRAPH_TRY(b.bind(w.ple_model_proj, "per_layer_model_proj.weight", {E, P * L}, Role::Matrix));
    OFFGRAPH_TRY(b.bind(w.ple_proj_norm, "per_layer_proj_norm.weight", {P}, Role::Vector));
  }
  const int32_t first_shared = c.n_layer - c.n_kv_shared_layers;
  for (int32_t i = 0; i < c.n_layer; ++i) {
    LayerWeights l;
    const LayerConfig &lc = c.layer(i);
    const bool owns_kv = i < first_shared;
    const int64_t F = lc.n_ff, D = lc.head_dim_k;
    const std::string p = "blk." + std::to_string(i) + ".";
    OFFGRAPH_TRY(b.bind(l.attn_norm, p + "attn_norm.weight", {E}, Role::Vector));
    if (b.has(p + "attn_qkv.weight")) {
      OFFGRAPH_TRY(b.bind(l.wqkv, p + "attn_qkv", E, lc.q_width() + lc.k_width() + lc.v_width(),
                          kScaleOnly));
    } else {
      OFFGRAPH_TRY(b.bind(l.wq, p + "attn_q", E, lc.q_width(), kScaleOnly));
      OFFGRAPH_TRY(b.bind(l.wk, p + "attn_k", E, lc.k_width(), kScaleOnly, owns_kv));
      OFFGRAPH_TRY(b.bind(l.wv, p + "attn_v", E, lc.v_width(), kScaleOnly, false));
    }
    OFFGRAPH_TRY(b.bind(l.wo, p + "attn_output", lc.o_width(), E, kScaleOnly));
    OFFGRAPH_TRY(b.bind(l.q_norm, p + "attn_q_norm.weight", {D}, Role::Vector));
    OFFGRAPH_TRY(b.bind(l.k_norm, p + "attn_k_norm.weight", {D}, Role::Vector, owns_kv));
    OFFGRAPH_TRY(b.bind(l.post_attn_norm, p + "post_attention_norm.weight", {E}, Role::Vector));
    OFFGRAPH_TRY(b.bind(l.ffn_norm, p + "ffn_norm.weight", {E}, Role::Vector));
    OFFGRAPH_TRY(b.bind(l.ffn_gate, p + "ffn_gate", E, F, kScaleOnly));
    OFFGRAPH_TRY(b.bind(l.ffn_up, p + "ffn_up", E, F, kScaleOnly));
    OFFGRAPH_TRY(b.bind(l.ffn_down, p + "ffn_down", F, E, kScaleOnly));
    OFFGRAPH_TRY(b.bind(l.post_ffn_norm, p + "post_ffw_norm.weight", {E}, Role::Vector));
    if (P > 0) {
      OFFGRAPH_TRY(b.bind(l.ple_gate, p + "inp_gate", E, P, kScaleOnly));
      OFFGRAPH_TRY(b.bind(l.ple_proj, p + "proj", P, E, kScaleOnly));
      OFFGRAPH_TRY(b.bind(l.ple_post_norm, p + "post_norm.weight", {E}, Role::Vector));
    }
    OFFGRAPH_TRY(b.bind(l.out_scale, p + "layer_output_scale.weight", {1}, Role::Vector, false));
    if (!owns_kv) l.wk = l.wv = Linear{}, l.k_norm = nullptr; // read, never computed
    w.layers.push_back(l);
  }
  return ok_status();
}

// The per-layer embeddings' inputs [P, n, L]: each token's row of the per-layer table (scaled by
// sqrt(P)) plus the normed projection of the scaled embedding x (scaled by 1/sqrt(E)), over
// sqrt(2).
ggml_tensor *per_layer_inputs(const GraphBuilder &g, ggml_tensor *x) {
  const ModelConfig &c = g.config();
  const Weights &w = g.weights();
  ggml_context *ctx = g.ctx();
  const int64_t P = c.n_embd_per_layer, L = c.n_layer, n = g.n_tokens();
  ggml_tensor *table = ggml_get_rows(ctx, w.ple_tok_embd, g.token_ids());
  table = ggml_scale(ctx, ggml_reshape_3d(ctx, table, P, L, n), std::sqrt(float(P)));
  ggml_tensor *proj = mul_mat(ctx, w.ple_model_proj, x);
  proj = ggml_reshape_3d(ctx, ggml_scale(ctx, proj, 1.0f / std::sqrt(float(c.n_embd))), P, L, n);
  proj = g.rms_norm(proj, w.ple_proj_norm, c.rms_eps);
  ggml_tensor *sum = ggml_scale(ctx, ggml_add(ctx, proj, table), 1.0f / std::sqrt(2.0f));
  return ggml_cont(ctx, ggml_permute(ctx, sum, 0, 2, 1, 3));
}

Result<ggml_tensor *> build_graph(const GraphBuilder &g) {
  const ModelConfig &c = g.config();
  const Weights &w = g.weights();
  ggml_context *ctx = g.ctx();
  const int64_t n = g.n_tokens();
  const int32_t first_shared = c.n_layer - c.n_kv_shared_layers;

  ggml_tensor *x = ggml_scale(ctx, g.input_rows(w.tok_embd), std::sqrt(float(c.n_embd)));
  ggml_tensor *ple = c.n_embd_per_layer > 0 ? per_layer_inputs(g, x) : nullptr;
  for (int32_t il = 0; il < c.n_layer; ++il) {
    const LayerWeights &l = w.layers[size_t(il)];
    const LayerConfig &lc = c.layer(il);
    const RopeParams rope = c.rope(il);
    ggml_tensor *freqs = lc.sliding ? nullptr : w.rope_freqs;
    x = g.layer_input(il, x);
    ggml_tensor *a = g.rms_norm(x, l.attn_norm, c.rms_eps);

    ggml_tensor *q = nullptr, *k = nullptr, *v = nullptr;
    if (il < first_shared) {
      if (l.wqkv || l.wv) {
        auto qkv = g.project_qkv(il, l, a);
        q = qkv.q, k = qkv.k, v = qkv.v;
      } else { // no V projection: V is K before the norms
        q = ggml_reshape_3d(ctx, l.wq.apply(ctx, a), lc.head_dim_k, lc.n_head, n);
        k = v = ggml_reshape_3d(ctx, l.wk.apply(ctx, a), lc.head_dim_k, lc.n_head_kv, n);
      }
      k = g.rope(g.rms_norm(k, l.k_norm, c.rms_eps), rope, freqs);
      v = g.rms_norm(v, nullptr, c.rms_eps);
    } else {
      ggml_tensor *proj = l.wqkv ? l.wqkv.apply(ctx, a) : l.wq.apply(ctx, a);
      if (l.wqkv) // the Q rows of the fused product
        proj = ggml_cont(ctx, ggml_view_2d(ctx, proj, lc.q_width(), n, proj->nb[1], 0));
      q = ggml_reshape_3d(ctx, proj, lc.head_dim_k, lc.n_head, n);
    }
    q = g.rope(g.rms_norm(q, l.q_norm, c.rms_eps), rope, freqs);
    auto o = g.attend(il, q, k, v, c.attn_scale);
    if (!o.ok()) return o.status();
    ggml_tensor *layer_ple =
        ple ? ggml_view_2d(ctx, ple, ple->ne[0], n, ple->nb[1], size_t(il) * ple->nb[2]) : nullptr;
    if (il == c.n_layer - 1 && g.keeps_logit_rows()) {
      *o = g.logit_rows(*o);
      x = g.logit_rows(x);
      if (layer_ple) layer_ple = g.logit_rows(layer_ple);
    }
    ggml_tensor *attn = g.rms_norm(l.wo.apply(ctx, *o), l.post_attn_norm, c.rms_eps);
    x = ggml_add(ctx, attn, x);

    ggml_tensor *f = g.rms_norm(x, l.ffn_norm, c.rms_eps);
    ggml_tensor *h = ggml_geglu_split(ctx, l.ffn_gate.apply(ctx, f), l.ffn_up.apply(ctx, f));
    x = ggml_add(ctx, g.rms_norm(l.ffn_down.apply(ctx, h), l.post_ffn_norm, c.rms_eps), x);

    if (layer_ple) {
      ggml_tensor *gate = ggml_gelu(ctx, l.ple_gate.apply(ctx, x));
      ggml_tensor *e = l.ple_proj.apply(ctx, ggml_mul(ctx, gate, layer_ple));
      x = ggml_add(ctx, x, g.rms_norm(e, l.ple_post_norm, c.rms_eps));
    }
    if (l.out_scale) x = ggml_mul(ctx, x, l.out_scale);
  }
  return g.scaled_logits(w.output.apply(ctx, g.rms_norm(x, w.output_norm, c.rms_eps)));
}

// Gemma 4's generation_config.json.
const RecommendedSampling kSampling = {1.0f, 0.95f, 64, 0.0f};

} // namespace

const Architecture kGemma4 = {"gemma4", &kSampling, read_config, bind_weights, build_graph};

} // namespace offgraph::model
