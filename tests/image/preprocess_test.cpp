// Preprocessing against a direct computation: tests/image/pillow_reference.py (Pillow's own
// Image.resize(LANCZOS), numpy's normalisation, the grid written out in Python) on the same
// images: the chosen size equal, every resized byte equal, normalised floats within 1 ulp-ish
// (1e-6). And the grid against the sizes llama.cpp's code chooses (worked out from mtmd-image.cpp).
#include "image/preprocess.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <unistd.h>

namespace offgraph::image {
namespace {

namespace fs = std::filesystem;

TEST(ImagePreprocess, GridIsTheOneTheReferenceChooses) {
  struct Case {
    int w, h, out_w, out_h;
  };
  // From llama.cpp's mtmd-image.cpp formula (max 4096 cells of 28 px).
  for (const Case &c :
       {Case{640, 480, 644, 476}, Case{1024, 768, 1008, 756}, Case{1920, 1080, 1932, 1092},
        Case{4000, 3000, 2044, 1540}, Case{896, 896, 896, 896}, Case{448, 448, 448, 448},
        Case{2000, 2000, 1792, 1792}, Case{100, 50, 112, 56}, Case{10, 10, 28, 28}}) {
    const GridSize g = choose_grid(c.w, c.h, 28, 4096);
    EXPECT_EQ(g.width, c.out_w) << c.w << "x" << c.h;
    EXPECT_EQ(g.height, c.out_h) << c.w << "x" << c.h;
  }
  // Never more than the cap, both sides multiples of the cell, for any shape.
  std::mt19937 rng(4);
  for (int i = 0; i < 20000; ++i) {
    const int w = std::uniform_int_distribution<int>(1, 9000)(rng);
    const int h = std::uniform_int_distribution<int>(1, 9000)(rng);
    const int cap = std::uniform_int_distribution<int>(1, 5000)(rng);
    const GridSize g = choose_grid(w, h, 28, cap);
    ASSERT_GT(g.width, 0);
    ASSERT_GT(g.height, 0);
    ASSERT_EQ(g.width % 28, 0);
    ASSERT_EQ(g.height % 28, 0);
    ASSERT_LE(int64_t(g.width / 28) * (g.height / 28), std::max(cap, 1)) << w << "x" << h;
  }
}

struct Reference {
  GridSize size;
  std::vector<uint8_t> rgb;
  std::vector<float> planar;
};

std::vector<char> slurp(const fs::path &p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// Runs the Python reference on `img`; false (with a failure) if it could not.
bool reference(const Image &img, int max_tokens, const std::array<float, 3> &mean,
               const std::array<float, 3> &std_dev, Reference &out) {
  const fs::path dir = fs::temp_directory_path() / ("offgraph-image-" + std::to_string(getpid()));
  fs::create_directories(dir);
  const fs::path in = dir / "in.rgb", prefix = dir / "out";
  std::ofstream(in, std::ios::binary)
      .write(reinterpret_cast<const char *>(img.rgb.data()), std::streamsize(img.rgb.size()));
  char cmd[2048];
  std::snprintf(cmd, sizeof(cmd),
                "/usr/bin/python3 %s/tests/image/pillow_reference.py %s %d %d 28 %d %.9g %.9g %.9g "
                "%.9g %.9g %.9g %s",
                OFFGRAPH_SOURCE_DIR, in.c_str(), img.width, img.height, max_tokens, mean[0],
                mean[1], mean[2], std_dev[0], std_dev[1], std_dev[2], prefix.c_str());
  if (std::system(cmd) != 0) {
    ADD_FAILURE() << "the reference failed: " << cmd;
    return false;
  }
  std::ifstream(prefix.string() + ".size") >> out.size.width >> out.size.height;
  const auto rgb = slurp(prefix.string() + ".rgb");
  out.rgb.assign(rgb.begin(), rgb.end());
  const auto f32 = slurp(prefix.string() + ".f32");
  out.planar.resize(f32.size() / sizeof(float));
  std::memcpy(out.planar.data(), f32.data(), f32.size());
  fs::remove_all(dir);
  return true;
}

// A photo-like image: smooth gradients, a sharp edge (the Lanczos lobes overshoot and clip
// there), noise.
Image picture(int w, int h, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> noise(-20, 20);
  Image img{w, h, std::vector<uint8_t>(size_t(w) * size_t(h) * 3)};
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c) {
        double v = 128 + 90 * std::sin(0.031 * x * (c + 1) + 0.017 * y * (3 - c));
        if (x > w / 3 && x < w / 3 + 5) v = c == 1 ? 255 : 0; // an edge
        v += noise(rng);
        img.rgb[(size_t(y) * size_t(w) + size_t(x)) * 3 + size_t(c)] =
            uint8_t(std::clamp(v, 0.0, 255.0));
      }
  return img;
}

TEST(ImagePreprocess, MatchesPillowAndNumpyByteForByte) {
  const std::array<float, 3> mean = {0.5f, 0.5f, 0.5f}, std_dev = {0.5f, 0.5f, 0.5f};
  const std::array<float, 3> mean2 = {0.48145466f, 0.4578275f, 0.40821073f},
                             std2 = {0.26862954f, 0.26130258f, 0.27577711f};
  struct Case {
    int w, h, max_tokens;
    bool clip_stats;
  };
  // Down- and upscaling, non-square, one side unchanged (one pass), already at size (a copy),
  // capped (above 32 patches a side), tiny.
  for (const Case &c :
       {Case{640, 480, 4096, false}, Case{300, 701, 4096, true}, Case{1000, 250, 256, false},
        Case{448, 300, 4096, true}, Case{448, 448, 4096, false}, Case{13, 9, 4096, false},
        Case{1205, 903, 1024, true}}) {
    SCOPED_TRACE(std::to_string(c.w) + "x" + std::to_string(c.h) + " cap " +
                 std::to_string(c.max_tokens));
    const Image img = picture(c.w, c.h, uint64_t(c.w) * 7 + uint64_t(c.h));
    const auto &m = c.clip_stats ? mean2 : mean;
    const auto &s = c.clip_stats ? std2 : std_dev;
    Reference ref;
    ASSERT_TRUE(reference(img, c.max_tokens, m, s, ref));
    const GridSize g = choose_grid(c.w, c.h, 28, c.max_tokens);
    ASSERT_EQ(g.width, ref.size.width);
    ASSERT_EQ(g.height, ref.size.height);
    const Image resized = resize_lanczos(img, g.width, g.height);
    ASSERT_EQ(resized.rgb.size(), ref.rgb.size());
    size_t differ = 0;
    for (size_t i = 0; i < ref.rgb.size(); ++i) differ += resized.rgb[i] != ref.rgb[i];
    EXPECT_EQ(differ, 0u) << "of " << ref.rgb.size() << " bytes differ from Pillow's";
    const std::vector<float> planar = normalize_planar(resized, m, s);
    ASSERT_EQ(planar.size(), ref.planar.size());
    double worst = 0;
    for (size_t i = 0; i < planar.size(); ++i)
      worst = std::max(worst, double(std::abs(planar[i] - ref.planar[i])));
    EXPECT_LE(worst, 1e-6);
    std::printf("[ image    ] %dx%d -> %dx%d: %zu bytes, all equal to Pillow's: %s; worst "
                "normalised difference %.2g\n",
                c.w, c.h, g.width, g.height, ref.rgb.size(), differ == 0 ? "yes" : "no", worst);
  }
}

} // namespace
} // namespace offgraph::image
