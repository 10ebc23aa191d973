#include "kv/grouped_attention.h"

#include "base/simd8.h"
#include "kv/row_convert.h"

#include "ggml-cpu.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace offgraph::kv {
namespace {

using namespace simd;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

float dot(const float *a, const float *b, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// sc[h * stride + j] = q_h . k_j for H queries (q_h at q + h * q_stride) at once, each K row
// loaded once for all of them, with A accumulators per query over interleaved 8-float blocks so
// that H * A independent FMA chains are in flight; d a multiple of 8 * A.
template <int H, int A>
void dot_heads(const float *q, int64_t q_stride, const float *const *k_rows, int64_t n, int64_t d,
               float *sc, int64_t stride) {
  for (int64_t j = 0; j < n; ++j) {
    const float *kr = k_rows[j];
    f32x8 acc[H][A] = {};
    for (int64_t i = 0; i < d; i += 8 * A)
      for (int a = 0; a < A; ++a) {
        const f32x8 kv = load8(kr + i + 8 * a);
        for (int h = 0; h < H; ++h) acc[h][a] += load8(q + h * q_stride + i + 8 * a) * kv;
      }
    for (int h = 0; h < H; ++h) {
      f32x8 t = acc[h][0];
      for (int a = 1; a < A; ++a) t += acc[h][a];
      sc[h * stride + j] = sum8(t);
    }
  }
}

// The largest of x[0, n).
float max_of(const float *x, int64_t n) {
  f32x8 m = splat8(kNegInf);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const f32x8 v = load8(x + j);
    m = select8(v > m, v, m);
  }
  float mx = kNegInf;
  for (int l = 0; l < 8; ++l) mx = std::max(mx, m[l]);
  for (; j < n; ++j) mx = std::max(mx, x[j]);
  return mx;
}

// x[j] = exp(x[j] - mx) for j < n; returns their sum, added in row order: the rows are those
// some token of the span sees, so a token's sum must not depend on which other rows are there
// (adding the exact zeros of hidden rows changes nothing, a lane position would): a token gives
// the same bits decoded alone or in a span (speculative verification, chunked decode).
float exp_minus_max(float *x, int64_t n, float mx) {
  const f32x8 m = splat8(mx);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const f32x8 e = exp8(load8(x + j) - m);
    std::memcpy(x + j, &e, sizeof e);
  }
  if (j < n) { // the tail through the same function, so that every value rounds alike
    float tail[8];
    for (int l = 0; l < 8; ++l) tail[l] = j + l < n ? x[j + l] - mx : kNegInf;
    const f32x8 e = exp8(load8(tail));
    for (int l = 0; j + l < n; ++l) x[j + l] = e[l];
  }
  float total = 0.0f;
  for (j = 0; j < n; ++j) total += x[j];
  return total;
}

// acc[0, 64) += sum_j p[j] * v_j[0, 64): eight accumulators held in registers across the rows.
void accumulate64(const float *p, const float *const *v_rows, int64_t n, int64_t offset,
                  float *acc) {
  f32x8 a[8];
  for (int i = 0; i < 8; ++i) a[i] = load8(acc + 8 * i);
  for (int64_t j = 0; j < n; ++j) {
    if (p[j] == 0.0f) continue;
    const f32x8 w = {p[j], p[j], p[j], p[j], p[j], p[j], p[j], p[j]};
    const float *vr = v_rows[j] + offset;
    for (int i = 0; i < 8; ++i) a[i] += w * load8(vr + 8 * i);
  }
  for (int i = 0; i < 8; ++i) std::memcpy(acc + 8 * i, &a[i], sizeof a[i]);
}

// Rows read ahead of the one converted, and the read-ahead of one row: every cache line it
// touches (a row need not start on a line: q8_0 rows of 256 dims are 272 bytes).
constexpr int64_t kPrefetchRows = 4;
inline void prefetch_row(const char *row, int64_t bytes) {
  const auto first = reinterpret_cast<uintptr_t>(row) & ~uintptr_t(63);
  const auto end = reinterpret_cast<uintptr_t>(row) + uintptr_t(bytes);
  for (uintptr_t line = first; line < end; line += 64)
    __builtin_prefetch(reinterpret_cast<const void *>(line), 0, 0);
}

