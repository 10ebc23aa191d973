// What offgraph's q8_0 CPU kernels share (amx_kernels.cpp, row_dot_kernels.cpp). Included only by
// those files, which are built with their own instruction sets: everything here is internal to
// each (static, or a type without code), never a function the linker could pick from one of them
// for the whole program.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace offgraph::model::q8_kernel {

struct BlockQ8 { // ggml's block_q8_0
  uint16_t d;    // f16 scale
  int8_t qs[32];
};
static_assert(sizeof(BlockQ8) == 34);

constexpr int64_t kBlock = 32; // values per q8_0 block
constexpr int64_t kLine = 64;  // bytes of a cache line
// How far past the next rows a kernel's weight prefetches lead (row_dot_kernels.cpp: measured).
constexpr int64_t kPrefetchExtra = 4096;

static inline float f16(uint16_t h) { return _cvtsh_ss(h); }

// f16 -> f32 by table (256 KiB, one per kernel file): a load where the conversion costs the vector
// ports three operations per weight row and block. Filled with F16C, so its values are those of
// ggml's conversion.
static inline const float *f16_table() {
  static const float *const table = [] {
    float *t = new float[65536];
    for (uint32_t h = 0; h < 65536; ++h) t[h] = f16(uint16_t(h));
    return t;
  }();
  return table;
}

// Asks for the lines of bytes [from, to) of `base` into L2, none at or past `end` (offsets).
static inline void prefetch_l2(const uint8_t *base, int64_t from, int64_t to, int64_t end) {
  for (int64_t o = from; o < to && o < end; o += kLine)
    _mm_prefetch(reinterpret_cast<const char *>(base + o), _MM_HINT_T1);
}

} // namespace offgraph::model::q8_kernel
