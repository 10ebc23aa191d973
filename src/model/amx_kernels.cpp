#include "model/amx_kernels.h"

#include "model/q8_kernel_common.h"

#include "ggml-cpu.h"

#include <immintrin.h>

#include <cstring>
#include <memory>

namespace offgraph::model::amx {
namespace {

using q8_kernel::BlockQ8;
using q8_kernel::f16;
using q8_kernel::f16_table;
using q8_kernel::kBlock; // values per q8_0 block: a tile's K
using q8_kernel::kPrefetchExtra;

constexpr int64_t kTileRows = 16;               // weight rows of an A tile, tokens of a B tile
constexpr size_t kTileBytes = 8 * 64;           // a B tile: 8 rows of 16 tokens x 4 values
constexpr size_t kPacked = kTileBytes + 16 * 4; // and the 16 tokens' scales
constexpr size_t kScales = kTileBytes;          // where those start

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0-1: two A tiles of 16 weight rows x 32 int8 values; 2-3: two B tiles of 32 values x 16
// tokens (VNNI: 8 rows of 64 bytes); 4-7: their four 16 x 16 int32 products. A static, never a
// local: GCC 12's _tile_loadconfig declares an 8-byte read, so the stores to a local
// configuration are dead to it and dropped at -O3 (what crashes llama.cpp's AMX path here:
// docs/peer.md).
const TileConfig &tile_config() {
  static const TileConfig config = [] {
    TileConfig c;
    for (int t = 0; t < 2; ++t) c.rows[t] = 16, c.colsb[t] = 32;
    for (int t = 2; t < 4; ++t) c.rows[t] = 8, c.colsb[t] = 64;
    for (int t = 4; t < 8; ++t) c.rows[t] = 16, c.colsb[t] = 64;
    return c;
  }();
  return config;
}

// This file is built for AMX and AVX-512. A template of the standard library instantiated here
// (std::min<int64_t>, a std::vector<T> of an outside T) is an inline function the linker may keep
// from this object for the whole program, and run on CPUs without those instructions: so only
// helpers of this file's own, and buffers of types local to it.
int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
int64_t clamp64(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : x > hi ? hi : x; }

struct PairScales { // one block's f32 scales of a pair of 16-row weight blocks
  float of_row[2 * 16];
};

// Block j's scale of weight row r.
float weight_scale(const float *table, const uint8_t *w_data, size_t w_stride, int64_t r,
                   int64_t j) {
  uint16_t d;
  std::memcpy(&d, w_data + size_t(r) * w_stride + size_t(j) * sizeof(BlockQ8), 2);
  return table[d];
}

// The A tile of weight rows [r0, r0 + rows) at block j: straight from the rows (the 32 values
// after the block's scale, at the row stride), or, for fewer than 16 rows, from `pad`, a
// zero-padded copy. Sets the stride to load it with.
const uint8_t *a_tile_source(const uint8_t *w_data, size_t w_stride, int64_t r0, int64_t rows,
                             int64_t j, int8_t (*pad)[32], size_t *stride) {
  const uint8_t *src = w_data + size_t(r0) * w_stride + size_t(j) * sizeof(BlockQ8) + 2;
  *stride = w_stride;
  if (rows == kTileRows) return src;
  std::memset(pad, 0, 16 * 32);
  for (int64_t r = 0; r < rows; ++r) std::memcpy(pad[r], src + r * w_stride, 32);
  *stride = 32;
  return reinterpret_cast<const uint8_t *>(pad);
}

} // namespace

size_t packed_bytes(int64_t k, int64_t m) {
  return size_t((m + kTileRows - 1) / kTileRows) * size_t(k / kBlock) * kPacked;
}

void pack_activations(ggml_tensor *dst, int ith, int nth, void *) {
  const ggml_tensor *x = dst->src[0];
  const int64_t k = x->ne[0], m = x->ne[1], n_kb = k / kBlock;
  const int64_t n_mb = (m + kTileRows - 1) / kTileRows;
  const ggml_from_float_t quantize = ggml_get_type_traits_cpu(GGML_TYPE_Q8_0)->from_float;
  thread_local std::unique_ptr<BlockQ8[]> row; // one token's blocks
  thread_local int64_t row_blocks = 0;
  if (row_blocks < n_kb) row.reset(new BlockQ8[size_t(n_kb)]), row_blocks = n_kb;
  auto *out = static_cast<uint8_t *>(dst->data);
  for (int64_t mb = ith; mb < n_mb; mb += nth) {
    uint8_t *base = out + size_t(mb * n_kb) * kPacked;
    for (int64_t t = 0; t < kTileRows; ++t) {
      const int64_t r = mb * kTileRows + t;
      if (r < m)
        quantize(reinterpret_cast<const float *>(static_cast<const char *>(x->data) + r * x->nb[1]),
                 row.get(), k);
      else
        std::memset(row.get(), 0, size_t(n_kb) * sizeof(BlockQ8)); // padding: scale 0, values 0
      for (int64_t j = 0; j < n_kb; ++j) {
        uint8_t *block = base + size_t(j) * kPacked;
        // VNNI order: tile row q holds values 4q..4q+3 of each of the 16 tokens.
        for (int q = 0; q < 8; ++q)
          std::memcpy(block + q * 64 + t * 4, row[size_t(j)].qs + 4 * q, 4);
        const float scale = f16(row[size_t(j)].d);
        std::memcpy(block + kScales + size_t(t) * 4, &scale, 4);
      }
    }
  }
}

namespace {

// Spans of at most 16 tokens (one B tile: verify spans, short prefill chunks): one 16-row A tile
// at a time, its rows' f32 sums held in registers across the blocks (the general path below
// keeps 4 x 16 x 16 sums in memory and reads and writes each once a block). Even and odd blocks
// use their own tiles and product buffers, and block j's products are scaled while block j + 1's
// tiles compute: read back right after the tile stores, they would wait for those stores to
// retire (tile stores do not forward).
void multiply_one_b_tile(const uint8_t *w_data, size_t w_stride, int64_t n, int64_t n_kb,
                         const uint8_t *packed, int64_t m, float *y, size_t y_stride, int ith,
                         int nth) {
  const int64_t n_blocks = (n + kTileRows - 1) / kTileRows;
  const int64_t first = n_blocks * ith / nth, last = n_blocks * (ith + 1) / nth;
  if (first >= last) return;
  _tile_loadconfig(&tile_config());
  const float *table = f16_table();
  alignas(64) int32_t products[4][16][16]; // [block j % 4][weight row][token]
  alignas(64) int8_t a_pad[2][16][32];
  alignas(64) float sums[16][16];
  const int64_t ahead_end = n * int64_t(w_stride);
  const int64_t ahead_per_block = (int64_t(kTileRows) * int64_t(w_stride) + n_kb - 1) / n_kb;
  for (int64_t blk = first; blk < last; ++blk) {
    const int64_t n0 = blk * kTileRows, rows = min64(kTileRows, n - n0);
    const int64_t ahead = (n0 + kTileRows) * int64_t(w_stride) + kPrefetchExtra;
    __m512 acc[16];
    for (int r = 0; r < 16; ++r) acc[r] = _mm512_setzero_ps();
    auto scale_block = [&](int64_t j) {
      const __m512 x_scale = _mm512_loadu_ps(packed + size_t(j) * kPacked + kScales);
#pragma GCC unroll 16
      for (int r = 0; r < 16; ++r) {
        const float w_scale = r < rows ? weight_scale(table, w_data, w_stride, n0 + r, j) : 0.0f;
        const __m512 p = _mm512_maskz_cvtepi32_ps(0xffff, _mm512_load_si512(products[j & 3][r]));
        acc[r] = _mm512_fmadd_ps(p, _mm512_mul_ps(_mm512_set1_ps(w_scale), x_scale), acc[r]);
      }
    };
    auto a_tile = [&](int64_t j, int8_t(*pad)[32], size_t *stride) {
      return a_tile_source(w_data, w_stride, n0, rows, j, pad, stride);
    };
    // Two blocks at a time, on tiles of their own (A 0 and 1, B 2 and 3, products 4 and 5): the
    // tile unit runs the two chains of load, multiply and store side by side.
    int64_t j = 0;
    for (; j + 2 <= n_kb; j += 2) {
      q8_kernel::prefetch_l2(w_data, ahead + j * ahead_per_block, ahead + (j + 2) * ahead_per_block,
                             ahead_end);
      size_t s0, s1;
      const uint8_t *a0 = a_tile(j, a_pad[0], &s0), *a1 = a_tile(j + 1, a_pad[1], &s1);
      _tile_loadd(0, a0, long(s0));
      _tile_loadd(2, packed + size_t(j) * kPacked, 64);
      _tile_loadd(1, a1, long(s1));
      _tile_loadd(3, packed + size_t(j + 1) * kPacked, 64);
      _tile_zero(4);
      _tile_zero(5);
      _tile_dpbssd(4, 0, 2);
      _tile_dpbssd(5, 1, 3);
      _tile_stored(4, products[j & 3], 64);
      _tile_stored(5, products[(j + 1) & 3], 64);
      if (j >= 2) scale_block(j - 2), scale_block(j - 1);
    }
    if (j >= 2) scale_block(j - 2), scale_block(j - 1);
    if (j < n_kb) { // an odd last block
      size_t s0;
      const uint8_t *a0 = a_tile(j, a_pad[0], &s0);
      _tile_loadd(0, a0, long(s0));
      _tile_loadd(2, packed + size_t(j) * kPacked, 64);
      _tile_zero(4);
      _tile_dpbssd(4, 0, 2);
      _tile_stored(4, products[j & 3], 64);
      scale_block(j);
    }
    for (int r = 0; r < 16; ++r) _mm512_store_ps(sums[r], acc[r]);
    for (int64_t t = 0; t < m; ++t) {
      float *out =
          reinterpret_cast<float *>(reinterpret_cast<char *>(y) + size_t(t) * y_stride) + n0;
      for (int64_t r = 0; r < rows; ++r) out[r] = sums[r][t];
    }
  }
  _tile_release();
}

} // namespace

void multiply(ggml_tensor *dst, int ith, int nth, void *) {
  const ggml_tensor *w = dst->src[0];
  const auto *packed = static_cast<const uint8_t *>(dst->src[1]->data);
  const int64_t k = w->ne[0], n = w->ne[1], m = dst->ne[1], n_kb = k / kBlock;
  const int64_t n_mb = (m + kTileRows - 1) / kTileRows;
  const size_t w_stride = w->nb[1];
  const auto *w_data = static_cast<const uint8_t *>(w->data);
  if (n_mb == 1)
    return multiply_one_b_tile(w_data, w_stride, n, n_kb, packed, m,
                               static_cast<float *>(dst->data), dst->nb[1], ith, nth);
  // Work: pairs of 16-row weight blocks (32 rows), split evenly between the threads.
  const int64_t n_pairs = (n + 2 * kTileRows - 1) / (2 * kTileRows);
  const int64_t first = n_pairs * ith / nth, last = n_pairs * (ith + 1) / nth;
  if (first >= last) return;
  _tile_loadconfig(&tile_config());
  alignas(64) int32_t products[2][4][16][16]; // [block j % 2][2 a + b][weight row][token]
  const float *table = f16_table();
  alignas(64) float acc[4][16][16]; // [2 a + b][weight row][token]
  alignas(64) int8_t a_pad[2][16][32];
  alignas(64) static const uint8_t zero_b[kPacked] = {};
  float *y = static_cast<float *>(dst->data);
  // With more than 32 tokens the pair's weight scales are converted once per pair, not once per
  // 32 tokens (pp512 3-6% faster); with fewer that pass is pure overhead (a 9-token span 1-10%
  // slower), so they are converted where used.
  const bool hoist_scales = n_mb > 2;
  thread_local std::unique_ptr<PairScales[]> scales;
  thread_local int64_t scale_blocks = 0;
  if (hoist_scales && scale_blocks < n_kb)
    scales.reset(new PairScales[size_t(n_kb)]), scale_blocks = n_kb;
  for (int64_t pair = first; pair < last; ++pair) {
    const int64_t n0 = pair * 2 * kTileRows;
    const int64_t rows[2] = {min64(kTileRows, n - n0), clamp64(n - n0 - kTileRows, 0, kTileRows)};
    for (int64_t j = 0; hoist_scales && j < n_kb; ++j)
      for (int64_t r = 0; r < rows[0] + rows[1]; ++r)
        scales[size_t(j)].of_row[r] = weight_scale(table, w_data, w_stride, n0 + r, j);
    // (Offsets from w_data, never past the weight's last row.)
    const int64_t ahead = (n0 + 2 * kTileRows) * int64_t(w_stride) + kPrefetchExtra;
    const int64_t ahead_end = n * int64_t(w_stride);
    const int64_t ahead_per_block = (int64_t(2 * kTileRows) * int64_t(w_stride) + n_kb - 1) / n_kb;
    for (int64_t mb = 0; mb < n_mb; mb += 2) {
      const bool second_b = mb + 1 < n_mb;
      std::memset(acc, 0, sizeof acc);
      // Block j's products, scaled by the weight row's and the token's block scales into the f32
      // sums, as ggml's q8_0 dot product does per block.
      auto scale_block = [&](int64_t j) {
        const uint8_t *b0 = packed + size_t(mb * n_kb + j) * kPacked;
        const uint8_t *b1 = second_b ? packed + size_t((mb + 1) * n_kb + j) * kPacked : zero_b;
        const __m512 x_scale[2] = {_mm512_loadu_ps(b0 + kScales), _mm512_loadu_ps(b1 + kScales)};
        int32_t(*product)[16][16] = products[j & 1];
        for (int a = 0; a < 2; ++a)
          for (int64_t r = 0; r < rows[a]; ++r) {
            const __m512 w_scale = _mm512_set1_ps(
                hoist_scales ? scales[size_t(j)].of_row[a * kTileRows + r]
                             : weight_scale(table, w_data, w_stride, n0 + a * kTileRows + r, j));
            for (int b = 0; b < (second_b ? 2 : 1); ++b) {
              float *sum = acc[2 * a + b][r];
              // (The zero-masked conversion: GCC 12 warns that the plain one's undefined
              // pass-through may be used uninitialized.)
              const __m512 p =
                  _mm512_maskz_cvtepi32_ps(0xffff, _mm512_load_si512(product[2 * a + b][r]));
              _mm512_store_ps(
                  sum, _mm512_fmadd_ps(p, _mm512_mul_ps(w_scale, x_scale[b]), _mm512_load_ps(sum)));
            }
          }
      };
      for (int64_t j = 0; j < n_kb; ++j) {
        const uint8_t *a_src[2];
        size_t a_stride[2];
        for (int a = 0; a < 2; ++a)
          a_src[a] = a_tile_source(w_data, w_stride, n0 + a * kTileRows, rows[a], j, a_pad[a],
                                   &a_stride[a]);
        // The first pass over a pair's rows reads them from memory; meanwhile the next pair's
        // region (its 32 rows are contiguous) from kPrefetchExtra bytes on is asked for into L2,
        // spread over the blocks, as the row-dot kernel does (the hardware prefetcher does not
        // follow 32 streams). Later passes (spans of more than 32 tokens) find the rows in L2.
        if (mb == 0)
          q8_kernel::prefetch_l2(w_data, ahead + j * ahead_per_block,
                                 ahead + (j + 1) * ahead_per_block, ahead_end);
        const uint8_t *b0 = packed + size_t(mb * n_kb + j) * kPacked;
        const uint8_t *b1 = second_b ? packed + size_t((mb + 1) * n_kb + j) * kPacked : zero_b;
        _tile_loadd(0, a_src[0], long(a_stride[0]));
        _tile_loadd(1, a_src[1], long(a_stride[1]));
        _tile_loadd(2, b0, 64);
        _tile_zero(4);
        _tile_zero(6);
        _tile_dpbssd(4, 0, 2);
        _tile_dpbssd(6, 1, 2);
        int32_t(*product)[16][16] = products[j & 1];
        _tile_stored(4, product[0], 64);
        _tile_stored(6, product[2], 64);
        if (second_b) { // (an odd number of 16-token blocks: the last has one B tile)
          _tile_loadd(3, b1, 64);
          _tile_zero(5);
          _tile_zero(7);
          _tile_dpbssd(5, 0, 3);
          _tile_dpbssd(7, 1, 3);
          _tile_stored(5, product[1], 64);
          _tile_stored(7, product[3], 64);
        }
        // The previous block's products are scaled while this block's tiles compute: read back
        // right after the tile stores, they would wait for those stores to retire (tile stores
        // do not forward), which drained the pipeline every block (9 tokens ran at a third of
        // the memory's speed with the rows in L2).
        if (j > 0) scale_block(j - 1);
      }
      scale_block(n_kb - 1);
      for (int a = 0; a < 2; ++a)
        for (int b = 0; b < (second_b ? 2 : 1); ++b) {
          const int64_t t0 = (mb + b) * kTileRows, tokens = min64(kTileRows, m - t0);
          for (int64_t t = 0; t < tokens; ++t) {
            float *out = reinterpret_cast<float *>(reinterpret_cast<char *>(y) +
                                                   size_t(t0 + t) * dst->nb[1]) +
                         n0 + a * kTileRows;
            for (int64_t r = 0; r < rows[a]; ++r) out[r] = acc[2 * a + b][r][t];
          }
        }
    }
  }
  _tile_release();
}

} // namespace offgraph::model::amx