// Scratch of one thread, reused across calls (sizes only grow).
struct Scratch {
  std::vector<float> q, k, v, scores, mask, acc, maxima, sums;
  std::vector<const float *> k_rows, v_rows;
  std::vector<int64_t> kept; // rows of the chunk some token sees
  static Scratch &mine() {
    thread_local Scratch s;
    return s;
  }
};

// The partial result of one (KV head, chunk) for every query of its group: per query a record
// of D_v + 2 floats, {max score, sum of exp(score - max), sum of exp(score - max) * v}.
void partial_op(ggml_tensor *dst, int ith, int nth, void *userdata) {
  const auto &params = *static_cast<const GroupedAttentionParams *>(userdata);
  const ggml_tensor *q = dst->src[0], *k = dst->src[1], *v = dst->src[2], *mask = dst->src[3];
  const int64_t d_k = k->ne[0], d_v = v->ne[0], n_rows = k->ne[1], h_kv = k->ne[2];
  const int64_t h_q = q->ne[1], n_tok = q->ne[2], group = h_q / h_kv;
  const int64_t n_chunks = dst->ne[3], n_queries = group * n_tok;
  Scratch &s = Scratch::mine();
  const int64_t chunk_cap = params.chunk_rows;
  s.q.resize(size_t(n_queries * d_k));
  s.k.resize(size_t(chunk_cap * d_k));
  // V is converted a tile of rows at a time (see below): 24 KiB of f32, at least 8 rows.
  const int64_t v_tile = std::min(chunk_cap, std::max<int64_t>(8, 6144 / d_v));
  s.v.resize(size_t(v_tile * d_v));
  s.scores.resize(size_t(n_queries * chunk_cap));
  s.mask.resize(size_t(n_tok * chunk_cap));
  s.k_rows.resize(size_t(chunk_cap));
  s.v_rows.resize(size_t(chunk_cap));
  s.kept.resize(size_t(chunk_cap));
  s.maxima.resize(size_t(n_queries));
  s.sums.resize(size_t(n_queries));
  const float **k_rows = s.k_rows.data(), **v_rows = s.v_rows.data();
  float *maxima = s.maxima.data(), *sums = s.sums.data();

  for (int64_t item = ith; item < h_kv * n_chunks; item += nth) {
    const int64_t g = item % h_kv, chunk = item / h_kv;
    const int64_t r0 = chunk * chunk_cap, n = std::min(chunk_cap, n_rows - r0);
    // Queries of the group, scaled: query (t, h) at s.q[(t * group + h) * d_k].
    for (int64_t t = 0; t < n_tok; ++t)
      for (int64_t h = 0; h < group; ++h) {
        const float *src = reinterpret_cast<const float *>(
            static_cast<const char *>(q->data) + t * q->nb[2] + (g * group + h) * q->nb[1]);
        float *out = s.q.data() + (t * group + h) * d_k;
        for (int64_t d = 0; d < d_k; ++d) out[d] = src[d] * params.scale;
      }
    // The mask of the chunk's rows, per token (none: every row visible, nothing to add).
    if (mask)
      for (int64_t t = 0; t < n_tok; ++t)
        ggml_cpu_fp16_to_fp32(reinterpret_cast<const ggml_fp16_t *>(
                                  static_cast<const char *>(mask->data) + t * mask->nb[1]) +
                                  r0,
                              s.mask.data() + t * chunk_cap, n);
    // Rows hidden from every token (a ring's slots outside the window or not yet written, pool
    // rows of other sequences) weigh 0 for every query: they are neither converted nor scored.
    // The chunk's rows are compacted to those some token sees (the mask with them), in order.
    int64_t n_seen = n;
    if (mask) {
      n_seen = 0;
      for (int64_t j = 0; j < n; ++j) {
        bool seen = false;
        for (int64_t t = 0; t < n_tok && !seen; ++t)
          seen = s.mask[size_t(t * chunk_cap + j)] != kNegInf;
        if (!seen) continue;
        for (int64_t t = 0; t < n_tok; ++t)
          s.mask[size_t(t * chunk_cap + n_seen)] = s.mask[size_t(t * chunk_cap + j)];
        s.kept[size_t(n_seen++)] = r0 + j;
      }
    } else {
      for (int64_t j = 0; j < n; ++j) s.kept[size_t(j)] = r0 + j;
    }
    const int64_t *kept = s.kept.data();
    // K rows once, then every query's scores. The rows of a few rows ahead are prefetched: the
    // conversion is otherwise bound on each row's load from memory.
    auto k_row = [&](int64_t j) {
      return static_cast<const char *>(k->data) + params.rows(kept[j]) * k->nb[1] + g * k->nb[2];
    };
    const int64_t k_bytes = int64_t(ggml_row_size(k->type, d_k));
    for (int64_t j = 0; j < n_seen; ++j) {
      if (j + kPrefetchRows < n_seen) prefetch_row(k_row(j + kPrefetchRows), k_bytes);
      k_rows[j] = row_to_f32(k->type, k_row(j), s.k.data() + j * d_k, d_k);
    }
    for (int64_t t = 0; t < n_tok; ++t) {
      const float *qt = s.q.data() + t * group * d_k;
      float *st = s.scores.data() + t * group * chunk_cap;
      // Four heads at a time; the rest (groups of 1 to 3: MHA, 8:4 GQA) two or one at a time with
      // more accumulators each.
      int64_t h = 0;
      if (d_k % 8 == 0)
        for (; h + 4 <= group; h += 4)
          dot_heads<4, 1>(qt + h * d_k, d_k, k_rows, n_seen, d_k, st + h * chunk_cap, chunk_cap);
      if (d_k % 16 == 0)
        for (; h + 2 <= group; h += 2)
          dot_heads<2, 2>(qt + h * d_k, d_k, k_rows, n_seen, d_k, st + h * chunk_cap, chunk_cap);
      if (d_k % 32 == 0)
        for (; h < group; ++h)
          dot_heads<1, 4>(qt + h * d_k, d_k, k_rows, n_seen, d_k, st + h * chunk_cap, chunk_cap);
      if (d_k % 8 == 0)
        for (; h < group; ++h)
          dot_heads<1, 1>(qt + h * d_k, d_k, k_rows, n_seen, d_k, st + h * chunk_cap, chunk_cap);
      for (; h < group; ++h)
        for (int64_t j = 0; j < n_seen; ++j)
          st[h * chunk_cap + j] = dot(qt + h * d_k, k_rows[j], d_k);
      if (mask) { // -inf (hidden) + a finite score = -inf
        const float *m = s.mask.data() + t * chunk_cap;
        for (h = 0; h < group; ++h)
          for (int64_t j = 0; j < n_seen; ++j) st[h * chunk_cap + j] += m[j];
      }
    }
    // Softmax numerators against the chunk's own maximum.
    for (int64_t query = 0; query < n_queries; ++query) {
      float *sc = s.scores.data() + query * chunk_cap;
      const float mx = max_of(sc, n_seen);
      float sum = 0.0f;
      if (mx != kNegInf)
        sum = exp_minus_max(sc, n_seen, mx);
      else
        std::fill(sc, sc + n_seen, 0.0f);
      maxima[query] = mx, sums[query] = sum;
    }
    // V rows once (those some query sees), then every query's weighted sum, a tile of rows at a
    // time: each query reads the tile once per 64-wide block, so the tile (24 KiB of f32) stays
    // in L1 for all of them instead of the whole chunk streaming from L2 that many times (at
    // head size 256, 8 passes over 256 KiB per chunk for a group of 2). Each sum adds its rows of
    // weight above 0 in row order, as without tiles or compaction.
    s.acc.assign(size_t(n_queries * d_v), 0.0f);
    const int64_t v_bytes = int64_t(ggml_row_size(v->type, d_v));
    for (int64_t j0 = 0; j0 < n_seen; j0 += v_tile) {
      const int64_t j1 = std::min(n_seen, j0 + v_tile);
      for (int64_t j = j0; j < j1; ++j) {
        if (j + kPrefetchRows < n_seen)
          prefetch_row(static_cast<const char *>(v->data) +
                           params.rows(kept[j + kPrefetchRows]) * v->nb[1] + g * v->nb[2],
                       v_bytes);
        bool seen = false;
        for (int64_t query = 0; query < n_queries && !seen; ++query)
          seen = s.scores[size_t(query * chunk_cap + j)] != 0.0f;
        v_rows[j] = seen ? row_to_f32(v->type,
                                      static_cast<const char *>(v->data) +
                                          params.rows(kept[j]) * v->nb[1] + g * v->nb[2],
                                      s.v.data() + (j - j0) * d_v, d_v)
                         : nullptr; // masked for every query: weight 0 everywhere, never read
      }
      for (int64_t query = 0; query < n_queries; ++query) {
        const float *p = s.scores.data() + query * chunk_cap;
        float *a = s.acc.data() + query * d_v;
        int64_t d0 = 0;
        for (; d0 + 64 <= d_v; d0 += 64) accumulate64(p + j0, v_rows + j0, j1 - j0, d0, a + d0);
        for (int64_t j = j0; j < j1 && d0 < d_v; ++j)
          if (p[j] != 0.0f)
            for (int64_t d = d0; d < d_v; ++d) a[d] += p[j] * v_rows[j][d];
      }
    }
    for (int64_t t = 0; t < n_tok; ++t)
      for (int64_t h = 0; h < group; ++h) {
        const int64_t query = t * group + h;
        float *rec = reinterpret_cast<float *>(static_cast<char *>(dst->data) + chunk * dst->nb[3] +
                                               t * dst->nb[2] + (g * group + h) * dst->nb[1]);
        rec[0] = maxima[query], rec[1] = sums[query];
        std::memcpy(rec + 2, s.acc.data() + query * d_v, size_t(d_v) * sizeof(float));
      }
  }
}

