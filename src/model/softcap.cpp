#include "model/softcap.h"

#include "base/simd8.h"

#include <algorithm>
#include <cstring>

namespace offgraph::model {
namespace {

using namespace simd;

// tanh, 8 lanes: an odd Taylor polynomial below |x| = 0.25 (where 1 - 2 / (e^2x + 1) would lose
// digits to cancellation), 1 - 2 / (e^(2|x|) + 1) up to |x| = 9 (tanh rounds to 1 beyond), the
// sign put back; NaN lanes stay NaN.
inline f32x8 tanh8(f32x8 x) {
  const i32x8 sign_bit = (i32x8)splat8(-0.0f);
  const f32x8 a = (f32x8)((i32x8)x & ~sign_bit);
  const f32x8 clamped = select8(a < splat8(9.0f), a, splat8(9.0f));
  const f32x8 far = splat8(1.0f) - splat8(2.0f) / (exp8(clamped + clamped) + splat8(1.0f));
  const f32x8 a2 = a * a;
  f32x8 p = splat8(62.0f / 2835);
  p = p * a2 - splat8(17.0f / 315);
  p = p * a2 + splat8(2.0f / 15);
  p = p * a2 - splat8(1.0f / 3);
  const f32x8 near = a + a * a2 * p;
  const f32x8 t = select8(a < splat8(0.25f), near, far);
  const f32x8 with_sign = (f32x8)((i32x8)t | ((i32x8)x & sign_bit));
  return select8(x == x, with_sign, x);
}

void softcap_op(ggml_tensor *dst, const ggml_tensor *a, int ith, int nth, void *userdata) {
  const auto *p = static_cast<const SoftcapParams *>(userdata);
  const int64_t n = ggml_nelements(dst);
  // Contiguous slices of 8-aligned length per thread, over all rows at once.
  const int64_t per = ((n + nth - 1) / nth + 7) / 8 * 8;
  const int64_t begin = std::min(n, per * ith), end = std::min(n, begin + per);
  if (begin < end)
    softcap_values(static_cast<const float *>(a->data) + begin,
                   static_cast<float *>(dst->data) + begin, end - begin, p->pre, p->cap);
}

} // namespace

void softcap_values(const float *x, float *y, int64_t n, float pre, float cap) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    store8(y + i, splat8(cap) * tanh8(load8(x + i) * splat8(pre)));
  }
  if (i < n) { // the tail through the same arithmetic, so that every value rounds alike
    float tail[8] = {};
    std::memcpy(tail, x + i, size_t(n - i) * sizeof(float));
    store8(tail, splat8(cap) * tanh8(load8(tail) * splat8(pre)));
    std::memcpy(y + i, tail, size_t(n - i) * sizeof(float));
  }
}

ggml_tensor *softcap_logits(ggml_context *ctx, ggml_tensor *logits, const SoftcapParams *params) {
  if (!ggml_is_contiguous(logits)) logits = ggml_cont(ctx, logits);
  return ggml_map_custom1(ctx, logits, softcap_op, GGML_N_TASKS_MAX,
                          const_cast<SoftcapParams *>(params));
}

} // namespace offgraph::model
