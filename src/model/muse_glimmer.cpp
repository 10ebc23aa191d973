// Muse Glimmer (MUSE_GLIMMER.md §6): weightless embedding norm; per layer a sandwich of norms
// (pre norms at rms_eps, post norms at 1e-8), gated attention with weightless per-head QK-norm
// (the 3.87 factor lives in attn_q_norm), RoPE (NORM mode) on sliding layers only, SwiGLU; then
// the final norm, the head, the logit scale and the tanh soft-cap.
#include "model/model.h"

namespace offgraph::model {

Result<ggml_tensor *> build_muse_glimmer(const Model &model, ggml_context *ctx, const Batch &batch,
                                         const GraphInputs &in, kv::Step &step) {
  const ModelConfig &c = model.config();
  const Weights &w = model.weights();
  const int64_t n = int64_t(batch.tokens.size());
  auto norm = [&](ggml_tensor *x, ggml_tensor *gain, float eps) {
    x = ggml_rms_norm(ctx, x, eps);
    return gain ? ggml_mul(ctx, x, gain) : x;
  };

  const bool keep_rows = int64_t(batch.logit_rows.size()) < n; // else every row is wanted
  ggml_tensor *x = norm(ggml_get_rows(ctx, w.tok_embd, in.tokens), nullptr, c.rms_eps);
  for (int32_t il = 0; il < c.n_layer; ++il) {
    const LayerWeights &l = w.layers[size_t(il)];
    ggml_tensor *a = norm(x, l.attn_norm, c.rms_eps);
    ggml_tensor *q = ggml_reshape_3d(ctx, ggml_mul_mat(ctx, l.wq, a), c.head_dim_k, c.n_head, n);
    ggml_tensor *k = ggml_reshape_3d(ctx, ggml_mul_mat(ctx, l.wk, a), c.head_dim_k, c.n_head_kv, n);
    ggml_tensor *v = ggml_reshape_3d(ctx, ggml_mul_mat(ctx, l.wv, a), c.head_dim_v, c.n_head_kv, n);
    ggml_tensor *gate = ggml_mul_mat(ctx, l.attn_gate, a);
    q = norm(q, l.q_norm, c.rms_eps);
    k = norm(k, l.k_norm, c.rms_eps);
    if (c.sliding[size_t(il)]) {
      q = ggml_rope_ext(ctx, q, in.positions, nullptr, c.n_rot, GGML_ROPE_TYPE_NORMAL,
                        c.n_ctx_train, c.rope_base_swa, 1.0f, 0.0f, 1.0f, 32.0f, 1.0f);
      k = ggml_rope_ext(ctx, k, in.positions, nullptr, c.n_rot, GGML_ROPE_TYPE_NORMAL,
                        c.n_ctx_train, c.rope_base_swa, 1.0f, 0.0f, 1.0f, 32.0f, 1.0f);
    }
    auto o = attend_spans(ctx, batch, step, q, k, v, cache::CacheId(il), c.attn_scale);
    if (!o.ok()) return o.status();
    if (il == c.n_layer - 1 && keep_rows) {
      // Every row's K/V is written by now; past this point only the rows whose logits are
      // wanted matter (a prompt chunk keeps 1 of 512 through the last projection and MLP).
      *o = ggml_get_rows(ctx, *o, in.logit_rows);
      gate = ggml_get_rows(ctx, gate, in.logit_rows);
      x = ggml_get_rows(ctx, x, in.logit_rows);
    }
    ggml_tensor *attn = ggml_mul_mat(ctx, l.wo, ggml_mul(ctx, *o, ggml_sigmoid(ctx, gate)));
    x = ggml_add(ctx, x, norm(attn, l.post_attn_norm, c.post_norm_eps));

    ggml_tensor *f = norm(x, l.ffn_norm, c.rms_eps);
    ggml_tensor *h =
        ggml_swiglu_split(ctx, ggml_mul_mat(ctx, l.ffn_gate, f), ggml_mul_mat(ctx, l.ffn_up, f));
    x = ggml_add(ctx, x, norm(ggml_mul_mat(ctx, l.ffn_down, h), l.post_ffn_norm, c.post_norm_eps));
  }
  ggml_tensor *logits = ggml_mul_mat(ctx, w.output, norm(x, w.output_norm, c.rms_eps));
  // cap * tanh(logits * logit_scale / cap) in one pass (softcap.h says why not ggml's ops).
  if (c.softcap > 0) return softcap_logits(ctx, logits, model.softcap());
  return ggml_scale(ctx, logits, c.logit_scale);
}

} // namespace offgraph::model
