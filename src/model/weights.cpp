#include "model/weights.h"

#include "model/cpu_matmul.h"

#include "ggml-cpu.h"

namespace offgraph::model {

ggml_tensor *Linear::apply(ggml_context *ctx, ggml_tensor *x) const {
  ggml_tensor *y = mul_mat(ctx, w, x);
  if (b && bias_before_scale) y = ggml_add(ctx, y, b);
  if (s) y = ggml_mul(ctx, y, s);
  if (b && !bias_before_scale) y = ggml_add(ctx, y, b);
  return y;
}

namespace {

std::string shape_str(const int64_t *ne, int n) {
  std::string s = "[";
  for (int i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

} // namespace

const std::string &TensorBinder::path() const {
  static const std::string kPlan = "(tensor plan)";
  return file_ ? file_->path() : kPlan;
}

Status TensorBinder::bind(ggml_tensor *&out, const std::string &name, std::vector<int64_t> shape,
                          Role role, bool required) {
  out = nullptr;
  if (!file_) {
    if (required || present_(name)) requests_.push_back({name, std::move(shape), role, required});
    return ok_status();
  }
  const std::string &path = file_->path();
  ggml_tensor *t = file_->tensor(name);
  if (!t) {
    if (!required) return ok_status();
    return Status::error(path + ": tensor '" + name + "' is missing (expected shape " +
                         shape_str(shape.data(), int(shape.size())) + ")");
  }
  bool same = ggml_n_dims(t) <= int(shape.size());
  for (size_t i = 0; i < 4; ++i) same = same && t->ne[i] == (i < shape.size() ? shape[i] : 1);
  if (!same)
    return Status::error(path + ": tensor '" + name + "' has shape " +
                         shape_str(t->ne, ggml_n_dims(t)) + ", expected " +
                         shape_str(shape.data(), int(shape.size())));
  switch (role) {
  case Role::Vector:
    if (t->type != GGML_TYPE_F32)
      return Status::error(path + ": tensor '" + name + "' is " + ggml_type_name(t->type) +
                           ", expected f32 (a norm weight, bias or scale)");
    break;
  case Role::Matrix:
  case Role::Embedding:
    if (!ggml_get_type_traits_cpu(t->type)->vec_dot ||
        (t->type != GGML_TYPE_F32 && !ggml_get_type_traits(t->type)->to_float))
      return Status::error(path + ": tensor '" + name + "' has type " + ggml_type_name(t->type) +
                           ", which ggml's CPU backend cannot multiply");
    break;
  }
  used_.insert(name);
  out = t;
  return ok_status();
}

Status TensorBinder::bind(Linear &out, const std::string &prefix, int64_t in, int64_t n_out,
                          Projection kind, bool required) {
  out = Linear{};
  out.bias_before_scale = kind == Projection::Ffn;
  ggml_tensor *input_scale = nullptr;
  OFFGRAPH_TRY(bind(out.w, prefix + ".weight", {in, n_out}, Role::Matrix, required));
  if (kind != Projection::ScaleOnly)
    OFFGRAPH_TRY(bind(out.b, prefix + ".bias", {n_out}, Role::Vector, false));
  OFFGRAPH_TRY(bind(out.s, prefix + ".scale", {1}, Role::Vector, false));
  OFFGRAPH_TRY(bind(input_scale, prefix + ".input_scale", {1}, Role::Vector, false));
  if (!out.w && (out.b || out.s || input_scale))
    return Status::error(path() + ": '" + prefix + "' has a bias or scale but no '" + prefix +
                         ".weight'");
  // llama.cpp refuses these (build_ffn asserts): its FFN applies the scale after the bias,
  // which is wrong for an NVFP4 weight, whose scale belongs to W.
  if (out.b && out.s && out.bias_before_scale && out.w->type == GGML_TYPE_NVFP4)
    return Status::error(path() + ": '" + prefix +
                         "' is NVFP4 with both a bias and a scale: the order of the two is not "
                         "defined for FFN projections (llama.cpp refuses it too)");
  return ok_status();
}

Status TensorBinder::attention_qkv(const std::string &p, int64_t in, int64_t q_out, int64_t k_out,
                                   int64_t v_out, LayerWeights &l) {
  constexpr Projection kAttn = Projection::Attention;
  if (!has(p + "attn_qkv.weight")) {
    OFFGRAPH_TRY(bind(l.wq, p + "attn_q", in, q_out, kAttn));
    OFFGRAPH_TRY(bind(l.wk, p + "attn_k", in, k_out, kAttn));
    return bind(l.wv, p + "attn_v", in, v_out, kAttn);
  }
  OFFGRAPH_TRY(bind(l.wqkv, p + "attn_qkv", in, q_out + k_out + v_out, kAttn));
  if (has(p + "attn_q.weight") || has(p + "attn_k.weight") || has(p + "attn_v.weight"))
    return Status::error(path() + ": '" + p +
                         "attn_qkv.weight' and separate q/k/v weights: one or the other");
  // Separate biases beside a fused weight (older conversions): all three or none.
  OFFGRAPH_TRY(bind(l.wq.b, p + "attn_q.bias", {q_out}, Role::Vector, false));
  OFFGRAPH_TRY(bind(l.wk.b, p + "attn_k.bias", {k_out}, Role::Vector, false));
  OFFGRAPH_TRY(bind(l.wv.b, p + "attn_v.bias", {v_out}, Role::Vector, false));
  const int n = (l.wq.b != nullptr) + (l.wk.b != nullptr) + (l.wv.b != nullptr);
  if (n != 0 && (n != 3 || l.wqkv.b))
    return Status::error(path() + ": '" + p +
                         "attn_qkv.weight' needs its own bias, or all three of attn_q/k/v.bias");
  return ok_status();
}

Status TensorBinder::finish(const std::string &arch) const {
  if (!file_) return ok_status(); // planning: nothing was looked up
  std::vector<std::string> unused;
  for (ggml_tensor *t = ggml_get_first_tensor(file_->tensors()); t;
       t = ggml_get_next_tensor(file_->tensors(), t))
    if (!used_.count(ggml_get_name(t))) unused.push_back(ggml_get_name(t));
  if (unused.empty()) return ok_status();
  std::string names;
  for (size_t i = 0; i < unused.size() && i < 8; ++i) names += (i ? "', '" : "'") + unused[i];
  names += "'";
  if (unused.size() > 8) names += " and " + std::to_string(unused.size() - 8) + " more";
  return Status::error(file_->path() + ": " + std::to_string(unused.size()) + " tensor" +
                       (unused.size() > 1 ? "s are" : " is") + " not used by offgraph's " + arch +
                       " graph: " + names +
                       "; refusing to compute a different model than the file describes "
                       "(docs/model-files.md lists the tensors each architecture reads)");
}

} // namespace offgraph::model
