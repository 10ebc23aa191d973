// offgraph's CPU kernels for q8_0 weights (model/cpu_matmul.h) against independent references on
// random shapes: a naive one (ggml's q8_0 quantization of the activations, exact int64 block dot
// products, scales applied in double) and ggml's own mul_mat on the same inputs. The AMX
// multiply agrees with both to a stated bound; the row-dot kernel is bit-identical to ggml's
// one-row dot product. Skipped, saying why, on a CPU without the kernel's instructions;
// `mul_mat` must then be ggml's op.
#include "model/amx_matmul.h"
#include "model/cpu_matmul.h"

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpp.h"
#include "ggml-cpu.h"

#include <gtest/gtest.h>

#include <algorithm>
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

enum class Kernel { ggml, amx, row_dot };

// Computes y = W x through `kernel`'s op on the CPU backend with `threads` threads. With
// `x_pad`, x's rows lie x_pad values apart beyond their K (a view of a wider tensor).
std::vector<float> compute(const std::vector<uint8_t> &w_bytes, const std::vector<float> &x,
                           Shape s, Kernel kernel, std::string *op_name = nullptr, int threads = 2,
                           int64_t x_pad = 0) {
  ggml_init_params wp = {2 * ggml_tensor_overhead(), nullptr, true};
  ggml_context_ptr wctx(ggml_init(wp));
  ggml_tensor *w = ggml_new_tensor_2d(wctx.get(), GGML_TYPE_Q8_0, s.k, s.n);
  ggml_tensor *wide = ggml_new_tensor_2d(wctx.get(), GGML_TYPE_F32, s.k + x_pad, s.m);
  ggml_backend_ptr backend(ggml_backend_cpu_init());
  ggml_backend_cpu_set_n_threads(backend.get(), threads);
  ggml_backend_buffer_ptr wbuf(ggml_backend_alloc_ctx_tensors(wctx.get(), backend.get()));
  ggml_backend_tensor_set(w, w_bytes.data(), 0, ggml_nbytes(w));
  std::vector<float> padded(size_t((s.k + x_pad) * s.m), 1e30f); // huge: a read of the pad shows
  for (int64_t t = 0; t < s.m; ++t)
    std::copy(x.begin() + t * s.k, x.begin() + (t + 1) * s.k, padded.begin() + t * (s.k + x_pad));
  ggml_backend_tensor_set(wide, padded.data(), 0, ggml_nbytes(wide));
  const size_t n_nodes = 16;
  ggml_init_params gp = {
      n_nodes * ggml_tensor_overhead() + ggml_graph_overhead_custom(n_nodes, false), nullptr, true};
  ggml_context_ptr ctx(ggml_init(gp));
  ggml_tensor *xt = x_pad ? ggml_view_2d(ctx.get(), wide, s.k, s.m, wide->nb[1], 0) : wide;
  ggml_tensor *y = kernel == Kernel::amx       ? amx_mul_mat(ctx.get(), w, xt)
                   : kernel == Kernel::row_dot ? row_dot_mul_mat(ctx.get(), w, xt)
                                               : ggml_mul_mat(ctx.get(), w, xt);
  if (op_name) *op_name = ggml_get_name(y);
  ggml_cgraph *gf = ggml_new_graph_custom(ctx.get(), n_nodes, false);
  ggml_build_forward_expand(gf, y);
  ggml_gallocr_ptr alloc(ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend.get())));
  EXPECT_TRUE(ggml_gallocr_alloc_graph(alloc.get(), gf));
  // Computed twice, the output poisoned before each, so that rows the kernel failed to write
  // are caught, also where a kernel's state (the row-dot kernel's work counters) survives from
  // one computation of the graph to the next.
  std::vector<float> out;
  for (int time = 0; time < 2; ++time) {
    std::vector<float> got(size_t(s.n * s.m), std::nanf(""));
    ggml_backend_tensor_set(y, got.data(), 0, ggml_nbytes(y));
    EXPECT_EQ(ggml_backend_graph_compute(backend.get(), gf), GGML_STATUS_SUCCESS);
    ggml_backend_tensor_get(y, got.data(), 0, ggml_nbytes(y));
    if (time == 1) {
      EXPECT_EQ(std::memcmp(got.data(), out.data(), got.size() * sizeof(float)), 0)
          << "a second computation of the same graph differs";
    }
    out = got;
  }
  return out;
}

