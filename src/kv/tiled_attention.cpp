#include "kv/tiled_attention.h"

#include "base/simd8.h"
#include "kv/row_convert.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

namespace offgraph::kv {
namespace {

using namespace simd;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int kLanes = 16;
// Query rows (token x head of one group) per block of tokens: four vectors, the columns of a tile.
constexpr int kQueryRows = 64;
constexpr int kVectors = kQueryRows / kLanes;
// K/V rows per tile.
constexpr int kTileRows = 64;
// Rows of a product computed at once: RI x kVectors accumulators plus kVectors operands and a
// broadcast stay in AVX-512's 32 registers.
constexpr int kBlockRows = 4;

// c[i][0, 64) (+)= sum_kk a(i, kk) * b[kk][0, 64) for i < 4, with a(i, kk) = a[i * a_i + kk * a_k]
// broadcast and b's rows kQueryRows floats apart (c's too). Written out by hand: 16 accumulators,
// 4 operands and a broadcast fill 21 of AVX-512's 32 registers, and compilers keep loop-indexed
// accumulator arrays in memory.
template <bool Accumulate>
inline void block_product(float *c, const float *a, int64_t a_i, int64_t a_k, const float *b,
                          int64_t n_k) {
  static_assert(kBlockRows == 4 && kVectors == 4);
  f32x16 c00 = {}, c01 = {}, c02 = {}, c03 = {}, c10 = {}, c11 = {}, c12 = {}, c13 = {};
  f32x16 c20 = {}, c21 = {}, c22 = {}, c23 = {}, c30 = {}, c31 = {}, c32 = {}, c33 = {};
  if (Accumulate) {
    c00 = load16(c), c01 = load16(c + 16), c02 = load16(c + 32), c03 = load16(c + 48);
    c10 = load16(c + 64), c11 = load16(c + 80), c12 = load16(c + 96), c13 = load16(c + 112);
    c20 = load16(c + 128), c21 = load16(c + 144), c22 = load16(c + 160), c23 = load16(c + 176);
    c30 = load16(c + 192), c31 = load16(c + 208), c32 = load16(c + 224), c33 = load16(c + 240);
  }
  const float *a0 = a, *a1 = a + a_i, *a2 = a + 2 * a_i, *a3 = a + 3 * a_i;
  for (int64_t kk = 0; kk < n_k; ++kk, b += kQueryRows) {
    const f32x16 b0 = load16(b), b1 = load16(b + 16), b2 = load16(b + 32), b3 = load16(b + 48);
    const int64_t o = kk * a_k;
    f32x16 x = splat16(a0[o]);
    c00 += x * b0, c01 += x * b1, c02 += x * b2, c03 += x * b3;
    x = splat16(a1[o]);
    c10 += x * b0, c11 += x * b1, c12 += x * b2, c13 += x * b3;
    x = splat16(a2[o]);
    c20 += x * b0, c21 += x * b1, c22 += x * b2, c23 += x * b3;
    x = splat16(a3[o]);
    c30 += x * b0, c31 += x * b1, c32 += x * b2, c33 += x * b3;
  }
  store16(c, c00), store16(c + 16, c01), store16(c + 32, c02), store16(c + 48, c03);
  store16(c + 64, c10), store16(c + 80, c11), store16(c + 96, c12), store16(c + 112, c13);
  store16(c + 128, c20), store16(c + 144, c21), store16(c + 160, c22), store16(c + 176, c23);
  store16(c + 192, c30), store16(c + 208, c31), store16(c + 224, c32), store16(c + 240, c33);
}

// How a tile of rows looks to every token of a block, from the mask.
enum class TileMask { Visible, Hidden, Mixed };

// Mask halves [0, n) of one row: all +-0 (visible), all -inf (hidden), or neither. Four halves a
// word: this runs for every token of a block on every tile.
TileMask classify(const uint16_t *m, int64_t n) {
  constexpr uint64_t kMagnitudes = 0x7FFF7FFF7FFF7FFFull, kHidden = 0xFC00FC00FC00FC00ull;
  uint64_t bits = 0; // bits set in some value other than the sign
  bool all_hidden = true;
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    uint64_t w;
    std::memcpy(&w, m + j, sizeof w);
    bits |= w & kMagnitudes;
    all_hidden = all_hidden && w == kHidden;
  }
  for (; j < n; ++j) {
    bits |= m[j] & 0x7FFFu;
    all_hidden = all_hidden && m[j] == 0xFC00u;
  }
  if (bits == 0) return TileMask::Visible;
  return all_hidden ? TileMask::Hidden : TileMask::Mixed;
}

// One block of tokens of a work item: its queries and what it has accumulated so far.
struct Block {
  int64_t t0 = 0, n_t = 0;  // first token, tokens
  float *q_t = nullptr;     // [D_k][kQueryRows]: the queries, scaled, one per column
  float *o_t = nullptr;     // [D_v][kQueryRows]: weighted sums of V rows
  TileMask *kind = nullptr; // per token, for the current tile
  bool all_visible = true, all_hidden = true;
  f32x16 run_max[kVectors], run_sum[kVectors];
};

// Scratch of one thread, reused across calls (sizes only grow).
struct Scratch {
  std::vector<float> q_t, o_t; // kBlocksPerItem blocks' queries and sums
  std::vector<float> k, v;     // [kTileRows][D]: the tile's rows as f32
  std::vector<float> s_t;      // [kTileRows][kQueryRows]: scores, then probabilities
  std::vector<float> mask_t;   // [kTileRows][kQueryRows]: a mixed tile's mask per query
  std::vector<float> row;      // one mask row as f32
  std::vector<TileMask> kind;  // per token of every block
  static Scratch &mine() {
    thread_local Scratch s;
    return s;
  }
};

// Token blocks per work item, sharing each converted K/V tile: the conversion reads the cache
// from memory (at 16K rows a KV head's rows are 8 MB), so it is paid once per item.
constexpr int kBlocksPerItem = 4;

// Sizes of one call.
struct Shape {
  int64_t d_k, d_v, n_rows, group, block;
};

// Converts rows [r0, r0 + n) of KV head g of `x` (found through `rows`) into `dst`
// ([kTileRows][dim]), zeros after n.
void tile_to_f32(const ggml_tensor *x, const RowMap &rows, int64_t g, int64_t r0, int64_t n,
                 float *dst) {
  const int64_t dim = x->ne[0];
  for (int64_t j = 0; j < n; ++j) {
    const char *src = static_cast<const char *>(x->data) + rows(r0 + j) * x->nb[1] + g * x->nb[2];
    const float *row = row_to_f32(x->type, src, dst + j * dim, dim);
    if (row != dst + j * dim) std::memcpy(dst + j * dim, row, size_t(dim) * sizeof(float));
  }
  std::fill(dst + n * dim, dst + kTileRows * dim, 0.0f);
}

// Adds the tile's mask to the block's scores s_t: token t's row, repeated for its group's heads.
void add_mask(const Block &b, const ggml_tensor *mask, const Shape &sh, int64_t r0, int64_t n,
              Scratch &s) {
  float *mask_t = s.mask_t.data(), *s_t = s.s_t.data();
  for (int64_t t = 0; t < sh.block; ++t) {
    const TileMask kind = t < b.n_t ? b.kind[t] : TileMask::Visible;
    float *row = s.row.data();
    if (kind == TileMask::Mixed)
      row_to_f32(GGML_TYPE_F16,
                 static_cast<const char *>(mask->data) + (b.t0 + t) * mask->nb[1] +
                     r0 * int64_t(sizeof(ggml_fp16_t)),
                 row, n);
    else
      std::fill(row, row + n, kind == TileMask::Hidden ? kNegInf : 0.0f);
    for (int64_t h = 0; h < sh.group; ++h)
      for (int64_t j = 0; j < n; ++j) mask_t[j * kQueryRows + t * sh.group + h] = row[j];
  }
  for (int64_t m = sh.block * sh.group; m < kQueryRows; ++m)
    for (int64_t j = 0; j < n; ++j) mask_t[j * kQueryRows + m] = 0.0f;
  for (int64_t j = 0; j < n; ++j)
    for (int vi = 0; vi < kVectors; ++vi) {
      float *p = s_t + j * kQueryRows + vi * kLanes;
      store16(p, load16(p) + load16(mask_t + j * kQueryRows + vi * kLanes));
    }
}

// One block against one converted tile (n rows from r0): scores, mask, online softmax, V sums.
void attend_tile(Block &b, const ggml_tensor *mask, const Shape &sh, int64_t r0, int64_t n,
                 Scratch &s) {
  float *s_t = s.s_t.data();
  // Scores, transposed: s_t[j][m] = k_j . q_m; rows past the history hidden.
  for (int64_t j = 0; j < kTileRows; j += kBlockRows)
    block_product<false>(s_t + j * kQueryRows, s.k.data() + j * sh.d_k, sh.d_k, 1, b.q_t, sh.d_k);
  for (int64_t j = n; j < kTileRows; ++j)
    std::fill(s_t + j * kQueryRows, s_t + (j + 1) * kQueryRows, kNegInf);
  if (!b.all_visible) add_mask(b, mask, sh, r0, n, s);
  // Online softmax per query column: new running max, rescale what came before.
  for (int vi = 0; vi < kVectors; ++vi) {
    f32x16 mx = b.run_max[vi];
    for (int64_t j = 0; j < n; ++j) {
      const f32x16 x = load16(s_t + j * kQueryRows + vi * kLanes);
      mx = select16(x > mx, x, mx);
    }
    // exp(-inf - -inf) is NaN, which exp16 turns into 0: columns that saw nothing stay 0.
    const f32x16 alpha = exp16(b.run_max[vi] - mx);
    f32x16 sum = {};
    for (int64_t j = 0; j < kTileRows; ++j) {
      float *p = s_t + j * kQueryRows + vi * kLanes;
      const f32x16 e = exp16(load16(p) - mx);
      store16(p, e);
      sum += e;
    }
    b.run_sum[vi] = b.run_sum[vi] * alpha + sum;
    const i32x16 same = mx == b.run_max[vi];
    bool unchanged = true;
    for (int l = 0; l < kLanes; ++l) unchanged = unchanged && same[l];
    if (!unchanged)
      for (int64_t d = 0; d < sh.d_v; ++d) {
        float *o = b.o_t + d * kQueryRows + vi * kLanes;
        store16(o, load16(o) * alpha);
      }
    b.run_max[vi] = mx;
  }
  // o_t[d][m] += sum_j v_j[d] p_t[j][m].
  for (int64_t d = 0; d < sh.d_v; d += kBlockRows)
    block_product<true>(b.o_t + d * kQueryRows, s.v.data() + d, 1, sh.d_v, s_t, kTileRows);
}

void tiled_op(ggml_tensor *dst, int ith, int nth, void *userdata) {
  const auto &params = *static_cast<const TiledAttentionParams *>(userdata);
  const ggml_tensor *q = dst->src[0], *k = dst->src[1], *v = dst->src[2], *mask = dst->src[3];
  const int64_t h_kv = k->ne[2], h_q = q->ne[1], n_tok = q->ne[2];
  Shape sh;
  sh.d_k = k->ne[0], sh.d_v = v->ne[0], sh.n_rows = k->ne[1], sh.group = h_q / h_kv;
  sh.block = std::max<int64_t>(1, kQueryRows / sh.group); // tokens per block
  const int64_t n_blocks = (n_tok + sh.block - 1) / sh.block;
  // Fewer blocks per item when there would be too few items to keep every thread busy.
  const int64_t per_item =
      std::clamp<int64_t>(h_kv * n_blocks / (4 * int64_t(nth)), 1, kBlocksPerItem);
  const int64_t items_per_head = (n_blocks + per_item - 1) / per_item;
  Scratch &s = Scratch::mine();
  s.q_t.resize(size_t(kBlocksPerItem * sh.d_k * kQueryRows));
  s.o_t.resize(size_t(kBlocksPerItem * sh.d_v * kQueryRows));
  s.k.resize(size_t(kTileRows * sh.d_k));
  s.v.resize(size_t(kTileRows * sh.d_v));
  s.s_t.resize(size_t(kTileRows * kQueryRows));
  s.mask_t.resize(size_t(kTileRows * kQueryRows));
  s.row.resize(size_t(kTileRows));
  s.kind.resize(size_t(kBlocksPerItem * sh.block));
  Block blocks[kBlocksPerItem];

  for (int64_t item = ith; item < h_kv * items_per_head; item += nth) {
    const int64_t g = item % h_kv, first = (item / h_kv) * per_item;
    const int64_t nb = std::min(per_item, n_blocks - first);
    for (int64_t bi = 0; bi < nb; ++bi) {
      Block &b = blocks[bi];
      b.t0 = (first + bi) * sh.block, b.n_t = std::min(sh.block, n_tok - b.t0);
      b.q_t = s.q_t.data() + bi * sh.d_k * kQueryRows;
      b.o_t = s.o_t.data() + bi * sh.d_v * kQueryRows;
      b.kind = s.kind.data() + bi * sh.block;
      // Query column m = t * group + h; columns past the block's queries stay 0.
      std::fill(b.q_t, b.q_t + sh.d_k * kQueryRows, 0.0f);
      for (int64_t t = 0; t < b.n_t; ++t)
        for (int64_t h = 0; h < sh.group; ++h) {
          const float *src = reinterpret_cast<const float *>(static_cast<const char *>(q->data) +
                                                             (b.t0 + t) * q->nb[2] +
                                                             (g * sh.group + h) * q->nb[1]);
          const int64_t m = t * sh.group + h;
          for (int64_t d = 0; d < sh.d_k; ++d) b.q_t[d * kQueryRows + m] = src[d] * params.scale;
        }
      for (int vi = 0; vi < kVectors; ++vi)
        b.run_max[vi] = splat16(kNegInf), b.run_sum[vi] = f32x16{};
      std::fill(b.o_t, b.o_t + sh.d_v * kQueryRows, 0.0f);
    }

    for (int64_t r0 = 0; r0 < sh.n_rows; r0 += kTileRows) {
      const int64_t n = std::min<int64_t>(kTileRows, sh.n_rows - r0);
      // What the tile is to each token of each block.
      bool every_block_hidden = true;
      for (int64_t bi = 0; bi < nb; ++bi) {
        Block &b = blocks[bi];
        b.all_visible = true, b.all_hidden = !!mask;
        if (mask)
          for (int64_t t = 0; t < b.n_t; ++t) {
            const auto *m = reinterpret_cast<const uint16_t *>(
                                static_cast<const char *>(mask->data) + (b.t0 + t) * mask->nb[1]) +
                            r0;
            b.kind[t] = classify(m, n);
            b.all_visible = b.all_visible && b.kind[t] == TileMask::Visible;
            b.all_hidden = b.all_hidden && b.kind[t] == TileMask::Hidden;
          }
        every_block_hidden = every_block_hidden && b.all_hidden;
      }
      if (every_block_hidden) continue; // no query of the item sees a row of it
      tile_to_f32(k, params.rows, g, r0, n, s.k.data());
      tile_to_f32(v, params.rows, g, r0, n, s.v.data());
      for (int64_t bi = 0; bi < nb; ++bi)
        if (!blocks[bi].all_hidden) attend_tile(blocks[bi], mask, sh, r0, n, s);
    }

    // Out: each query's weighted sum over its softmax denominator.
    for (int64_t bi = 0; bi < nb; ++bi) {
      const Block &b = blocks[bi];
      float sums[kQueryRows];
      for (int vi = 0; vi < kVectors; ++vi) store16(sums + vi * kLanes, b.run_sum[vi]);
      for (int64_t t = 0; t < b.n_t; ++t)
        for (int64_t h = 0; h < sh.group; ++h) {
          const int64_t m = t * sh.group + h;
          float *out =
              reinterpret_cast<float *>(static_cast<char *>(dst->data) + (b.t0 + t) * dst->nb[2] +
                                        (g * sh.group + h) * dst->nb[1]);
          const float inv = sums[m] > 0.0f ? 1.0f / sums[m] : 0.0f;
          for (int64_t d = 0; d < sh.d_v; ++d) out[d] = b.o_t[d * kQueryRows + m] * inv;
        }
    }
  }
}

} // namespace

