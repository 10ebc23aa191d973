// model::mul_mat, the one entry for the text models' weight multiplies: ggml_mul_mat, or one of
// offgraph's own CPU kernels where it takes the pair (docs/cpu-kernels.md):
//
// - spans of kAmxMinTokens rows or more on q8_0 weights: AMX tiles (model/amx_matmul.h);
// - 1 to kRowDotMaxTokens rows on q8_0 weights (decode, small decode batches): the row-dot
//   kernel below, on AVX-512 VNNI.
//
// The row-dot kernel. Why: a decode step reads every weight once and does little with each
// byte, so it should run at the memory's speed; ggml's q8_0 dot product walks one weight row at
// a time with a single chain of dependent multiply-adds and leaves its loads to the hardware
// prefetcher: 12-14 GB/s on this project's Xeon (2 threads, 134-707 MB of weights) where
// prefetched loads of the same working sets read 27-32 (docs/cpu-kernels.md).
// How: eight weight rows at a time (eight independent chains), the next group's bytes asked
// for into L2 while a group computes; each row's sum is computed exactly as ggml's vec_dot computes
// it (the same exact int32 block products, the same f32 multiply-add per block in block order, the
// same final horizontal sum), so its results are bit-identical to ggml's one-row path. With 2 or 3
// rows each token's result is what ggml gives that token alone (ggml itself switches to
// tinyBLAS there, whose sums round differently): a sequence's q8_0 multiplies give the same bits
// whether it decodes alone or with one or two others.
//
// Where: q8_0 weights in host memory, f32 activations, on a CPU with AVX-512 VNNI
// (cpu_features.h); `--no-row-dot` (set_row_dot_enabled) gives the multiplies back to ggml.
#pragma once

#include "ggml.h"

#include <cstdint>
#include <string>

namespace offgraph::model {

// Activations of at most this many rows take the row-dot kernel (more: AMX or ggml).
inline constexpr int64_t kRowDotMaxTokens = 3;

// The CPU can run the row-dot kernel (and the build has it); else why not.
bool row_dot_available();
std::string row_dot_unavailable_reason();
// Process-wide switch (on by default where available); graphs built afterwards follow it.
void set_row_dot_enabled(bool enabled);
bool row_dot_enabled();

// What both of offgraph's q8_0 kernels need of W x: q8_0 weights in host memory (a weight on a
// GPU or a ggml-rpc server computes there, with ggml's op) and f32 activations, both
// two-dimensional with contiguous rows, of the same width.
bool q8_host_pair(const ggml_tensor *w, const ggml_tensor *x);
// Whether row_dot_mul_mat takes W x: enabled, q8_0 weights in host memory, f32 activations of 1
// to kRowDotMaxTokens rows, both two-dimensional with contiguous rows.
bool row_dot_takes(const ggml_tensor *w, const ggml_tensor *x);
// W x as ggml_mul_mat computes it ([rows of W, rows of x], f32). The caller checked
// row_dot_takes.
ggml_tensor *row_dot_mul_mat(ggml_context *ctx, ggml_tensor *w, ggml_tensor *x);

// What every weight multiply of the text models calls (the vision encoder's stay ggml's).
ggml_tensor *mul_mat(ggml_context *ctx, ggml_tensor *w, ggml_tensor *x);

} // namespace offgraph::model
