#include "model/amx_matmul.h"

#include "model/cpu_features.h"
#include "model/cpu_matmul.h"

#include <atomic>

#if defined(OFFGRAPH_AMX_KERNELS)
#include "model/amx_kernels.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace offgraph::model {
namespace {

std::atomic<bool> g_enabled{true};

#if defined(OFFGRAPH_AMX_KERNELS)
// The reason AMX cannot be used here, "" when it can. Asks the kernel for the tile data
// permission (a process-wide grant) on the way.
std::string probe() {
  if (const std::string &r = avx512_vnni_unavailable_reason(); !r.empty()) return r;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return "no CPUID leaf 7";
  const bool amx_tile = d & (1u << 24), amx_int8 = d & (1u << 25);
  if (!amx_tile || !amx_int8) return "this CPU has no AMX-INT8";
  if ((os_saved_state() & (3ull << 17)) != (3ull << 17))
    return "the OS does not save AMX tile state";
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0)
    return "the kernel refused the AMX tile data permission (arch_prctl)";
  return "";
}
#else
std::string probe() { return "this build has no AMX kernels (not x86-64 Linux)"; }
#endif

const std::string &reason() {
  static const std::string r = probe();
  return r;
}

} // namespace

bool amx_available() { return reason().empty(); }
std::string amx_unavailable_reason() { return reason(); }
void set_amx_enabled(bool enabled) { g_enabled = enabled; }
bool amx_enabled() { return g_enabled && amx_available(); }

bool amx_takes(const ggml_tensor *w, const ggml_tensor *x) {
  return x->ne[1] >= kAmxMinTokens && q8_host_pair(w, x) && amx_enabled();
}

ggml_tensor *amx_mul_mat(ggml_context *ctx, ggml_tensor *w, ggml_tensor *x) {
#if defined(OFFGRAPH_AMX_KERNELS)
  ggml_tensor *packed =
      ggml_custom_4d(ctx, GGML_TYPE_I8, int64_t(amx::packed_bytes(x->ne[0], x->ne[1])), 1, 1, 1, &x,
                     1, amx::pack_activations, GGML_N_TASKS_MAX, nullptr);
  ggml_tensor *args[2] = {w, packed};
  ggml_tensor *y = ggml_custom_4d(ctx, GGML_TYPE_F32, w->ne[1], x->ne[1], 1, 1, args, 2,
                                  amx::multiply, GGML_N_TASKS_MAX, nullptr);
  ggml_set_name(y, "amx_mul_mat");
  return y;
#else
  return ggml_mul_mat(ctx, w, x);
#endif
}

} // namespace offgraph::model
