#include "model/cpu_matmul.h"

#include "model/amx_matmul.h"
#include "model/cpu_features.h"

#include "ggml-backend.h"

#include <atomic>

#if defined(OFFGRAPH_ROW_DOT_KERNELS)
#include "model/row_dot_kernels.h"
static_assert(offgraph::model::kRowDotMaxTokens == offgraph::model::row_dot::kMaxTokens);
#endif

namespace offgraph::model {
namespace {

std::atomic<bool> g_row_dot_enabled{true};

const std::string &row_dot_reason() {
#if defined(OFFGRAPH_ROW_DOT_KERNELS)
  return avx512_vnni_unavailable_reason();
#else
  static const std::string r =
      "this build has no row-dot kernel (it is built on x86-64 Linux with a compiler for "
      "AVX-512 VNNI)";
  return r;
#endif
}

} // namespace

bool row_dot_available() { return row_dot_reason().empty(); }
std::string row_dot_unavailable_reason() { return row_dot_reason(); }
void set_row_dot_enabled(bool enabled) { g_row_dot_enabled = enabled; }
bool row_dot_enabled() { return g_row_dot_enabled && row_dot_available(); }

bool q8_host_pair(const ggml_tensor *w, const ggml_tensor *x) {
  if (w->type != GGML_TYPE_Q8_0 || x->type != GGML_TYPE_F32) return false;
  if (w->ne[2] != 1 || w->ne[3] != 1 || x->ne[2] != 1 || x->ne[3] != 1) return false;
  if (w->ne[0] != x->ne[0]) return false;
  if (w->nb[0] != ggml_type_size(GGML_TYPE_Q8_0) || x->nb[0] != sizeof(float)) return false;
  ggml_backend_buffer_t buffer = w->view_src ? w->view_src->buffer : w->buffer;
  return buffer && ggml_backend_buffer_is_host(buffer);
}

bool row_dot_takes(const ggml_tensor *w, const ggml_tensor *x) {
  return x->ne[1] >= 1 && x->ne[1] <= kRowDotMaxTokens && q8_host_pair(w, x) && row_dot_enabled();
}

ggml_tensor *row_dot_mul_mat(ggml_context *ctx, ggml_tensor *w, ggml_tensor *x) {
#if defined(OFFGRAPH_ROW_DOT_KERNELS)
  ggml_tensor *args[2] = {w, x};
  ggml_tensor *y = ggml_custom_4d(ctx, GGML_TYPE_F32, w->ne[1], x->ne[1], 1, 1, args, 2,
                                  row_dot::multiply, GGML_N_TASKS_MAX, nullptr);
  ggml_set_name(y, "row_dot_mul_mat");
  return y;
#else
  return ggml_mul_mat(ctx, w, x);
#endif
}

ggml_tensor *mul_mat(ggml_context *ctx, ggml_tensor *w, ggml_tensor *x) {
  if (amx_takes(w, x)) return amx_mul_mat(ctx, w, x);
  if (row_dot_takes(w, x)) return row_dot_mul_mat(ctx, w, x);
  return ggml_mul_mat(ctx, w, x);
}

} // namespace offgraph::model
