// Matrix multiplies on Intel AMX tiles for q8_0 weights on the CPU (issue 36), as ggml custom ops.
//
// Why: ggml's CPU path multiplies a q8_0 weight by a span's activations with AVX-512 dot
// products (or tinyBLAS), 64 int8 products per instruction. An AMX tile multiply does 16 x 16 x
// 32 of them per instruction; prefill chunks and verify spans are compute-bound on those products
// (docs/speculative.md: a 9-token verify step costs about 4 one-token steps on 2 cores).
//
// How: the activations are quantized exactly as ggml's own q8_0 path quantizes them (its
// from_float), into blocks laid out as AMX B tiles (16 tokens x 32 values in VNNI order, with the
// 16 tokens' scales); the weights are read in place (a q8_0 row is 34-byte blocks, each a 2-byte
// scale and 32 int8 values: a tile row of 32 bytes at a 34-byte stride from the first block, so
// nothing is repacked and no second copy is held). Each tile product is one block of 32 values,
// exact in int32, then scaled by the weight row's and the token's block scales into f32, as
// ggml's dot product does; only the order of the f32 sums differs from ggml's.
//
// Where: only weights in host memory on a CPU whose AMX the kernel has let this process use, for
// activations of at least kAmxMinTokens rows (a decode token would fill a sixteenth of a tile);
// every other multiply is ggml's. The rows are the batch's, all sequences together (or the logit
// rows, for the output head): four sequences decoding together take the tiles where one alone
// does not, so a sequence's last bits of rounding depend on its batch, as with ggml's own
// choice of kernel by batch size (docs/speculative.md). `--no-amx` turns it off
// (set_amx_enabled).
#pragma once

#include "ggml.h"

#include <cstdint>
#include <string>

namespace offgraph::model {

// Activations of fewer rows (tokens of the whole batch) take ggml's path.
inline constexpr int64_t kAmxMinTokens = 4;

// This CPU has AMX-INT8 (and AVX-512 with F16C for the scaling), the OS saves tile state, and
// the kernel granted this process the tile data permission (asked once). Cached.
bool amx_available();
// Why amx_available() is false ("" when it is true), for logs and test skips.
std::string amx_unavailable_reason();
// Process-wide switch (on by default where available); graphs built afterwards follow it.
void set_amx_enabled(bool enabled);
bool amx_enabled();

// Whether amx_mul_mat takes W x: AMX enabled, q8_0 weights in host memory with rows of a multiple
// of 32 values, f32 activations of at least kAmxMinTokens rows, both two-dimensional.
bool amx_takes(const ggml_tensor *w, const ggml_tensor *x);
// W x as ggml_mul_mat computes it ([rows of W, rows of x], f32), through the AMX ops. The caller
// checked amx_takes.
ggml_tensor *amx_mul_mat(ggml_context *ctx, ggml_tensor *w, ggml_tensor *x);

} // namespace offgraph::model
