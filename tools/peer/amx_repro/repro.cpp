// Standalone reproduction: ggml's CPU "AMX" extra buffer type crashes in
// ggml_backend_amx_mul_mat on a Q8_0 mul_mat with 2+ rows in src1, when ggml
// was built with GCC 12 (Debian 12's gcc 12.2.0).
//
// Uses only the public API (ggml.h, ggml-backend.h, ggml-cpu.h).
//
// usage: repro [M=2] [threads=1] [type=q8_0]
//   M       rows of src1 (tokens). M == 1 takes the AVX512-VNNI path (no tiles,
//           no crash); M >= 2 takes the AMX tile path (tinygemm_kernel_amx).
//   threads n_threads of the CPU backend.
//   type    weight type: q8_0, q4_0, q4_1, q4_K, q5_K, q6_K, iq4_xs (AMX tile
//           kernels) or f16 (the AMX buffer takes it, AVX-512 only, no tiles).
//
// The program also runs the same multiply with the weight in the plain CPU
// buffer and compares (reached only when the AMX path does not crash).

#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <strings.h>
#include <vector>

static ggml_backend_buffer_type_t find_amx_buft(ggml_backend_dev_t dev) {
  ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
  auto get_extra = (ggml_backend_dev_get_extra_bufts_t)ggml_backend_reg_get_proc_address(
      reg, "ggml_backend_dev_get_extra_bufts");
  if (!get_extra) {
    return nullptr;
  }
  for (ggml_backend_buffer_type_t *p = get_extra(dev); p && *p; ++p) {
    fprintf(stderr, "extra buffer type: %s\n", ggml_backend_buft_name(*p));
    if (strcmp(ggml_backend_buft_name(*p), "AMX") == 0) {
      return *p;
    }
  }
  return nullptr;
}

// y[M][N] = x[M][K] * W[N][K]^T with W (q8_0) placed in buffer type `buft`
static ggml_type wtype = GGML_TYPE_Q8_0;

static std::vector<float> run_mul_mat(ggml_backend_t backend, ggml_backend_buffer_type_t buft,
                                      const std::vector<uint8_t> &wq, const std::vector<float> &x,
                                      int K, int N, int M, const char *what) {
  // weight: its own context, allocated in `buft`
  ggml_init_params wp = {ggml_tensor_overhead() * 2, nullptr, /*no_alloc*/ true};
  ggml_context *wctx = ggml_init(wp);
  ggml_tensor *W = ggml_new_tensor_2d(wctx, wtype, K, N);
  ggml_set_name(W, "W");
  const size_t align = ggml_backend_buft_get_alignment(buft);
  const size_t wsize = ggml_backend_buft_get_alloc_size(buft, W);
  ggml_backend_buffer_t wbuf = ggml_backend_buft_alloc_buffer(buft, wsize + align);
  ggml_backend_buffer_set_usage(wbuf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
  if (ggml_backend_tensor_alloc(wbuf, W, ggml_backend_buffer_get_base(wbuf)) !=
      GGML_STATUS_SUCCESS) {
    fprintf(stderr, "tensor_alloc failed\n");
    exit(1);
  }
  ggml_backend_tensor_set(W, wq.data(), 0, wq.size()); // the AMX buffer repacks here

  // activations and result: plain host memory
  ggml_init_params gp = {64u * 1024 * 1024, nullptr, /*no_alloc*/ false};
  ggml_context *ctx = ggml_init(gp);
  ggml_tensor *X = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, K, M);
  memcpy(X->data, x.data(), x.size() * sizeof(float));
  ggml_tensor *Y = ggml_mul_mat(ctx, W, X);
  ggml_cgraph *gf = ggml_new_graph(ctx);
  ggml_build_forward_expand(gf, Y);

  fprintf(stderr, "%s: W %s [K=%d, N=%d] in buffer '%s', X f32 [K=%d, M=%d] -> compute\n", what,
          ggml_type_name(wtype), K, N, ggml_backend_buft_name(buft), K, M);
  ggml_status st = ggml_backend_graph_compute(backend, gf);
  fprintf(stderr, "%s: compute returned %d\n", what, (int)st);

  std::vector<float> y((size_t)N * M);
  memcpy(y.data(), Y->data, y.size() * sizeof(float));
  ggml_free(ctx);
  ggml_backend_buffer_free(wbuf);
  ggml_free(wctx);
  return y;
}

int main(int argc, char **argv) {
  const int M = argc > 1 ? atoi(argv[1]) : 2;
  const int nthreads = argc > 2 ? atoi(argv[2]) : 1;
  const char *tname = argc > 3 ? argv[3] : "q8_0";
  wtype = GGML_TYPE_COUNT;
  for (int t = 0; t < GGML_TYPE_COUNT; ++t) {
    const char *n = ggml_type_name((ggml_type)t);
    if (n && strcasecmp(n, tname) == 0) {
      wtype = (ggml_type)t;
    }
  }
  if (wtype == GGML_TYPE_COUNT) {
    fprintf(stderr, "unknown type %s\n", tname);
    return 1;
  }
  const int K = 256, N = 64; // K % 32 == 0, N % 32 == 0: supported by the AMX buffer

  ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
  if (!dev) {
    fprintf(stderr, "no CPU device\n");
    return 1;
  }
  ggml_backend_buffer_type_t amx = find_amx_buft(dev);
  if (!amx) {
    fprintf(stderr, "no AMX extra buffer type (CPU without AMX, or ggml built without AMX)\n");
    return 2;
  }
  ggml_backend_t backend = ggml_backend_cpu_init();
  ggml_backend_cpu_set_n_threads(backend, nthreads);

  std::mt19937 rng(42);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> wf((size_t)K * N), x((size_t)K * M);
  for (auto &v : wf) v = dist(rng);
  for (auto &v : x) v = dist(rng);
  std::vector<uint8_t> wq(ggml_row_size(wtype, K) * N);
  ggml_quantize_chunk(wtype, wf.data(), wq.data(), 0, N, K, nullptr);

  std::vector<float> ref = run_mul_mat(backend, ggml_backend_cpu_buffer_type(), wq, x, K, N, M,
                                       "reference (CPU buffer)");

  std::vector<float> got = run_mul_mat(backend, amx, wq, x, K, N, M, "AMX buffer");

  double max_err = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    max_err = std::fmax(max_err, std::fabs((double)ref[i] - got[i]));
  }
  printf("%s M=%d threads=%d: AMX path survived, max |AMX - CPU| = %g\n", ggml_type_name(wtype), M,
         nthreads, max_err);
  ggml_backend_free(backend);
  return 0;
}
