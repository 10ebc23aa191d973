// Llama 3 (general.architecture = llama): pre-norm blocks, GQA, RoPE (NORM mode, with the
// optional Llama 3.1 frequency factors) on every layer, SwiGLU, a head tied to the embedding when
// output.weight is absent. No sliding window: the same cache code serves it without a special case.
#include "model/model.h"

namespace offgraph::model {

Result<ggml_tensor *> build_llama(const Model &model, ggml_context *ctx, const Batch &batch,
                                  const GraphInputs &in, kv::Step &step) {
  const ModelConfig &c = model.config();
  const Weights &w = model.weights();
  const int64_t n = int64_t(batch.tokens.size());
  auto norm = [&](ggml_tensor *x, ggml_tensor *gain) {
    return ggml_mul(ctx, ggml_rms_norm(ctx, x, c.rms_eps), gain);
  };
  auto rope = [&](ggml_tensor *x) {
    return ggml_rope_ext(ctx, x, in.positions, w.rope_freqs, c.n_rot, GGML_ROPE_TYPE_NORMAL,
                         c.n_ctx_train, c.rope_base, 1.0f, 0.0f, 1.0f, 32.0f, 1.0f);
  };

  const bool keep_rows = int64_t(batch.logit_rows.size()) < n; // else every row is wanted
  ggml_tensor *x = ggml_get_rows(ctx, w.tok_embd, in.tokens);
  for (int32_t il = 0; il < c.n_layer; ++il) {
    const LayerWeights &l = w.layers[size_t(il)];
    ggml_tensor *a = norm(x, l.attn_norm);
    ggml_tensor *q =
        rope(ggml_reshape_3d(ctx, ggml_mul_mat(ctx, l.wq, a), c.head_dim_k, c.n_head, n));
    ggml_tensor *k =
        rope(ggml_reshape_3d(ctx, ggml_mul_mat(ctx, l.wk, a), c.head_dim_k, c.n_head_kv, n));
    ggml_tensor *v = ggml_reshape_3d(ctx, ggml_mul_mat(ctx, l.wv, a), c.head_dim_v, c.n_head_kv, n);
    auto o = attend_spans(ctx, batch, step, q, k, v, cache::CacheId(il), c.attn_scale);
    if (!o.ok()) return o.status();
    if (il == c.n_layer - 1 && keep_rows) { // K/V written: keep only the rows with logits
      *o = ggml_get_rows(ctx, *o, in.logit_rows);
      x = ggml_get_rows(ctx, x, in.logit_rows);
    }
    x = ggml_add(ctx, x, ggml_mul_mat(ctx, l.wo, *o));
    ggml_tensor *f = norm(x, l.ffn_norm);
    ggml_tensor *h =
        ggml_swiglu_split(ctx, ggml_mul_mat(ctx, l.ffn_gate, f), ggml_mul_mat(ctx, l.ffn_up, f));
    x = ggml_add(ctx, x, ggml_mul_mat(ctx, l.ffn_down, h));
  }
  return ggml_mul_mat(ctx, w.output, norm(x, w.output_norm));
}

} // namespace offgraph::model