// Random q8_0 weights (rows of differing magnitude, so the scales differ per block and row) and
// activations, with the naive reference: x quantized as ggml's q8_0 path quantizes it, exact
// block sums, scales applied in double.
struct Case {
  std::vector<uint8_t> w_bytes;
  std::vector<float> x;
  std::vector<double> ref; // [token][row]
  double largest = 0;      // of |ref|
};

Case make_case(Shape s, std::mt19937_64 &rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Case c;
  std::vector<float> wf(size_t(s.k * s.n));
  for (int64_t r = 0; r < s.n; ++r) {
    const float mag = std::exp(normal(rng));
    for (int64_t i = 0; i < s.k; ++i) wf[size_t(r * s.k + i)] = mag * normal(rng);
  }
  c.w_bytes.resize(size_t(s.n) * ggml_row_size(GGML_TYPE_Q8_0, s.k));
  ggml_quantize_chunk(GGML_TYPE_Q8_0, wf.data(), c.w_bytes.data(), 0, s.n, s.k, nullptr);
  // Weight values of -128, which ggml's quantization never writes but a file may hold (the
  // kernels' int8 products must take them exactly: |-128| does not fit a signed byte).
  for (size_t b = 0; b * 34 < c.w_bytes.size(); b += 7)
    c.w_bytes[b * 34 + 2 + b % 32] = uint8_t(0x80);
  c.x.resize(size_t(s.k * s.m));
  for (float &v : c.x) v = 3.0f * normal(rng);
  const ggml_from_float_t quantize = ggml_get_type_traits_cpu(GGML_TYPE_Q8_0)->from_float;
  const int64_t n_kb = s.k / 32;
  std::vector<BlockQ8> xq(size_t(n_kb * s.m));
  for (int64_t t = 0; t < s.m; ++t) quantize(c.x.data() + t * s.k, xq.data() + t * n_kb, s.k);
  const auto *wq = reinterpret_cast<const BlockQ8 *>(c.w_bytes.data());
  c.ref.resize(size_t(s.n * s.m));
  for (int64_t t = 0; t < s.m; ++t)
    for (int64_t r = 0; r < s.n; ++r) {
      double sum = 0;
      for (int64_t j = 0; j < n_kb; ++j) {
        const BlockQ8 &a = wq[r * n_kb + j], &b = xq[size_t(t * n_kb + j)];
        int64_t dot = 0;
        for (int i = 0; i < 32; ++i) dot += int64_t(a.qs[i]) * int64_t(b.qs[i]);
        sum += double(ggml_fp16_to_fp32(a.d)) * double(ggml_fp16_to_fp32(b.d)) * double(dot);
      }
      c.ref[size_t(t * s.n + r)] = sum;
      c.largest = std::max(c.largest, std::abs(sum));
    }
  return c;
}

std::string describe(Shape s) {
  return "K " + std::to_string(s.k) + " N " + std::to_string(s.n) + " M " + std::to_string(s.m);
}

class AmxMatmul : public ::testing::Test {
protected:
  void SetUp() override {
    if (!amx_available()) GTEST_SKIP() << "no AMX here: " << amx_unavailable_reason();
  }
};

