// The fused soft-cap op (model/softcap.h) against tanh in double precision, and its threaded
// graph op against its own arithmetic value by value (every row split between threads, lengths
// that are not multiples of 8).
#include "model/softcap.h"

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpp.h"
#include "ggml-cpu.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

namespace offgraph::model {
namespace {

struct Case {
  float logit_scale, cap;
};
// Muse Glimmer's constants (MUSE_GLIMMER.md: logit_scale 0.196..., cap 20; a file without the
// cap key is capped at 30) and a plain cap of 30 with no multiplier.
constexpr Case kCases[] = {
    {0.19611613513818404f, 20.0f}, {0.19611613513818404f, 30.0f}, {1.0f, 30.0f}};

// Values a head can produce: a dense sweep through the transition, random logits of several
// magnitudes, and the edges (signed zeros, denormals, huge, infinite).
std::vector<float> inputs() {
  std::vector<float> x;
  for (int i = -200000; i <= 200000; ++i) x.push_back(float(i) * 1e-3f); // [-200, 200]
  std::mt19937 rng(7);
  for (float scale : {1e-6f, 1e-3f, 1.0f, 30.0f, 1000.0f}) {
    std::normal_distribution<float> d(0.0f, scale);
    for (int i = 0; i < 20000; ++i) x.push_back(d(rng));
  }
  const float inf = std::numeric_limits<float>::infinity();
  for (float e : {0.0f, -0.0f, 1e-40f, -1e-40f, 3e38f, -3e38f, inf, -inf}) x.push_back(e);
  return x;
}

TEST(Softcap, ValuesAgainstDoubleTanh) {
  const std::vector<float> x = inputs();
  for (const Case &c : kCases) {
    const float pre = c.logit_scale / c.cap;
    std::vector<float> y(x.size());
    softcap_values(x.data(), y.data(), int64_t(x.size()), pre, c.cap);
    double worst_abs = 0, worst_rel = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      // The reference takes the same f32 argument x * pre (its rounding is the op's input).
      const double want = double(c.cap) * std::tanh(double(x[i] * pre));
      const double err = std::fabs(double(y[i]) - want);
      worst_abs = std::max(worst_abs, err);
      if (want != 0) worst_rel = std::max(worst_rel, err / std::fabs(want));
      ASSERT_LE(err, 2.5e-7 * c.cap) << "x " << x[i] << " cap " << c.cap;
      ASSERT_LE(err, 4e-7 * std::fabs(want) + 1e-37) << "x " << x[i] << " cap " << c.cap;
      ASSERT_EQ(std::signbit(y[i]), std::signbit(x[i])) << "x " << x[i];
    }
    std::printf("[ softcap  ] cap %g: %zu values, worst |error| %.3g (%.3g of the cap), worst "
                "relative %.3g\n",
                double(c.cap), x.size(), worst_abs, worst_abs / c.cap, worst_rel);
  }
  // NaN stays NaN (a broken head must not turn into plausible logits).
  const float nan = std::numeric_limits<float>::quiet_NaN();
  float v[3] = {nan, 1.0f, -nan}, out[3];
  softcap_values(v, out, 3, 0.01f, 20.0f);
  EXPECT_TRUE(std::isnan(out[0]) && std::isnan(out[2]));
  EXPECT_FALSE(std::isnan(out[1]));
}

// The graph op on [n, rows] for n around multiples of 8 and 1 to 3 rows, with 1 to 4 threads:
// every value computed exactly once and equal to softcap_values' (slices are 8-aligned).
TEST(Softcap, GraphOpSplitsRowsBetweenThreads) {
  ggml_backend_ptr backend(ggml_backend_cpu_init());
  std::mt19937 rng(11);
  std::normal_distribution<float> d(0.0f, 40.0f);
  const SoftcapParams params{0.19611613513818404f / 20.0f, 20.0f};
  for (int threads : {1, 2, 3, 4})
    for (int64_t n : {1, 7, 8, 9, 1001, 128256})
      for (int64_t rows : {1, 3}) {
        ggml_backend_cpu_set_n_threads(backend.get(), threads);
        ggml_init_params ip = {8 * ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true};
        ggml_context_ptr ctx(ggml_init(ip));
        ggml_tensor *in = ggml_new_tensor_2d(ctx.get(), GGML_TYPE_F32, n, rows);
        ggml_set_input(in);
        ggml_tensor *out = softcap_logits(ctx.get(), in, &params);
        ggml_cgraph *gf = ggml_new_graph(ctx.get());
        ggml_build_forward_expand(gf, out);
        ggml_gallocr_ptr alloc(
            ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend.get())));
        ASSERT_TRUE(ggml_gallocr_alloc_graph(alloc.get(), gf));
        std::vector<float> x(size_t(n * rows)), want(x.size()), got(x.size(), -1.0f);
        for (float &v : x) v = d(rng);
        ggml_backend_tensor_set(in, x.data(), 0, ggml_nbytes(in));
        ASSERT_EQ(ggml_backend_graph_compute(backend.get(), gf), GGML_STATUS_SUCCESS);
        ggml_backend_tensor_get(out, got.data(), 0, ggml_nbytes(out));
        softcap_values(x.data(), want.data(), int64_t(x.size()), params.pre, params.cap);
        for (size_t i = 0; i < x.size(); ++i)
          ASSERT_EQ(got[i], want[i])
              << "threads " << threads << " n " << n << " rows " << rows << " at " << i;
      }
}

} // namespace
} // namespace offgraph::model
