// What this CPU and its OS let offgraph's own x86 kernels use (model/amx_matmul.h,
// model/cpu_matmul.h): asked once through CPUID and XGETBV, cached.
#pragma once

#include <string>

namespace offgraph::model {

// Why the AVX-512 kernels cannot run here, "" when they can: CPUID says AVX-512 F, BW, VL and
// VNNI with FMA and F16C, and the OS saves the AVX-512 register state.
const std::string &avx512_vnni_unavailable_reason();

// XCR0: which register states the OS saves (bits 5-7 AVX-512, 17-18 AMX tiles); 0 off x86-64 or
// where the OS does not enable XSAVE.
unsigned long long os_saved_state();

} // namespace offgraph::model
