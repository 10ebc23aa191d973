// Grouped attention for spans of a few tokens (decode): each K and V row is read once for all the
// query heads that share it, and everything is accumulated in f32.
//
// Why: ggml's CPU flash attention walks the K/V rows once per query head. With grouped-query
// attention (Muse Glimmer: 16 query heads per KV head) that is 16 passes over the cache per
// token, compute-bound on per-head f16 dot products, 6-30x above the time needed to read the
// rows once (docs/kv-attention.md); it also accumulates f16 V in f16, so the error grows with the
// rows attended. Here a thread takes one KV head and one chunk of rows, converts the chunk's K
// rows to f32 once, scores every query of the group (all heads, all tokens of the span) against
// them, does the same for V, and writes a partial result (max, sum, weighted V); a second op
// merges the chunks' partials (the split-softmax identity). No approximation beyond f32 rounding.
#pragma once

#include "kv/row_map.h"

#include "ggml.h"

#include <cstdint>

namespace offgraph::kv {

// Spans with at most this many tokens take the grouped kernel; longer ones (prefill) take the tiled
// kernel (kv/tiled_attention.h), whose products pay off at those shapes.
inline constexpr int64_t kGroupedAttentionMaxTokens = 8;
// Every group size takes it, MHA's groups of 1 included. Groups under 4 once went to ggml's kernel
// over short histories, where it was up to 1% faster (docs/performance-log.md entry 16); with
// paged storage ggml's kernel reads scattered pages as a masked range of pool rows, whose cost
// grows with how far apart the pages lie, and choosing by placement would have made a sequence's
// results depend on what other sequences did to the pool.
inline bool grouped_attention_applies(int64_t n_tokens, int64_t group) {
  return n_tokens <= kGroupedAttentionMaxTokens && group >= 1;
}

// Parameters the ops read at compute time; must outlive the graph's computation.
struct GroupedAttentionParams {
  float scale = 1.0f;
  int32_t chunk_rows = 256; // rows per work item (per KV head)
  RowMap rows;              // where k and v's rows are (paged flat storage)
};

// q [D_k, H_q, T] f32 (any strides); k [D_k, n_rows, H_kv] and v [D_v, n_rows, H_kv] in any
// storage type with a row conversion to f32 (views of the cache: row j of head g at
// params->rows(j) * nb[1] + g * nb[2]); mask [n_rows, >= T] f16 added to the scores, or null (all
// visible). Returns [D_v, H_q, T] f32, as ggml_flash_attn_ext does.
ggml_tensor *grouped_attention(ggml_context *ctx, ggml_tensor *q, ggml_tensor *k, ggml_tensor *v,
                               ggml_tensor *mask, const GroupedAttentionParams *params);

} // namespace offgraph::kv
