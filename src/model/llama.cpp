// Llama 3 (general.architecture = llama): pre-norm blocks, GQA, RoPE (NORM mode, with the
// optional Llama 3.1 frequency factors and linear scaling) on every layer, SwiGLU, optional
// projection and FFN biases, a head tied to the embedding when output.weight is absent. No
// sliding window: the same cache code serves it without a special case. Dense only.
#include "model/arch.h"

namespace offgraph::model {

namespace {

#define TRY(expr)                                                                                  \
  do {                                                                                             \
    if (Status _s = (expr); !_s.ok()) return _s;                                                   \
  } while (0)

Status read_config(ConfigReader &keys, ModelConfig &c) {
  const std::string &path = keys.file().path();
  int32_t n_expert = 0;
  TRY(keys.u32("expert_count", n_expert, 0, 1 << 16, false));
  if (n_expert > 0)
    return Status::error(path + ": key '" + keys.prefix() +
                         "expert_count' = " + std::to_string(n_expert) +
                         ": mixture-of-experts llama files are not supported (dense only)");
  if (c.n_rot != c.head_dim_k) // llama.cpp refuses these too ("invalid n_rot")
    return Status::error(path + ": llama rotates whole heads, but rope.dimension_count = " +
                         std::to_string(c.n_rot) + " and the head dim is " +
                         std::to_string(c.head_dim_k));
  if (c.head_dim_k != c.head_dim_v)
    return Status::error(path + ": llama needs equal K and V head dims, got " +
                         std::to_string(c.head_dim_k) + " and " + std::to_string(c.head_dim_v));
  // llama.cpp's llama graph applies neither; its saver writes 0 (logit_scale) and the hparams
  // default 30 (final_logit_softcapping) into every llama file.
  keys.set_neutral(keys.prefix() + "logit_scale", {0, 1});
  keys.set_neutral(keys.prefix() + "final_logit_softcapping", {0, 30});
  keys.mark_read("rope.freq_base_swa"); // no sliding layers: nothing it could apply to
  return read_rope_scaling(keys, c);
}

Status bind_weights(TensorBinder &b, const ModelConfig &c, Weights &w) {
  const int64_t E = c.n_embd, V = c.n_vocab, F = c.n_ff;
  const int64_t QW = int64_t(c.n_head) * c.head_dim_k, KW = int64_t(c.n_head_kv) * c.head_dim_k,
                VW = int64_t(c.n_head_kv) * c.head_dim_v, OW = int64_t(c.n_head) * c.head_dim_v;
  auto tensor = [&](ggml_tensor *&out, const std::string &name, std::vector<int64_t> shape,
                    Role role, bool required = true) -> Status {
    auto t = b.tensor(name, std::move(shape), role, required);
    if (!t.ok()) return t.status();
    out = *t;
    return ok_status();
  };
  auto linear = [&](Linear &out, const std::string &prefix, int64_t in, int64_t n_out,
                    bool bias_before_scale, bool required = true) -> Status {
    auto l = b.linear(prefix, in, n_out, required);
    if (!l.ok()) return l.status();
    out = *l;
    out.bias_before_scale = bias_before_scale;
    return ok_status();
  };
  TRY(tensor(w.tok_embd, "token_embd.weight", {E, V}, Role::Embedding));
  TRY(tensor(w.output_norm, "output_norm.weight", {E}, Role::Vector));
  // Without output.weight the head is the embedding (tied), with no scale or bias of its own.
  TRY(linear(w.output, "output", E, V, false, false));
  if (!w.output) w.output.w = w.tok_embd;
  TRY(tensor(w.rope_freqs, "rope_freqs.weight", {c.n_rot / 2}, Role::Vector, false));
  for (int32_t i = 0; i < c.n_layer; ++i) {
    LayerWeights l;
    const std::string p = "blk." + std::to_string(i) + ".";
    // llama.cpp's per-layer rope_freqs copies are one tensor under other names; none is stored.
    TRY(tensor(l.attn_norm, p + "attn_norm.weight", {E}, Role::Vector));
    TRY(b.attention_qkv(p, E, QW, KW, VW, l));
    TRY(linear(l.wo, p + "attn_output", OW, E, false));
    TRY(tensor(l.ffn_norm, p + "ffn_norm.weight", {E}, Role::Vector));
    TRY(linear(l.ffn_gate, p + "ffn_gate", E, F, true));
    TRY(linear(l.ffn_up, p + "ffn_up", E, F, true));
    TRY(linear(l.ffn_down, p + "ffn_down", F, E, true));
    w.layers.push_back(l);
  }
  return ok_status();
}

Result<ggml_tensor *> build_graph(const GraphBuilder &g) {
  const ModelConfig &c = g.config();
  const Weights &w = g.weights();
  ggml_context *ctx = g.ctx();
  const RopeParams rope = c.rope(false);

  ggml_tensor *x = ggml_get_rows(ctx, w.tok_embd, g.token_ids());
  for (int32_t il = 0; il < c.n_layer; ++il) {
    const LayerWeights &l = w.layers[size_t(il)];
    ggml_tensor *a = g.rms_norm(x, l.attn_norm, c.rms_eps);
    auto [q, k, v] = g.project_qkv(l, a);
    q = g.rope(q, rope, w.rope_freqs);
    k = g.rope(k, rope, w.rope_freqs);
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
  return w.output.apply(ctx, g.rms_norm(x, w.output_norm, c.rms_eps));
}

} // namespace

const Architecture kLlama = {"llama", Arch::Llama, read_config, bind_weights, build_graph};

} // namespace offgraph::model
