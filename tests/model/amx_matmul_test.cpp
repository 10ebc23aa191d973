// The AMX q8_0 multiply (model/amx_matmul.h) against two independent references on random shapes:
// a naive one (ggml's q8_0 quantization of the activations, exact int64 block dot products,
// scales applied in double) and ggml's own mul_mat on the same inputs. Skipped, saying why, on a
// CPU without AMX; `mul_mat` must then be ggml's op.
#include "model/amx_matmul.h"

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpp.h"
#include "ggml-cpu.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace offgraph::model {
namespace {

struct BlockQ8 {
  uint16_t d;
  int8_t qs[32];
};

struct Shape {
  int64_t k, n, m;
};

// Computes y = W x through `build` (amx or ggml) on the CPU backend with 2 threads.
std::vector<float> compute(const std::vector<uint8_t> &w_bytes, const std::vector<float> &x,
                           Shape s, bool amx, std::string *op_name = nullptr) {
  ggml_init_params wp = {2 * ggml_tensor_overhead(), nullptr, true};
  ggml_context_ptr wctx(ggml_init(wp));
  ggml_tensor *w = ggml_new_tensor_2d(wctx.get(), GGML_TYPE_Q8_0, s.k, s.n);
  ggml_tensor *xt = ggml_new_tensor_2d(wctx.get(), GGML_TYPE_F32, s.k, s.m);
  ggml_backend_ptr backend(ggml_backend_cpu_init());
  ggml_backend_cpu_set_n_threads(backend.get(), 2);
  ggml_backend_buffer_ptr wbuf(ggml_backend_alloc_ctx_tensors(wctx.get(), backend.get()));
  ggml_backend_tensor_set(w, w_bytes.data(), 0, ggml_nbytes(w));
  ggml_backend_tensor_set(xt, x.data(), 0, ggml_nbytes(xt));
  const size_t n_nodes = 16;
  ggml_init_params gp = {
      n_nodes * ggml_tensor_overhead() + ggml_graph_overhead_custom(n_nodes, false), nullptr, true};
  ggml_context_ptr ctx(ggml_init(gp));
  ggml_tensor *y = amx ? amx_mul_mat(ctx.get(), w, xt) : ggml_mul_mat(ctx.get(), w, xt);
  if (op_name) *op_name = ggml_get_name(y);
  ggml_cgraph *gf = ggml_new_graph_custom(ctx.get(), n_nodes, false);
  ggml_build_forward_expand(gf, y);
  ggml_gallocr_ptr alloc(ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend.get())));
  EXPECT_TRUE(ggml_gallocr_alloc_graph(alloc.get(), gf));
  // Poison the output so that rows the kernel failed to write are caught.
  std::vector<float> out(size_t(s.n * s.m), std::nanf(""));
  ggml_backend_tensor_set(y, out.data(), 0, ggml_nbytes(y));
  EXPECT_EQ(ggml_backend_graph_compute(backend.get(), gf), GGML_STATUS_SUCCESS);
  ggml_backend_tensor_get(y, out.data(), 0, ggml_nbytes(y));
  return out;
}

class AmxMatmul : public ::testing::Test {
protected:
  void SetUp() override {
    if (!amx_available()) GTEST_SKIP() << "no AMX here: " << amx_unavailable_reason();
  }
};

