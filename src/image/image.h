// Image: decoded pixels, 8-bit RGB, row after row (what every preprocessing step takes).
#pragma once

#include <cstdint>
#include <vector>

namespace offgraph::image {

struct Image {
  int32_t width = 0, height = 0;
  std::vector<uint8_t> rgb; // width * height * 3 bytes, top row first
};

} // namespace offgraph::image
