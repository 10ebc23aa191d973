#include "model/model.h"

#include "ggml-cpu.h"

namespace offgraph::model {

namespace {

enum class Role { Matrix, Norm, Embedding };

std::string shape_str(const int64_t *ne, int n) {
  std::string s = "[";
  for (int i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

// Looks a tensor up and checks its shape and type for its role.
Status expect(const GgufFile &f, const std::string &name, std::vector<int64_t> shape, Role role,
              ggml_tensor *&out, bool required = true) {
  ggml_tensor *t = f.tensor(name);
  if (!t) {
    if (!required) return ok_status();
    return Status::error(f.path() + ": tensor '" + name + "' is missing (expected shape " +
                         shape_str(shape.data(), int(shape.size())) + ")");
  }
  bool same = ggml_n_dims(t) <= int(shape.size());
  for (size_t i = 0; i < 4; ++i) same = same && t->ne[i] == (i < shape.size() ? shape[i] : 1);
  if (!same)
    return Status::error(f.path() + ": tensor '" + name + "' has shape " +
                         shape_str(t->ne, ggml_n_dims(t)) + ", expected " +
                         shape_str(shape.data(), int(shape.size())));
  switch (role) {
  case Role::Norm:
    if (t->type != GGML_TYPE_F32)
      return Status::error(f.path() + ": tensor '" + name + "' is " + ggml_type_name(t->type) +
                           ", expected f32 (a norm weight)");
    break;
  case Role::Matrix:
  case Role::Embedding:
    if (!ggml_get_type_traits_cpu(t->type)->vec_dot ||
        (t->type != GGML_TYPE_F32 && !ggml_get_type_traits(t->type)->to_float))
      return Status::error(f.path() + ": tensor '" + name + "' has type " +
                           ggml_type_name(t->type) + ", which ggml's CPU backend cannot multiply");
    break;
  }
  out = t;
  return ok_status();
}

#define TRY(expr)                                                                                  \
  do {                                                                                             \
    if (Status _s = (expr); !_s.ok()) return _s;                                                   \
  } while (0)

Result<Weights> bind_weights(const GgufFile &f, const ModelConfig &c) {
  Weights w;
  const int64_t E = c.n_embd, V = c.n_vocab, F = c.n_ff;
  const int64_t QW = int64_t(c.n_head) * c.head_dim_k, KW = int64_t(c.n_head_kv) * c.head_dim_k,
                VW = int64_t(c.n_head_kv) * c.head_dim_v, OW = int64_t(c.n_head) * c.head_dim_v;
  TRY(expect(f, "token_embd.weight", {E, V}, Role::Embedding, w.tok_embd));
  TRY(expect(f, "output_norm.weight", {E}, Role::Norm, w.output_norm));
  const bool muse = c.arch == Arch::MuseGlimmer;
  // Llama ties the head to the embedding when output.weight is absent; Muse Glimmer never does.
  TRY(expect(f, "output.weight", {E, V}, Role::Matrix, w.output, muse));
  if (!w.output) w.output = w.tok_embd;
  if (!muse) TRY(expect(f, "rope_freqs.weight", {c.n_rot / 2}, Role::Norm, w.rope_freqs, false));
  for (int32_t i = 0; i < c.n_layer; ++i) {
    LayerWeights l;
    const std::string b = "blk." + std::to_string(i) + ".";
    TRY(expect(f, b + "attn_norm.weight", {E}, Role::Norm, l.attn_norm));
    TRY(expect(f, b + "attn_q.weight", {E, QW}, Role::Matrix, l.wq));
    TRY(expect(f, b + "attn_k.weight", {E, KW}, Role::Matrix, l.wk));
    TRY(expect(f, b + "attn_v.weight", {E, VW}, Role::Matrix, l.wv));
    TRY(expect(f, b + "attn_output.weight", {OW, E}, Role::Matrix, l.wo));
    TRY(expect(f, b + "ffn_norm.weight", {E}, Role::Norm, l.ffn_norm));
    TRY(expect(f, b + "ffn_gate.weight", {E, F}, Role::Matrix, l.ffn_gate));
    TRY(expect(f, b + "ffn_up.weight", {E, F}, Role::Matrix, l.ffn_up));
    TRY(expect(f, b + "ffn_down.weight", {F, E}, Role::Matrix, l.ffn_down));
    if (muse) {
      TRY(expect(f, b + "attn_gate.weight", {E, QW}, Role::Matrix, l.attn_gate));
      TRY(expect(f, b + "attn_q_norm.weight", {c.head_dim_k}, Role::Norm, l.q_norm));
      TRY(expect(f, b + "attn_k_norm.weight", {c.head_dim_k}, Role::Norm, l.k_norm));
      TRY(expect(f, b + "post_attention_norm.weight", {E}, Role::Norm, l.post_attn_norm));
      TRY(expect(f, b + "post_ffw_norm.weight", {E}, Role::Norm, l.post_ffn_norm));
    }
    w.layers.push_back(l);
  }
  return w;
}

} // namespace

Result<std::unique_ptr<Model>> Model::open_metadata(const std::string &path) {
  auto file = GgufFile::open(path);
  if (!file.ok()) return file.status();
  std::unique_ptr<Model> m(new Model());
  m->file_ = std::move(file).value();
  auto config = read_config(*m->file_);
  if (!config.ok()) return config.status();
  m->config_ = *config;
  if (m->config_.softcap > 0)
    m->softcap_ = {m->config_.logit_scale / m->config_.softcap, m->config_.softcap};
  auto weights = bind_weights(*m->file_, m->config_);
  if (!weights.ok()) return weights.status();
  m->weights_ = *weights;
  return m;
}

Result<std::unique_ptr<Model>> Model::load(const std::string &path, const Progress &progress) {
  auto m = open_metadata(path);
  if (!m.ok()) return m.status();
  if (Status s = (*m)->file_->map_weights(progress); !s.ok()) return s;
  return m;
}

Result<cache::Geometry> Model::geometry() const {
  auto layers = config_.layer_specs();
  return cache::Geometry::build(layers, 0);
}

int64_t Model::n_params() const {
  int64_t n = 0;
  for (ggml_tensor *t = ggml_get_first_tensor(file_->tensors()); t;
       t = ggml_get_next_tensor(file_->tensors(), t))
    n += ggml_nelements(t);
  return n;
}

Result<ggml_tensor *> build_forward(const Model &model, ggml_context *ctx, const Batch &batch,
                                    const GraphInputs &in, kv::Step &step) {
  switch (model.config().arch) {
  case Arch::MuseGlimmer:
    return build_muse_glimmer(model, ctx, batch, in, step);
  case Arch::Llama:
    return build_llama(model, ctx, batch, in, step);
  }
  return Status::error("unknown architecture");
}

Result<ggml_tensor *> attend_spans(ggml_context *ctx, const Batch &batch, kv::Step &step,
                                   ggml_tensor *q, ggml_tensor *k, ggml_tensor *v,
                                   cache::CacheId cache, float scale) {
  ggml_tensor *out = nullptr;
  int64_t t0 = 0;
  for (size_t s = 0; s < batch.spans.size(); ++s) {
    const int64_t T = batch.spans[s].n_tokens;
    auto cols = [&](ggml_tensor *x) {
      return ggml_view_3d(ctx, x, x->ne[0], x->ne[1], T, x->nb[1], x->nb[2], size_t(t0) * x->nb[2]);
    };
    auto o = step.update_and_attend(ctx, cols(q), cols(k), cols(v), int32_t(s), cache, scale);
    if (!o.ok()) return o.status();
    out = out ? ggml_concat(ctx, out, *o, 2) : *o;
    t0 += T;
  }
  return ggml_reshape_2d(ctx, out, out->ne[0] * out->ne[1], out->ne[2]);
}

} // namespace offgraph::model
