// Tiled attention for spans of many tokens (prefill): the queries of a block of tokens and of every
// head of one KV head's group form one tile of rows, and each tile of 64 K/V rows is converted to
// f32 once for all of them; scores and weighted sums are register-blocked products on 16-float
// vectors, with the online softmax (running max and sum per query) between them.
//
// Why not ggml's tiled flash attention: it takes one query head at a time, converts each K row to
// f32 element by element into a transposed tile, and converts and adds its f16 mask on every tile,
// also where the tile is all visible (the whole history of a prefill chunk at depth). Here K stays
// in row order (the scores come out transposed: one 16-lane vector per row of 16 queries, so the
// softmax's reductions are vector ops too), a tile's mask is read once per token block, and tiles
// that are all visible or all hidden for the block add nothing or are skipped.
#pragma once

#include "kv/row_map.h"

#include "ggml.h"

#include <cstdint>

namespace offgraph::kv {

// Spans with more tokens than the grouped decode kernel takes use this one when the head dims are
// multiples of 4 (the rows of its products), at most 64 query heads share a KV head (one block's
// columns), and K/V have a row conversion to f32.
bool tiled_attention_applies(int64_t group, int64_t d_k, int64_t d_v, ggml_type k, ggml_type v);

// Parameters the op reads at compute time; must outlive the graph's computation.
struct TiledAttentionParams {
  float scale = 1.0f;
  RowMap rows; // where k and v's rows are (paged flat storage)
};

// q [D_k, H_q, T] f32 (any strides); k [D_k, n_rows, H_kv] and v [D_v, n_rows, H_kv] (views of the
// cache; row j of head g at params->rows(j) * nb[1] + g * nb[2]); mask [n_rows, >= T] f16 added to
// the scores, or null (all visible). Returns [D_v, H_q, T] f32, as ggml_flash_attn_ext does.
ggml_tensor *tiled_attention(ggml_context *ctx, ggml_tensor *q, ggml_tensor *k, ggml_tensor *v,
                             ggml_tensor *mask, const TiledAttentionParams *params);

} // namespace offgraph::kv