// out[:, h, t] = sum_c exp(m_c - m) acc_c / sum_c exp(m_c - m) l_c, with m the largest m_c.
void merge_op(ggml_tensor *dst, int ith, int nth, void *) {
  const ggml_tensor *part = dst->src[0];
  const int64_t d_v = dst->ne[0], h_q = dst->ne[1], n_tok = dst->ne[2], n_chunks = part->ne[3];
  for (int64_t item = ith; item < h_q * n_tok; item += nth) {
    const int64_t h = item % h_q, t = item / h_q;
    auto rec = [&](int64_t c) {
      return reinterpret_cast<const float *>(static_cast<const char *>(part->data) +
                                             c * part->nb[3] + t * part->nb[2] + h * part->nb[1]);
    };
    float *out =
        reinterpret_cast<float *>(static_cast<char *>(dst->data) + t * dst->nb[2] + h * dst->nb[1]);
    float mx = kNegInf;
    for (int64_t c = 0; c < n_chunks; ++c) mx = std::max(mx, rec(c)[0]);
    std::fill(out, out + d_v, 0.0f);
    if (mx == kNegInf) continue; // nothing visible (never for a valid plan)
    float total = 0.0f;
    for (int64_t c = 0; c < n_chunks; ++c) {
      const float *r = rec(c);
      if (r[0] == kNegInf) continue;
      const float w = std::exp(r[0] - mx);
      total += w * r[1];
      for (int64_t d = 0; d < d_v; ++d) out[d] += w * r[2 + d];
    }
    const float inv = 1.0f / total;
    for (int64_t d = 0; d < d_v; ++d) out[d] *= inv;
  }
}

} // namespace

