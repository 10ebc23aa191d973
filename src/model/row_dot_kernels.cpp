#include "model/row_dot_kernels.h"

#include "model/q8_kernel_common.h"

#include "ggml-cpu.h"

#include <immintrin.h>

#include <memory>

namespace offgraph::model::row_dot {
namespace {

using q8_kernel::BlockQ8;
using q8_kernel::f16;
using q8_kernel::f16_table;
using q8_kernel::kBlock;
using q8_kernel::kPrefetchExtra;

// Prefetching: the weight rows of a thread's share are one contiguous region, read a group of
// rows at a time. While a group computes, the region from the next group's start plus
// kPrefetchExtra bytes is asked for into L2, evenly over the group's blocks, so each group finds
// its bytes fetched. The hardware prefetcher alone leaves the loads waiting: on this project's
// Xeon (2 threads, 134 MB of rows of K = 1024, read again and again) a plain 512-byte lead read
// 20-23 GB/s, this 33-37; ggml's dot product 13-14 (docs/cpu-kernels.md).

// ggml's hsum_float_8, in its order of additions.
float sum8(__m256 x) {
  __m128 r = _mm256_extractf128_ps(x, 1);
  r = _mm_add_ps(r, _mm256_castps256_ps128(x));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

// One token's quantized activations as the kernel reads them: per block the 32 values, the f32
// scale, and -128 times each group of four values' sum (the offset below).
// (Types of this file's own: a standard template instantiated here for an outside type, such as
// std::unique_ptr<float[]>, could be the copy the linker keeps for the whole program, built for
// AVX-512.)
struct Scale {
  float d;
};
struct alignas(32) Lanes {
  int32_t v[8];
};
struct Activations {
  const BlockQ8 *q;
  const Scale *d;
  const Lanes *offset;
};

// Weight rows [r0, r0 + R) against M tokens' quantized activations: each (row, token) sum is
// ggml_vec_dot_q8_0_q8_0's (block order, one f32 multiply-add per block of the int32 products,
// sum8), R x M independent chains. The int32 products: ggml forms them as |w| . sign(x, w); here
// (w + 128) . x - 128 sum(x), the same exact int32 per lane with one operation fewer. (x is never
// -128 where the activations are finite: ggml's q8_0 rounds to [-127, 127]. A NaN or infinity
// quantizes to -128, where ggml's sign trick wraps and this form does not: such a row's sum is
// not a number anyway.) The weight's f16 scale comes from a table. Measured
// against the former form (the sign trick, F16C per scale; 285 MB of rows of K = 1024, 2 threads):
// +7-10% for one token, +0-3% for two, +9-12% for three; in rows that stay in L2 62 -> 68 GB/s.
template <int R, int M>
void rows(const uint8_t *w, size_t w_stride, int64_t n, int64_t r0, int64_t n_kb,
          const Activations *x, float *y, size_t y_stride) {
  const float *table = f16_table();
  const __m256i bias = _mm256_set1_epi8(char(0x80));
  __m256 acc[R][M];
  for (int i = 0; i < R; ++i)
    for (int t = 0; t < M; ++t) acc[i][t] = _mm256_setzero_ps();
  const BlockQ8 *row[R];
  for (int i = 0; i < R; ++i)
    row[i] = reinterpret_cast<const BlockQ8 *>(w + size_t(r0 + i) * w_stride);
  // The bytes to prefetch, as offsets from w: never past the weight's last row.
  const int64_t ahead = int64_t(r0 + R) * int64_t(w_stride) + kPrefetchExtra;
  const int64_t ahead_end = int64_t(n) * int64_t(w_stride);
  const int64_t ahead_per_block = (int64_t(R * w_stride) + n_kb - 1) / n_kb;
  for (int64_t b = 0; b < n_kb; ++b) {
    q8_kernel::prefetch_l2(w, ahead + b * ahead_per_block, ahead + (b + 1) * ahead_per_block,
                           ahead_end);
    __m256i qy[M], off[M];
    float dy[M];
    for (int t = 0; t < M; ++t) {
      qy[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(x[t].q[b].qs));
      off[t] = _mm256_load_si256(reinterpret_cast<const __m256i *>(x[t].offset + b));
      dy[t] = x[t].d[b].d;
    }
    for (int i = 0; i < R; ++i) {
      const __m256i qw = _mm256_xor_si256(
          _mm256_loadu_si256(reinterpret_cast<const __m256i *>(row[i][b].qs)), bias);
      const float dw = table[row[i][b].d];
      for (int t = 0; t < M; ++t) {
        const __m256 q = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(off[t], qw, qy[t]));
        acc[i][t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * dy[t]), q, acc[i][t]);
      }
    }
  }
  for (int t = 0; t < M; ++t) {
    float *out = reinterpret_cast<float *>(reinterpret_cast<char *>(y) + size_t(t) * y_stride);
    for (int i = 0; i < R; ++i) out[r0 + i] = sum8(acc[i][t]);
  }
}

// Rows [first, last): groups of R, then one by one.
template <int R, int M>
void range(const uint8_t *w, size_t w_stride, int64_t n, int64_t first, int64_t last, int64_t n_kb,
           const Activations *x, float *y, size_t y_stride) {
  int64_t r = first;
  for (; r + R <= last; r += R) rows<R, M>(w, w_stride, n, r, n_kb, x, y, y_stride);
  for (; r < last; ++r) rows<1, M>(w, w_stride, n, r, n_kb, x, y, y_stride);
}

} // namespace

