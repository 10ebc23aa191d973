// A PNG of random RGB pixels (fixed seed): what the image tests send through decode, the encoder
// and the server. Header-only; stb_image_write is compiled static into each test that includes it.
#pragma once

#define STB_IMAGE_WRITE_STATIC
#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb/stb_image_write.h>

#include <cstdint>
#include <random>
#include <vector>

namespace offgraph::testing {

inline std::vector<uint8_t> random_png(int width, int height, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> px(size_t(width) * size_t(height) * 3);
  for (auto &p : px) p = uint8_t(rng());
  std::vector<uint8_t> out;
  stbi_write_png_to_func(
      [](void *c, void *d, int n) {
        auto *o = static_cast<std::vector<uint8_t> *>(c);
        o->insert(o->end(), static_cast<uint8_t *>(d), static_cast<uint8_t *>(d) + n);
      },
      &out, width, height, 3, px.data(), width * 3);
  return out;
}

} // namespace offgraph::testing
