// One cache row of any storage type as f32, for the attention kernels of this folder (built with
// OFFGRAPH_KERNEL_FLAGS, so the F16C path is taken on every x86 CPU made since 2013).
#pragma once

#include "ggml-cpu.h"
#include "ggml.h"

#if defined(__F16C__) && defined(__AVX__)
#include <immintrin.h>
#endif

#include <cstdint>

namespace offgraph::kv {

// n elements of one row of `type` to f32. f32 rows are read in place (returns them).
inline const float *row_to_f32(ggml_type type, const char *src, float *dst, int64_t n) {
  switch (type) {
  case GGML_TYPE_F32:
    return reinterpret_cast<const float *>(src);
  case GGML_TYPE_F16: {
    const auto *h = reinterpret_cast<const ggml_fp16_t *>(src);
    int64_t i = 0;
#if defined(__F16C__) && defined(__AVX__)
    // Inline: ggml's exported row converter is a call per row and slower at 128 elements.
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(dst + i,
                       _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(h + i))));
#endif
    if (i < n) ggml_cpu_fp16_to_fp32(h + i, dst + i, n - i);
    return dst;
  }
  case GGML_TYPE_BF16:
    ggml_cpu_bf16_to_fp32(reinterpret_cast<const ggml_bf16_t *>(src), dst, n);
    return dst;
  default:
    ggml_get_type_traits(type)->to_float(src, dst, n);
    return dst;
  }
}

// Whether row_to_f32 can convert rows of `type`.
inline bool has_row_conversion(ggml_type type) {
  return type == GGML_TYPE_F32 || type == GGML_TYPE_F16 || type == GGML_TYPE_BF16 ||
         ggml_get_type_traits(type)->to_float != nullptr;
}

} // namespace offgraph::kv
