// Eight floats as one value (AVX's ymm register on x86; GCC and Clang vector extensions compile it
// for any target), and sixteen. Kernels written on them keep several independent accumulators in
// registers, and the vector math here (exp8, exp16) gives the same result on every lane count and
// compiler.
#pragma once

#include <cstdint>
#include <cstring>

namespace offgraph::simd {

typedef float f32x8 __attribute__((vector_size(32), aligned(4)));
typedef int32_t i32x8 __attribute__((vector_size(32), aligned(4)));

inline f32x8 load8(const float *p) {
  f32x8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store8(float *p, f32x8 v) { std::memcpy(p, &v, sizeof v); }
inline f32x8 splat8(float x) { return f32x8{x, x, x, x, x, x, x, x}; }
// Lanes of a where mask is all ones, of b elsewhere (mask: a vector comparison's result).
inline f32x8 select8(i32x8 mask, f32x8 a, f32x8 b) {
  return f32x8(((i32x8)a & mask) | ((i32x8)b & ~mask));
}
inline float sum8(f32x8 v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

// Sixteen floats (AVX-512's zmm; two ymm or narrower elsewhere), for kernels whose tiles are
// 16-float rows.
typedef float f32x16 __attribute__((vector_size(64), aligned(4)));
typedef int32_t i32x16 __attribute__((vector_size(64), aligned(4)));

// Loads and stores through a may_alias type, not memcpy: GCC (with its 256-bit preference on
// AVX-512 CPUs) copies a 64-byte memcpy through the stack in two halves.
typedef float f32x16_alias __attribute__((vector_size(64), aligned(4), may_alias));
inline f32x16 load16(const float *p) { return *reinterpret_cast<const f32x16_alias *>(p); }
inline void store16(float *p, f32x16 v) { *reinterpret_cast<f32x16_alias *>(p) = v; }
inline f32x16 splat16(float x) { return f32x16{x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x}; }
inline f32x16 select16(i32x16 mask, f32x16 a, f32x16 b) {
  return f32x16(((i32x16)a & mask) | ((i32x16)b & ~mask));
}

// exp(x) on every lane of F (f32x8 or f32x16; I the matching int vector): 2^k * e^r with
// |r| <= ln2/2 (ln 2 split Cody-Waite style) and a degree-6 Taylor polynomial; relative error
// <= 1.3e-7, about one f32 rounding. x below -87.3 (e^x under the smallest normal float, -inf
// included) gives exactly 0, which lets attention skip masked rows; x above 88 gives e^88
// (callers keep below it). NaN lanes give 0: callers that can see NaN must keep it themselves.
template <class F, class I> inline F exp_lanes(F x) {
  const F lo = F{} - 87.3f, hi = F{} + 88.0f;
  const I live = x >= lo;
  x = F(((I)x & live) | ((I)lo & ~live));
  const I below_hi = x <= hi;
  x = F(((I)x & below_hi) | ((I)hi & ~below_hi));
  const F shifter = F{} + 12582912.0f; // 1.5 * 2^23: adding it rounds to an integer
  const F k = (x * 1.44269504f + shifter) - shifter;
  const F r = (x - k * 0.693145751953125f) - k * 1.42860682030941723e-6f;
  F p = F{} + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const I two_k = (__builtin_convertvector(k, I) + 127) << 23;
  const F e = p * (F)two_k;
  return F((I)e & live);
}
inline f32x8 exp8(f32x8 x) { return exp_lanes<f32x8, i32x8>(x); }
inline f32x16 exp16(f32x16 x) { return exp_lanes<f32x16, i32x16>(x); }

} // namespace offgraph::simd