void multiply(ggml_tensor *dst, int ith, int nth, void *) {
  const ggml_tensor *w = dst->src[0], *x = dst->src[1];
  const int64_t k = w->ne[0], n = w->ne[1], m = x->ne[1], n_kb = k / kBlock;
  GGML_ASSERT(m >= 1 && m <= kMaxTokens); // row_dot_takes' limit (cpu_matmul.cpp checks they agree)
  // Groups of 8 weight rows, split evenly between the threads.
  constexpr int64_t kGroup = 8;
  const int64_t groups = (n + kGroup - 1) / kGroup;
  const int64_t first = groups * ith / nth * kGroup;
  int64_t last = groups * (ith + 1) / nth * kGroup;
  if (last > n) last = n;
  if (first >= last) return; // (a thread without rows quantizes nothing)
  // Each thread quantizes the activations itself (ggml's q8_0 from_float, as its mul_mat does):
  // a few thousand values, against the millions of weight bytes each thread reads, and no
  // second op with a barrier between.
  thread_local std::unique_ptr<BlockQ8[]> quantized;
  thread_local std::unique_ptr<Scale[]> scales;
  thread_local std::unique_ptr<Lanes[]> offsets;
  thread_local int64_t quantized_blocks = 0;
  if (quantized_blocks < m * n_kb) {
    quantized.reset(new BlockQ8[size_t(m * n_kb)]);
    scales.reset(new Scale[size_t(m * n_kb)]);
    offsets.reset(new Lanes[size_t(m * n_kb)]);
    quantized_blocks = m * n_kb;
  }
  const ggml_from_float_t quantize = ggml_get_type_traits_cpu(GGML_TYPE_Q8_0)->from_float;
  const float *table = f16_table();
  const __m256i bias = _mm256_set1_epi8(char(0x80));
  Activations xq[kMaxTokens] = {};
  for (int64_t t = 0; t < m; ++t) {
    BlockQ8 *row = quantized.get() + t * n_kb;
    quantize(reinterpret_cast<const float *>(static_cast<const char *>(x->data) + t * x->nb[1]),
             row, k);
    Scale *d = scales.get() + t * n_kb;
    Lanes *offset = offsets.get() + t * n_kb;
    for (int64_t b = 0; b < n_kb; ++b) {
      d[b].d = table[row[b].d];
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(row[b].qs));
      _mm256_store_si256(reinterpret_cast<__m256i *>(offset + b),
                         _mm256_sub_epi32(_mm256_setzero_si256(),
                                          _mm256_dpbusd_epi32(_mm256_setzero_si256(), bias, q)));
    }
    xq[t] = {row, d, offset};
  }
  const auto *w_data = static_cast<const uint8_t *>(w->data);
  auto *y = static_cast<float *>(dst->data);
  const size_t w_stride = w->nb[1], y_stride = dst->nb[1];
  // Eight rows' chains for one token, four rows' for two or three (their accumulators and
  // activations fill the 32 vector registers).
  if (m == 1)
    range<8, 1>(w_data, w_stride, n, first, last, n_kb, xq, y, y_stride);
  else if (m == 2)
    range<4, 2>(w_data, w_stride, n, first, last, n_kb, xq, y, y_stride);
  else
    range<4, 3>(w_data, w_stride, n, first, last, n_kb, xq, y, y_stride);
}

} // namespace offgraph::model::row_dot
