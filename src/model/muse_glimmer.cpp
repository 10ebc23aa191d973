// Muse Glimmer (MUSE_GLIMMER.md §6): weightless embedding norm; per layer a sandwich of norms
// (pre norms at rms_eps, post norms at 1e-8), gated attention with weightless per-head QK-norm
// (the 3.87 factor lives in attn_q_norm), RoPE (NORM mode) on sliding layers only, SwiGLU; then
// the final norm, the head, the logit scale and the tanh soft-cap.
#include "model/arch.h"
#include "model/graph.h"
#include "model/weights.h"

namespace offgraph::model {

namespace {

Status read_config(ConfigReader &keys, ModelConfig &c) {
  const std::string &path = keys.file().path();
  for (const LayerConfig &l : c.layers)
    if (l.head_dim_k != l.head_dim_v)
      return Status::error(path + ": muse-glimmer needs equal K and V head dims, got " +
                           std::to_string(l.head_dim_k) + " and " + std::to_string(l.head_dim_v));
  OFFGRAPH_TRY(keys.f32("rope.freq_base_swa", c.rope_base_swa, 1e-3f, 1e12f, false));
  // Its RoPE layers are the sliding ones, whose frequencies llama.cpp never scales
  // (rope_freq_scale_train_swa is 1): a scaling factor would be ignored there, so none is taken.
  // (rope.scaling.attn_factor it does apply to them.)
  OFFGRAPH_TRY(read_rope_scaling(keys, c));
  if (c.rope_freq_scale != 1.0f)
    return Status::error(path + ": RoPE scaling (factor " +
                         std::to_string(1.0f / c.rope_freq_scale) +
                         ") is not defined for muse-glimmer, whose rotated layers are the sliding "
                         "ones; refusing rather than guessing");
  OFFGRAPH_TRY(keys.u32("attention.sliding_window", c.window, 1, int64_t(1) << 29, true));
  OFFGRAPH_TRY(keys.f32("logit_scale", c.logit_scale, 0.0f, 1e6f, true));
  c.softcap = 30.0f; // llama.cpp's default when the key is absent
  OFFGRAPH_TRY(keys.f32("final_logit_softcapping", c.softcap, 0.0f, 1e6f, false));
  // sliding_window_pattern: a per-layer bool array (true = sliding), or a scalar period n
  // (layer i slides iff i % n < n - 1), or absent (period 4).
  const std::string key = keys.prefix() + "attention.sliding_window_pattern";
  auto arr = keys.bool_array("attention.sliding_window_pattern");
  if (!arr.ok()) return arr.status();
  if (*arr) {
    if (int32_t((*arr)->size()) != c.n_layer)
      return Status::error(path + ": key '" + key + "' has " + std::to_string((*arr)->size()) +
                           " entries for " + std::to_string(c.n_layer) + " layers");
    for (int32_t i = 0; i < c.n_layer; ++i) c.layers[size_t(i)].sliding = (**arr)[size_t(i)];
  } else {
    int32_t period = 4;
    OFFGRAPH_TRY(keys.u32("attention.sliding_window_pattern", period, 1, 4096, false));
    for (int32_t i = 0; i < c.n_layer; ++i) c.layers[size_t(i)].sliding = i % period < period - 1;
  }
  OFFGRAPH_TRY(read_sliding_shapes(keys, c, false));
  return same_shape_on_every_layer(keys, c);
}

// llama.cpp's muse-glimmer loader creates biases only for q, k and v (create_tensor_qkv); the
// other projections take scales only (Projection::ScaleOnly), so any other bias is refused.
// Binding order is the order synth writes tensors in (it plans files from this function).
Status bind_weights(TensorBinder &b, const ModelConfig &c, Weights &w) {
  const int64_t E = c.n_embd, V = c.n_vocab;
  constexpr Projection kScaleOnly = Projection::ScaleOnly;
  OFFGRAPH_TRY(b.bind(w.tok_embd, "token_embd.weight", {E, V}, Role::Embedding));
  OFFGRAPH_TRY(b.bind(w.output_norm, "output_norm.weight", {E}, Role::Vector));
  OFFGRAPH_TRY(b.bind(w.output, "output", E, V, kScaleOnly)); // never tied
  for (int32_t i = 0; i < c.n_layer; ++i) {
    LayerWeights l;
    const LayerConfig &lc = c.layer(i);
    const int64_t F = lc.n_ff;
    const std::string p = "blk." + std::to_string(i) + ".";
    OFFGRAPH_TRY(b.bind(l.attn_norm, p + "attn_norm.weight", {E}, Role::Vector));
    OFFGRAPH_TRY(b.attention_qkv(p, E, lc.q_width(), lc.k_width(), lc.v_width(), l));
    OFFGRAPH_TRY(b.bind(l.attn_gate, p + "attn_gate", E, lc.q_width(), kScaleOnly));
    OFFGRAPH_TRY(b.bind(l.q_norm, p + "attn_q_norm.weight", {lc.head_dim_k}, Role::Vector));
    OFFGRAPH_TRY(b.bind(l.k_norm, p + "attn_k_norm.weight", {lc.head_dim_k}, Role::Vector));
    OFFGRAPH_TRY(b.bind(l.wo, p + "attn_output", lc.o_width(), E, kScaleOnly));
    OFFGRAPH_TRY(b.bind(l.post_attn_norm, p + "post_attention_norm.weight", {E}, Role::Vector));
    OFFGRAPH_TRY(b.bind(l.ffn_norm, p + "ffn_norm.weight", {E}, Role::Vector));
    OFFGRAPH_TRY(b.bind(l.ffn_gate, p + "ffn_gate", E, F, kScaleOnly));
    OFFGRAPH_TRY(b.bind(l.ffn_up, p + "ffn_up", E, F, kScaleOnly));
    OFFGRAPH_TRY(b.bind(l.ffn_down, p + "ffn_down", F, E, kScaleOnly));
    OFFGRAPH_TRY(b.bind(l.post_ffn_norm, p + "post_ffw_norm.weight", {E}, Role::Vector));
    w.layers.push_back(l);
  }
  return ok_status();
}

Result<ggml_tensor *> build_graph(const GraphBuilder &g) {
  const ModelConfig &c = g.config();
  const Weights &w = g.weights();
  ggml_context *ctx = g.ctx();

  // Image rows get this weightless norm too, exactly once (MUSE_GLIMMER.md §7).
  ggml_tensor *x = g.rms_norm(g.input_rows(w.tok_embd), nullptr, c.rms_eps);
  for (int32_t il = 0; il < c.n_layer; ++il) {
    const LayerWeights &l = w.layers[size_t(il)];
    x = g.layer_input(il, x);
    ggml_tensor *a = g.rms_norm(x, l.attn_norm, c.rms_eps);
    auto [q, k, v] = g.project_qkv(il, l, a);
    ggml_tensor *gate = l.attn_gate.apply(ctx, a);
    q = g.rms_norm(q, l.q_norm, c.rms_eps);
    k = g.rms_norm(k, l.k_norm, c.rms_eps);
    if (c.sliding(il)) { // NoPE on global layers
      q = g.rope(q, c.rope(il));
      k = g.rope(k, c.rope(il));
    }
    auto o = g.attend(il, q, k, v, c.attn_scale);
    if (!o.ok()) return o.status();
    if (il == c.n_layer - 1 && g.keeps_logit_rows()) {
      *o = g.logit_rows(*o);
      gate = g.logit_rows(gate);
      x = g.logit_rows(x);
    }
    ggml_tensor *attn = l.wo.apply(ctx, ggml_mul(ctx, *o, ggml_sigmoid(ctx, gate)));
    x = ggml_add(ctx, x, g.rms_norm(attn, l.post_attn_norm, c.post_norm_eps));

    ggml_tensor *f = g.rms_norm(x, l.ffn_norm, c.rms_eps);
    ggml_tensor *h = ggml_swiglu_split(ctx, l.ffn_gate.apply(ctx, f), l.ffn_up.apply(ctx, f));
    x = ggml_add(ctx, x, g.rms_norm(l.ffn_down.apply(ctx, h), l.post_ffn_norm, c.post_norm_eps));
  }
  return g.scaled_logits(w.output.apply(ctx, g.rms_norm(x, w.output_norm, c.rms_eps)));
}

// MUSE_GLIMMER.md section 11.
const RecommendedSampling kSampling = {1.0f, 0.95f, 64, 0.0f};

} // namespace

const Architecture kMuseGlimmer = {"muse-glimmer", &kSampling, read_config, bind_weights,
                                   build_graph};

} // namespace offgraph::model
