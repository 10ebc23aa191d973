// Final-logit soft-capping as one graph op: y = cap * tanh(x * pre), pre = logit_scale / cap
// (Muse Glimmer: logits times logit_scale, then /cap, tanh, *cap).
//
// Why an op of our own: ggml spells it scale, scale, tanh, scale, four passes over the logits,
// and its unary ops divide rows between threads; a decode step has one row of n_vocab, so one
// thread ran every tanh (1.3 ms of a 28 ms decode step on the 0.4B model, 128,256 logits; the
// same in llama.cpp). Here every row is split between the threads and tanh runs 8 lanes at once.
#pragma once

#include "ggml.h"

#include <cstdint>

namespace offgraph::model {

struct SoftcapParams {
  float pre = 1.0f; // logit_scale / cap
  float cap = 0.0f;
};

// logits [n, rows] f32 (contiguous) -> the same shape, capped. `params` must outlive the graph's
// computation (the op reads it then).
ggml_tensor *softcap_logits(ggml_context *ctx, ggml_tensor *logits, const SoftcapParams *params);

// The op's arithmetic on n values (y may equal x): |error| <= 2.5e-7 * cap and <= 4e-7 of the
// value (measured 1.3e-7 and 3.5e-7; libm's tanhf is within ~1e-7) against tanh in double
// precision (tests/model/softcap_test.cpp); NaN stays NaN, +-inf gives +-cap.
void softcap_values(const float *x, float *y, int64_t n, float pre, float cap);

} // namespace offgraph::model