bool tiled_attention_applies(int64_t group, int64_t d_k, int64_t d_v, ggml_type k, ggml_type v) {
  return d_k % kBlockRows == 0 && d_v % kBlockRows == 0 && group >= 1 && group <= kQueryRows &&
         has_row_conversion(k) && has_row_conversion(v);
}

ggml_tensor *tiled_attention(ggml_context *ctx, ggml_tensor *q, ggml_tensor *k, ggml_tensor *v,
                             ggml_tensor *mask, const TiledAttentionParams *params) {
  GGML_ASSERT(q->type == GGML_TYPE_F32 && q->ne[0] == k->ne[0] && k->ne[1] == v->ne[1] &&
              k->ne[2] == v->ne[2] && q->ne[1] % k->ne[2] == 0 && q->nb[0] == sizeof(float));
  GGML_ASSERT(!mask ||
              (mask->type == GGML_TYPE_F16 && mask->ne[0] >= k->ne[1] && mask->ne[1] >= q->ne[2]));
  GGML_ASSERT(params &&
              tiled_attention_applies(q->ne[1] / k->ne[2], k->ne[0], v->ne[0], k->type, v->type));
  ggml_tensor *args[4] = {q, k, v, mask};
  ggml_tensor *out =
      ggml_custom_4d(ctx, GGML_TYPE_F32, v->ne[0], q->ne[1], q->ne[2], 1, args, mask ? 4 : 3,
                     tiled_op, GGML_N_TASKS_MAX, const_cast<TiledAttentionParams *>(params));
  ggml_set_name(out, "tiled_attention"); // profiles and tests tell the kernels apart by name
  return out;
}

} // namespace offgraph::kv
