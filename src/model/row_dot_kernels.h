// The compute function of the row-dot op (model/cpu_matmul.h), in a file of its own built with
// AVX-512 VNNI: nothing here may run before row_dot_available() said yes.
#pragma once

#include "ggml.h"

#include <cstdint>

namespace offgraph::model::row_dot {

// The most activation rows multiply takes (cpu_matmul.h: kRowDotMaxTokens).
inline constexpr int64_t kMaxTokens = 3;

// dst (f32 [N, M]) = src[0] (q8_0 [K, N]) x src[1] (f32 [K, M], M <= kMaxTokens), each
// token's activations quantized as ggml quantizes them for its q8_0 dot product.
void multiply(ggml_tensor *dst, int ith, int nth, void *userdata);

} // namespace offgraph::model::row_dot
