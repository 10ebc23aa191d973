#include "model/weights.h"

#include "ggml-cpu.h"

#include <cmath>

namespace offgraph::model {

ggml_tensor *Linear::apply(ggml_context *ctx, ggml_tensor *x) const {
  ggml_tensor *y = ggml_mul_mat(ctx, w, x);
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

Result<ggml_tensor *> TensorBinder::tensor(const std::string &name, std::vector<int64_t> shape,
                                           Role role, bool required) {
  const std::string &path = file_.path();
  ggml_tensor *t = file_.tensor(name);
  if (!t) {
    if (!required) return static_cast<ggml_tensor *>(nullptr);
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
  return t;
}

Result<Linear> TensorBinder::linear(const std::string &prefix, int64_t in, int64_t out,
                                    bool required) {
  Linear l;
  auto w = tensor(prefix + ".weight", {in, out}, Role::Matrix, required);
  if (!w.ok()) return w.status();
  l.w = *w;
  auto b = tensor(prefix + ".bias", {out}, Role::Vector, false);
  auto s = tensor(prefix + ".scale", {1}, Role::Vector, false);
  auto in_s = tensor(prefix + ".input_scale", {1}, Role::Vector, false);
  for (auto *r : {&b, &s, &in_s})
    if (!r->ok()) return r->status();
  if (!l.w && (*b || *s || *in_s))
    return Status::error(file_.path() + ": '" + prefix + "' has a bias or scale but no '" + prefix +
                         ".weight'");
  l.b = *b;
  l.s = *s;
  return l;
}

Status TensorBinder::attention_qkv(const std::string &p, int64_t in, int64_t q_out, int64_t k_out,
                                   int64_t v_out, LayerWeights &l) {
  const bool fused = has(p + "attn_qkv.weight");
  auto bind = [&](Linear &out, const std::string &name, int64_t n_out) -> Status {
    auto r = linear(p + name, in, n_out);
    if (!r.ok()) return r.status();
    out = *r;
    return ok_status();
  };
  if (!fused) {
    if (Status s = bind(l.wq, "attn_q", q_out); !s.ok()) return s;
    if (Status s = bind(l.wk, "attn_k", k_out); !s.ok()) return s;
    return bind(l.wv, "attn_v", v_out);
  }
  if (Status s = bind(l.wqkv, "attn_qkv", q_out + k_out + v_out); !s.ok()) return s;
  if (has(p + "attn_q.weight") || has(p + "attn_k.weight") || has(p + "attn_v.weight"))
    return Status::error(file_.path() + ": '" + p +
                         "attn_qkv.weight' and separate q/k/v weights: one or the other");
  // Separate biases beside a fused weight (older conversions): all three or none.
  const std::pair<ggml_tensor **, std::pair<const char *, int64_t>> biases[] = {
      {&l.wq.b, {"attn_q.bias", q_out}},
      {&l.wk.b, {"attn_k.bias", k_out}},
      {&l.wv.b, {"attn_v.bias", v_out}}};
  int n = 0;
  for (const auto &[dst, name_len] : biases) {
    auto b = tensor(p + name_len.first, {name_len.second}, Role::Vector, false);
    if (!b.ok()) return b.status();
    *dst = *b;
    n += *b != nullptr;
  }
  if (n != 0 && (n != 3 || l.wqkv.b))
    return Status::error(file_.path() + ": '" + p +
                         "attn_qkv.weight' needs its own bias, or all three of attn_q/k/v.bias");
  return ok_status();
}

Status TensorBinder::finish(const std::string &arch) const {
  std::vector<std::string> unused;
  for (ggml_tensor *t = ggml_get_first_tensor(file_.tensors()); t;
       t = ggml_get_next_tensor(file_.tensors(), t))
    if (!used_.count(ggml_get_name(t))) unused.push_back(ggml_get_name(t));
  if (unused.empty()) return ok_status();
  std::string names;
  for (size_t i = 0; i < unused.size() && i < 8; ++i) names += (i ? "', '" : "'") + unused[i];
  names += "'";
  if (unused.size() > 8) names += " and " + std::to_string(unused.size() - 8) + " more";
  return Status::error(file_.path() + ": " + std::to_string(unused.size()) + " tensor" +
                       (unused.size() > 1 ? "s are" : " is") + " not used by offgraph's " + arch +
                       " graph: " + names +
                       "; refusing to compute a different model than the file describes "
                       "(docs/model-files.md lists the tensors each architecture reads)");
}

} // namespace offgraph::model
