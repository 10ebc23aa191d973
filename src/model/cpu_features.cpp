#include "model/cpu_features.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace offgraph::model {
namespace {

#if defined(__x86_64__)
std::string probe_avx512_vnni() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return "no CPUID leaf 1";
  const bool fma = c & (1u << 12), osxsave = c & (1u << 27), f16c = c & (1u << 29);
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return "no CPUID leaf 7";
  const bool avx512f = b & (1u << 16), avx512bw = b & (1u << 30), avx512vl = b & (1u << 31);
  const bool vnni = c & (1u << 11);
  if (!avx512f || !avx512bw || !avx512vl || !vnni)
    return "this CPU has no AVX-512 F/BW/VL with VNNI";
  if (!fma || !f16c) return "this CPU has no FMA and F16C";
  if (!osxsave) return "the OS does not enable XSAVE";
  if ((os_saved_state() & 0xe6) != 0xe6) return "the OS does not save AVX-512 state";
  return "";
}
#else
std::string probe_avx512_vnni() { return "not an x86-64 CPU"; }
#endif

} // namespace

unsigned long long os_saved_state() {
#if defined(__x86_64__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return 0; // no OSXSAVE
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<unsigned long long>(hi) << 32) | lo;
#else
  return 0;
#endif
}

const std::string &avx512_vnni_unavailable_reason() {
  static const std::string r = probe_avx512_vnni();
  return r;
}

} // namespace offgraph::model
