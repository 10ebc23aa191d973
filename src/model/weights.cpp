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
