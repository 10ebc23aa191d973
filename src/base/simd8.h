// Eight floats as one value (AVX's ymm register on x86; GCC and Clang vector extensions compile it
// for any target). Kernels written on it keep several independent accumulators in registers, and
// the vector math here (exp8) gives the same result on every lane count and compiler.
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

// exp(x), 8 at a time: 2^k * e^r with |r| <= ln2/2 (ln 2 split Cody-Waite style) and a degree-6
// Taylor polynomial; relative error <= 1.3e-7, about one f32 rounding. x below -87.3 (e^x under
// the smallest normal float, -inf included) gives exactly 0, which lets attention skip masked
// rows; x above 88 gives e^88 (callers keep below it). NaN lanes give 0: callers that can see NaN
// must keep it themselves.
inline f32x8 exp8(f32x8 x) {
  const i32x8 live = x >= splat8(-87.3f);
  x = select8(live, x, splat8(-87.3f));
  x = select8(x <= splat8(88.0f), x, splat8(88.0f));
  const f32x8 shifter = splat8(12582912.0f); // 1.5 * 2^23: adding it rounds to an integer
  const f32x8 k = (x * splat8(1.44269504f) + shifter) - shifter;
  const f32x8 r = (x - k * splat8(0.693145751953125f)) - k * splat8(1.42860682030941723e-6f);
  f32x8 p = splat8(1.0f / 720);
  p = p * r + splat8(1.0f / 120);
  p = p * r + splat8(1.0f / 24);
  p = p * r + splat8(1.0f / 6);
  p = p * r + splat8(0.5f);
  p = p * r + splat8(1.0f);
  p = p * r + splat8(1.0f);
  const i32x8 two_k = (__builtin_convertvector(k, i32x8) + 127) << 23;
  const f32x8 e = p * (f32x8)two_k;
  return f32x8((i32x8)e & live);
}

} // namespace offgraph::simd
