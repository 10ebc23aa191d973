// Llama 3 (general.architecture = llama): pre-norm blocks, GQA, RoPE (NORM mode, with the
// optional Llama 3.1 frequency factors and linear scaling) on every layer, SwiGLU, optional
// projection and FFN biases, a head tied to the embedding when output.weight is absent. No
// sliding window: the same cache code serves it without a special case. Dense only.
#include "model/arch.h"
#include "model/graph.h"
#include "model/weights.h"

namespace offgraph::model {

namespace {

Status read_config(ConfigReader &keys, ModelConfig &c) {
  const std::string &path = keys.file().path();
  int32_t n_expert = 0;
  OFFGRAPH_TRY(keys.u32("expert_count", n_expert, 0, 1 << 16, false));
  if (n_expert > 0)
    return Status::error(path + ": key '" + keys.prefix() +
                         "expert_count' = " + std::to_string(n_expert) +
                         ": mixture-of-experts llama files are not supported (dense only)");
  for (const LayerConfig &l : c.layers) {
    if (l.n_rot != l.head_dim_k) // llama.cpp refuses these too ("invalid n_rot")
      return Status::error(path + ": llama rotates whole heads, but rope.dimension_count = " +
                           std::to_string(l.n_rot) + " and the head dim is " +
                           std::to_string(l.head_dim_k));
    if (l.head_dim_k != l.head_dim_v)
      return Status::error(path + ": llama needs equal K and V head dims, got " +
                           std::to_string(l.head_dim_k) + " and " + std::to_string(l.head_dim_v));
  }
  // llama.cpp's llama graph applies neither; its saver writes 0 (logit_scale) and the hparams
  // default 30 (final_logit_softcapping) into every llama file.
  keys.set_neutral(keys.prefix() + "logit_scale", {0, 1});
  keys.set_neutral(keys.prefix() + "final_logit_softcapping", {0, 30});
  keys.mark_read("rope.freq_base_swa"); // no sliding layers: nothing it could apply to
  OFFGRAPH_TRY(read_sliding_shapes(keys, c, false));
  OFFGRAPH_TRY(same_shape_on_every_layer(keys, c));
  return read_rope_scaling(keys, c);
}

// llama.cpp's llama loader: biases on q, k, v, the attention output and the FFN; the head has
// none (a tied head has no scale either); rope_freqs optional.
Status bind_weights(TensorBinder &b, const ModelConfig &c, Weights &w) {
  const int64_t E = c.n_embd, V = c.n_vocab;
  constexpr Projection kAttn = Projection::Attention, kFfn = Projection::Ffn;
  OFFGRAPH_TRY(b.bind(w.tok_embd, "token_embd.weight", {E, V}, Role::Embedding));
  OFFGRAPH_TRY(b.bind(w.output_norm, "output_norm.weight", {E}, Role::Vector));
  OFFGRAPH_TRY(b.bind(w.output, "output", E, V, Projection::ScaleOnly, false));
  if (!w.output) w.output.w = w.tok_embd; // tied: the embedding is the head
  OFFGRAPH_TRY(
      b.bind(w.rope_freqs, "rope_freqs.weight", {c.layer(0).n_rot / 2}, Role::Vector, false));
  for (int32_t i = 0; i < c.n_layer; ++i) {
    LayerWeights l;
    const LayerConfig &lc = c.layer(i);
    const int64_t F = lc.n_ff;
    const std::string p = "blk." + std::to_string(i) + ".";
    // llama.cpp's per-layer rope_freqs copies are one tensor under other names; none is stored.
    OFFGRAPH_TRY(b.bind(l.attn_norm, p + "attn_norm.weight", {E}, Role::Vector));
    OFFGRAPH_TRY(b.attention_qkv(p, E, lc.q_width(), lc.k_width(), lc.v_width(), l));
    OFFGRAPH_TRY(b.bind(l.wo, p + "attn_output", lc.o_width(), E, kAttn));
    OFFGRAPH_TRY(b.bind(l.ffn_norm, p + "ffn_norm.weight", {E}, Role::Vector));
    OFFGRAPH_TRY(b.bind(l.ffn_gate, p + "ffn_gate", E, F, kFfn));
    OFFGRAPH_TRY(b.bind(l.ffn_up, p + "ffn_up", E, F, kFfn));
    OFFGRAPH_TRY(b.bind(l.ffn_down, p + "ffn_down", F, E, kFfn));
    w.layers.push_back(l);
  }
  return ok_status();
}

Result<ggml_tensor *> build_graph(const GraphBuilder &g) {
  const ModelConfig &c = g.config();
  const Weights &w = g.weights();
  ggml_context *ctx = g.ctx();

  ggml_tensor *x = g.input_rows(w.tok_embd);
  for (int32_t il = 0; il < c.n_layer; ++il) {
    const LayerWeights &l = w.layers[size_t(il)];
    x = g.layer_input(il, x);
    ggml_tensor *a = g.rms_norm(x, l.attn_norm, c.rms_eps);
    auto [q, k, v] = g.project_qkv(il, l, a);
    q = g.rope(q, c.rope(il), w.rope_freqs);
    k = g.rope(k, c.rope(il), w.rope_freqs);
    auto o = g.attend(il, q, k, v, c.attn_scale);
    if (!o.ok()) return o.status();
    if (il == c.n_layer - 1 && g.keeps_logit_rows()) {
      *o = g.logit_rows(*o);
      x = g.logit_rows(x);
    }
    x = ggml_add(ctx, x, l.wo.apply(ctx, *o));
    ggml_tensor *f = g.rms_norm(x, l.ffn_norm, c.rms_eps);
    ggml_tensor *h = ggml_swiglu_split(ctx, l.ffn_gate.apply(ctx, f), l.ffn_up.apply(ctx, f));
    x = ggml_add(ctx, x, l.ffn_down.apply(ctx, h));
  }
  return g.scaled_logits(w.output.apply(ctx, g.rms_norm(x, w.output_norm, c.rms_eps)));
}

} // namespace

const Architecture kLlama = {"llama", nullptr, read_config, bind_weights, build_graph};

} // namespace offgraph::model
