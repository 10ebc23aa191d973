// The compute functions of the AMX ops (model/amx_matmul.h), in a file of their own built with
// the AMX and AVX-512 instruction sets: nothing here may run before amx_available() said yes.
#pragma once

#include "ggml.h"

#include <cstddef>
#include <cstdint>

namespace offgraph::model::amx {

// Bytes of K-value activation rows, M of them, quantized and laid out as B tiles: for each block
// of 16 rows (the last one zero-padded) and each block of 32 values, 8 x 64 bytes of VNNI-ordered
// int8 values and the 16 rows' f32 scales.
size_t packed_bytes(int64_t k, int64_t m);
// dst (I8, packed_bytes) from src[0] (f32 [K, M]): ggml's q8_0 quantization, repacked.
void pack_activations(ggml_tensor *dst, int ith, int nth, void *userdata);
// dst (f32 [N, M]) = src[0] (q8_0 [K, N]) x the activations src[1] packed.
void multiply(ggml_tensor *dst, int ith, int nth, void *userdata);

} // namespace offgraph::model::amx