TEST_F(AmxMatmul, EqualsExactBlockSumsAndGgmlOnRandomShapes) {
  std::mt19937_64 rng(36);
  // Rows not multiples of 16 or 32, tokens not multiples of 16, K not a multiple of 64, and a
  // shape of Muse Glimmer's width. Spans of up to 16 tokens take their own path (one B tile, two
  // blocks at a time): odd and even block counts, a padded last row block, among them.
  const std::vector<Shape> shapes = {{32, 1, 4},    {32, 16, 16},   {64, 17, 5},    {96, 33, 9},
                                     {224, 40, 12}, {256, 50, 7},   {96, 33, 17},   {160, 15, 33},
                                     {224, 48, 31}, {256, 100, 64}, {2048, 64, 40}, {544, 257, 19}};
  int checked = 0;
  for (const Shape &s : shapes) {
    SCOPED_TRACE(describe(s));
    const Case c = make_case(s, rng);
    std::string name;
    const std::vector<float> amx = compute(c.w_bytes, c.x, s, Kernel::amx, &name);
    ASSERT_EQ(name, "amx_mul_mat");
    const std::vector<float> stock = compute(c.w_bytes, c.x, s, Kernel::ggml);
    // f32 sums of K/32 products: relative to the largest output, well under 1e-5 (measured
    // 1e-7 .. 1e-6); ggml's own sums, in another order, likewise.
    for (size_t i = 0; i < c.ref.size(); ++i) {
      ASSERT_FALSE(std::isnan(amx[i])) << "output " << i << " not written";
      ASSERT_LE(std::abs(double(amx[i]) - c.ref[i]), 1e-5 * c.largest)
          << "output " << i << ": amx " << amx[i] << ", exact " << c.ref[i];
      ASSERT_LE(std::abs(double(amx[i]) - double(stock[i])), 2e-5 * c.largest)
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

class RowDot : public ::testing::Test {
protected:
  void SetUp() override {
    if (!row_dot_available())
      GTEST_SKIP() << "no row-dot kernel here: " << row_dot_unavailable_reason();
  }
};

// Each token's outputs are bit for bit those of ggml's mul_mat of that token alone (its one-row
// q8_0 dot product), with 1, 2 or 3 threads (3: activation rows that are a strided view),
// computed twice, and within 1e-5 of the exact block
// sums. Rows not multiples of the kernel's 8- and 4-row groups, K from one block up, and up to
// two dozen of its chunks of rows.
TEST_F(RowDot, BitIdenticalToGgmlsOneRowDotProduct) {
  std::mt19937_64 rng(361);
  const std::vector<Shape> shapes = {{32, 1, 1},   {32, 7, 2},      {64, 9, 3},     {96, 15, 1},
                                     {160, 17, 2}, {544, 33, 3},    {1024, 257, 1}, {4096, 100, 3},
                                     {2048, 8, 2}, {1024, 1500, 1}, {512, 1000, 2}, {256, 777, 3}};
  int checked = 0;
  for (const Shape &s : shapes) {
    SCOPED_TRACE(describe(s));
    const Case c = make_case(s, rng);
    std::vector<std::vector<float>> alone; // [token]: ggml's mul_mat of that token alone
    for (int64_t t = 0; t < s.m; ++t) {
      const std::vector<float> x_t(c.x.begin() + t * s.k, c.x.begin() + (t + 1) * s.k);
      alone.push_back(compute(c.w_bytes, x_t, {s.k, s.n, 1}, Kernel::ggml));
    }
    for (int threads : {1, 2, 3}) {
      SCOPED_TRACE(std::to_string(threads) + " threads");
      std::string name;
      // (With 3 threads, x's rows as a view with 32 values of padding after each.)
      const std::vector<float> y =
          compute(c.w_bytes, c.x, s, Kernel::row_dot, &name, threads, threads == 3 ? 32 : 0);
      ASSERT_EQ(name, "row_dot_mul_mat");
      for (int64_t t = 0; t < s.m; ++t)
        for (int64_t r = 0; r < s.n; ++r) {
          const float got = y[size_t(t * s.n + r)], want = alone[size_t(t)][size_t(r)];
          ASSERT_EQ(std::memcmp(&got, &want, sizeof got), 0)
              << "token " << t << " row " << r << ": row-dot " << got << ", ggml " << want;
          ASSERT_LE(std::abs(double(got) - c.ref[size_t(t * s.n + r)]), 1e-5 * c.largest)
              << "token " << t << " row " << r;
        }
    }
    ++checked;
  }
  EXPECT_EQ(checked, int(shapes.size()));
}

// Who takes the row-dot kernel: q8_0 weights in host memory, 1 to kRowDotMaxTokens rows, only
// while enabled; model::mul_mat gives longer spans to AMX (where it runs) or ggml.
TEST_F(RowDot, TakesOneToThreeQ8RowsWhileEnabled) {
  ggml_init_params p = {16 * ggml_tensor_overhead(), nullptr, true};
  ggml_context_ptr ctx(ggml_init(p));
  ggml_tensor *w = ggml_new_tensor_2d(ctx.get(), GGML_TYPE_Q8_0, 64, 32);
  ggml_tensor *w16 = ggml_new_tensor_2d(ctx.get(), GGML_TYPE_F16, 64, 32);
  std::vector<ggml_tensor *> xs;
  for (int64_t m = 1; m <= kRowDotMaxTokens + 1; ++m)
    xs.push_back(ggml_new_tensor_2d(ctx.get(), GGML_TYPE_F32, 64, m));
  EXPECT_FALSE(row_dot_takes(w, xs[0])) << "weights not yet in any buffer";
  ggml_backend_ptr backend(ggml_backend_cpu_init());
  ggml_backend_buffer_ptr buf(ggml_backend_alloc_ctx_tensors(ctx.get(), backend.get()));
  for (int64_t m = 1; m <= kRowDotMaxTokens; ++m) {
    EXPECT_TRUE(row_dot_takes(w, xs[size_t(m - 1)])) << m << " rows";
    EXPECT_STREQ(ggml_get_name(mul_mat(ctx.get(), w, xs[size_t(m - 1)])), "row_dot_mul_mat");
  }
  ggml_tensor *longer = xs.back();
  EXPECT_FALSE(row_dot_takes(w, longer));
  EXPECT_STREQ(ggml_get_name(mul_mat(ctx.get(), w, longer)), amx_available() ? "amx_mul_mat" : "");
  EXPECT_FALSE(row_dot_takes(w16, xs[0]));
  set_row_dot_enabled(false);
  EXPECT_FALSE(row_dot_takes(w, xs[0]));
  EXPECT_EQ(mul_mat(ctx.get(), w, xs[0])->op, GGML_OP_MUL_MAT);
  set_row_dot_enabled(true);
  EXPECT_TRUE(row_dot_takes(w, xs[0]));
}

// Without AVX-512 VNNI (or turned off) nothing takes the row-dot kernel.
TEST(RowDotOff, NothingTakesItWhereItIsOff) {
  ggml_init_params p = {4 * ggml_tensor_overhead(), nullptr, true};
  ggml_context_ptr ctx(ggml_init(p));
  ggml_tensor *w = ggml_new_tensor_2d(ctx.get(), GGML_TYPE_Q8_0, 64, 32);
  ggml_tensor *x = ggml_new_tensor_2d(ctx.get(), GGML_TYPE_F32, 64, 1);
  ggml_backend_ptr backend(ggml_backend_cpu_init());
  ggml_backend_buffer_ptr buf(ggml_backend_alloc_ctx_tensors(ctx.get(), backend.get()));
  set_row_dot_enabled(false);
  EXPECT_FALSE(row_dot_takes(w, x));
  set_row_dot_enabled(true);
  EXPECT_EQ(row_dot_takes(w, x), row_dot_available()) << row_dot_unavailable_reason();
}

} // namespace
} // namespace offgraph::model