TEST_F(AmxMatmul, EqualsExactBlockSumsAndGgmlOnRandomShapes) {
  std::mt19937_64 rng(36);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const ggml_from_float_t quantize = ggml_get_type_traits_cpu(GGML_TYPE_Q8_0)->from_float;
  // Rows not multiples of 16 or 32, tokens not multiples of 16, K not a multiple of 64, and a
  // shape of Muse Glimmer's width.
  const std::vector<Shape> shapes = {{32, 1, 4},     {32, 16, 16},   {64, 17, 5},
                                     {96, 33, 17},   {160, 15, 33},  {224, 48, 31},
                                     {256, 100, 64}, {2048, 64, 40}, {544, 257, 19}};
  int checked = 0;
  for (const Shape &s : shapes) {
    SCOPED_TRACE("K " + std::to_string(s.k) + " N " + std::to_string(s.n) + " M " +
                 std::to_string(s.m));
    // Weights with rows of differing magnitude (the scales differ per block and row).
    std::vector<float> wf(size_t(s.k * s.n));
    for (int64_t r = 0; r < s.n; ++r) {
      const float mag = std::exp(normal(rng));
      for (int64_t i = 0; i < s.k; ++i) wf[size_t(r * s.k + i)] = mag * normal(rng);
    }
    std::vector<uint8_t> w_bytes(size_t(s.n) * ggml_row_size(GGML_TYPE_Q8_0, s.k));
    ggml_quantize_chunk(GGML_TYPE_Q8_0, wf.data(), w_bytes.data(), 0, s.n, s.k, nullptr);
    std::vector<float> x(size_t(s.k * s.m));
    for (float &v : x) v = 3.0f * normal(rng);
    // Reference: x quantized as ggml's q8_0 path quantizes it, exact block sums, double scales.
    const int64_t n_kb = s.k / 32;
    std::vector<BlockQ8> xq(size_t(n_kb * s.m));
    for (int64_t t = 0; t < s.m; ++t) quantize(x.data() + t * s.k, xq.data() + t * n_kb, s.k);
    const auto *wq = reinterpret_cast<const BlockQ8 *>(w_bytes.data());
    std::vector<double> ref(size_t(s.n * s.m));
    double scale_of_sums = 0;
    for (int64_t t = 0; t < s.m; ++t)
      for (int64_t r = 0; r < s.n; ++r) {
        double sum = 0;
        for (int64_t j = 0; j < n_kb; ++j) {
          const BlockQ8 &a = wq[r * n_kb + j], &b = xq[size_t(t * n_kb + j)];
          int64_t dot = 0;
          for (int i = 0; i < 32; ++i) dot += int64_t(a.qs[i]) * int64_t(b.qs[i]);
          sum += double(ggml_fp16_to_fp32(a.d)) * double(ggml_fp16_to_fp32(b.d)) * double(dot);
        }
        ref[size_t(t * s.n + r)] = sum;
        scale_of_sums = std::max(scale_of_sums, std::abs(sum));
      }
    std::string name;
    const std::vector<float> amx = compute(w_bytes, x, s, true, &name);
    ASSERT_EQ(name, "amx_mul_mat");
    const std::vector<float> stock = compute(w_bytes, x, s, false);
    // f32 sums of K/32 products: relative to the largest output, well under 1e-5 (measured
    // 1e-7 .. 1e-6); ggml's own sums, in another order, likewise.
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_FALSE(std::isnan(amx[i])) << "output " << i << " not written";
      ASSERT_LE(std::abs(double(amx[i]) - ref[i]), 1e-5 * scale_of_sums)
          << "output " << i << ": amx " << amx[i] << ", exact " << ref[i];
      ASSERT_LE(std::abs(double(amx[i]) - double(stock[i])), 2e-5 * scale_of_sums)
          << "output " << i << ": amx " << amx[i] << ", ggml " << stock[i];
    }
    ++checked;
  }
  EXPECT_EQ(checked, int(shapes.size()));
}

// Who takes the AMX path: q8_0 weights in host memory, spans of kAmxMinTokens or more, and only
// while enabled.
TEST_F(AmxMatmul, TakesOnlyLongEnoughQ8SpansWhileEnabled) {
  ggml_init_params p = {8 * ggml_tensor_overhead(), nullptr, true};
  ggml_context_ptr ctx(ggml_init(p));
  ggml_tensor *w = ggml_new_tensor_2d(ctx.get(), GGML_TYPE_Q8_0, 64, 32);
  ggml_tensor *w16 = ggml_new_tensor_2d(ctx.get(), GGML_TYPE_F16, 64, 32);
  ggml_tensor *x = ggml_new_tensor_2d(ctx.get(), GGML_TYPE_F32, 64, kAmxMinTokens);
  ggml_tensor *x1 = ggml_new_tensor_2d(ctx.get(), GGML_TYPE_F32, 64, kAmxMinTokens - 1);
  EXPECT_FALSE(amx_takes(w, x)) << "weights not yet in any buffer";
  ggml_backend_ptr backend(ggml_backend_cpu_init());
  ggml_backend_buffer_ptr buf(ggml_backend_alloc_ctx_tensors(ctx.get(), backend.get()));
  EXPECT_TRUE(amx_takes(w, x));
  EXPECT_FALSE(amx_takes(w, x1));
  EXPECT_FALSE(amx_takes(w16, x));
  set_amx_enabled(false);
  EXPECT_FALSE(amx_takes(w, x));
  set_amx_enabled(true);
  EXPECT_TRUE(amx_takes(w, x));
}

// Without AMX (or on a CPU that has it, turned off) nothing takes the AMX path: every multiply
// is ggml's.
TEST(AmxMatmulOff, NothingTakesItWhereItIsOff) {
  ggml_init_params p = {4 * ggml_tensor_overhead(), nullptr, true};
  ggml_context_ptr ctx(ggml_init(p));
  ggml_tensor *w = ggml_new_tensor_2d(ctx.get(), GGML_TYPE_Q8_0, 64, 32);
  ggml_tensor *x = ggml_new_tensor_2d(ctx.get(), GGML_TYPE_F32, 64, 64);
  ggml_backend_ptr backend(ggml_backend_cpu_init());
  ggml_backend_buffer_ptr buf(ggml_backend_alloc_ctx_tensors(ctx.get(), backend.get()));
  set_amx_enabled(false);
  EXPECT_FALSE(amx_takes(w, x));
  EXPECT_EQ(mul_mat(ctx.get(), w, x)->op, GGML_OP_MUL_MAT);
  set_amx_enabled(true);
  EXPECT_EQ(amx_takes(w, x), amx_available()) << amx_unavailable_reason();
}

} // namespace
} // namespace offgraph::model
