#include "image/preprocess.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace offgraph::image {

GridSize choose_grid(int32_t width, int32_t height, int32_t cell, int32_t max_tokens) {
  double rows = double(height) / cell, cols = double(width) / cell;
  const double ratio = rows > 0 ? cols / rows : 1.0;
  if (rows * cols > double(max_tokens)) { // shrink to the cap, keeping the aspect ratio
    rows = std::sqrt(double(max_tokens) / ratio);
    cols = rows * ratio;
  }
  const double target = double(height) / double(width);
  const int64_t hs[2] = {int64_t(std::floor(rows)), int64_t(std::ceil(rows))};
  const int64_t ws[2] = {int64_t(std::floor(cols)), int64_t(std::ceil(cols))};
  int64_t best_rows = 0, best_cols = 0;
  double best = 0;
  bool found = false;
  for (int64_t r : hs)
    for (int64_t c : ws) {
      if (r < 1 || c < 1 || r * c > max_tokens) continue;
      const double d = std::abs(double(r) / double(c) - target);
      if (!found || d < best || (d == best && r * c > best_rows * best_cols)) {
        best = d, best_rows = r, best_cols = c, found = true;
      }
    }
  if (!found) {
    best_rows = std::max<int64_t>(1, std::llround(rows));
    best_cols = std::max<int64_t>(1, std::llround(cols));
    // The reference stops here and can exceed its cap (a long thin image under a small cap);
    // the cap bounds the encoder's memory, so the longer side gives way.
    if (best_rows * best_cols > max_tokens) {
      if (best_rows >= best_cols)
        best_rows = std::max<int64_t>(1, max_tokens / best_cols);
      else
        best_cols = std::max<int64_t>(1, max_tokens / best_rows);
    }
  }
  return {int32_t(best_cols * cell), int32_t(best_rows * cell)};
}

namespace {

// Pillow's Resample.c: weights in fixed point with 22 fraction bits (32 - 8 - 2).
constexpr int kPrecisionBits = 22;
constexpr double kLanczosSupport = 3.0;

double sinc(double x) {
  if (x == 0.0) return 1.0;
  x *= std::numbers::pi;
  return std::sin(x) / x;
}

double lanczos(double x) {
  if (-3.0 <= x && x < 3.0) return sinc(x) * sinc(x / 3);
  return 0.0;
}

// One axis's taps: output i reads inputs [first[i], first[i] + count[i]) with weights[i * taps].
struct Taps {
  int32_t taps = 0;
  std::vector<int32_t> first, count, weights;
};

Taps precompute(int32_t in_size, int32_t out_size) {
  const double scale = double(in_size) / out_size;
  const double filterscale = std::max(scale, 1.0);
  const double support = kLanczosSupport * filterscale;
  Taps t;
  t.taps = int32_t(std::ceil(support)) * 2 + 1;
  t.first.resize(size_t(out_size));
  t.count.resize(size_t(out_size));
  t.weights.assign(size_t(out_size) * size_t(t.taps), 0);
  std::vector<double> k(size_t(t.taps));
  for (int32_t xx = 0; xx < out_size; ++xx) {
    const double center = (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    // Truncating casts, as Pillow's (int): the +0.5 rounds only non-negative values.
    const int32_t xmin = std::max(0, int32_t(center - support + 0.5));
    const int32_t xmax = std::min(in_size, int32_t(center + support + 0.5)) - xmin;
    double sum = 0;
    for (int32_t x = 0; x < xmax; ++x) {
      k[size_t(x)] = lanczos((x + xmin - center + 0.5) * ss);
      sum += k[size_t(x)];
    }
    for (int32_t x = 0; x < xmax; ++x) {
      const double w = sum != 0.0 ? k[size_t(x)] / sum : k[size_t(x)];
      t.weights[size_t(xx) * size_t(t.taps) + size_t(x)] =
          w < 0 ? int32_t(-0.5 + w * (1 << kPrecisionBits))
                : int32_t(0.5 + w * (1 << kPrecisionBits));
    }
    t.first[size_t(xx)] = xmin;
    t.count[size_t(xx)] = xmax;
  }
  return t;
}

uint8_t clip8(int32_t acc) { return uint8_t(std::clamp(acc >> kPrecisionBits, 0, 255)); }

Image horizontal(const Image &in, int32_t width) {
  const Taps t = precompute(in.width, width);
  Image out{width, in.height, std::vector<uint8_t>(size_t(width) * size_t(in.height) * 3)};
  for (int32_t y = 0; y < in.height; ++y) {
    const uint8_t *row = in.rgb.data() + size_t(y) * size_t(in.width) * 3;
    uint8_t *dst = out.rgb.data() + size_t(y) * size_t(width) * 3;
    for (int32_t xx = 0; xx < width; ++xx) {
      const int32_t *k = t.weights.data() + size_t(xx) * size_t(t.taps);
      int32_t acc[3] = {1 << (kPrecisionBits - 1), 1 << (kPrecisionBits - 1),
                        1 << (kPrecisionBits - 1)};
      for (int32_t x = 0; x < t.count[size_t(xx)]; ++x) {
        const uint8_t *px = row + size_t(x + t.first[size_t(xx)]) * 3;
        for (int c = 0; c < 3; ++c) acc[c] += int32_t(px[c]) * k[x];
      }
      for (int c = 0; c < 3; ++c) dst[size_t(xx) * 3 + size_t(c)] = clip8(acc[c]);
    }
  }
  return out;
}

Image vertical(const Image &in, int32_t height) {
  const Taps t = precompute(in.height, height);
  const size_t stride = size_t(in.width) * 3;
  Image out{in.width, height, std::vector<uint8_t>(stride * size_t(height))};
  for (int32_t yy = 0; yy < height; ++yy) {
    const int32_t *k = t.weights.data() + size_t(yy) * size_t(t.taps);
    uint8_t *dst = out.rgb.data() + size_t(yy) * stride;
    for (size_t i = 0; i < stride; ++i) {
      int32_t acc = 1 << (kPrecisionBits - 1);
      for (int32_t y = 0; y < t.count[size_t(yy)]; ++y)
        acc += int32_t(in.rgb[size_t(y + t.first[size_t(yy)]) * stride + i]) * k[y];
      dst[i] = clip8(acc);
    }
  }
  return out;
}

} // namespace

Image resize_lanczos(const Image &in, int32_t width, int32_t height) {
  if (in.width == width && in.height == height) return in;
  Image out = in.width != width ? horizontal(in, width) : in;
  if (in.height != height) out = vertical(out, height);
  return out;
}

std::vector<float> normalize_planar(const Image &in, const std::array<float, 3> &mean,
                                    const std::array<float, 3> &std_dev) {
  const size_t n = size_t(in.width) * size_t(in.height);
  std::vector<float> out(n * 3);
  for (size_t i = 0; i < n; ++i)
    for (size_t c = 0; c < 3; ++c)
      out[c * n + i] = (float(in.rgb[i * 3 + c]) / 255.0f - mean[c]) / std_dev[c];
  return out;
}

} // namespace offgraph::image