ggml_tensor *grouped_attention(ggml_context *ctx, ggml_tensor *q, ggml_tensor *k, ggml_tensor *v,
                               ggml_tensor *mask, const GroupedAttentionParams *params) {
  GGML_ASSERT(q->type == GGML_TYPE_F32 && q->ne[0] == k->ne[0] && k->ne[1] == v->ne[1] &&
              k->ne[2] == v->ne[2] && q->ne[1] % k->ne[2] == 0);
  GGML_ASSERT(!mask ||
              (mask->type == GGML_TYPE_F16 && mask->ne[0] >= k->ne[1] && mask->ne[1] >= q->ne[2]));
  GGML_ASSERT(params && params->chunk_rows > 0);
  const int64_t n_chunks = (k->ne[1] + params->chunk_rows - 1) / params->chunk_rows;
  ggml_tensor *args[4] = {q, k, v, mask};
  ggml_tensor *partial = ggml_custom_4d(
      ctx, GGML_TYPE_F32, v->ne[0] + 2, q->ne[1], q->ne[2], std::max<int64_t>(1, n_chunks), args,
      mask ? 4 : 3, partial_op, GGML_N_TASKS_MAX, const_cast<GroupedAttentionParams *>(params));
  ggml_tensor *merge_args[1] = {partial};
  ggml_tensor *out = ggml_custom_4d(ctx, GGML_TYPE_F32, v->ne[0], q->ne[1], q->ne[2], 1, merge_args,
                                    1, merge_op, GGML_N_TASKS_MAX, nullptr);
  ggml_set_name(out, "grouped_attention"); // profiles and tests tell the kernels apart by name
  return out;
}

} // namespace offgraph::kv
