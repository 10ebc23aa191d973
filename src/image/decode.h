// decode_image: PNG and JPEG bytes to 8-bit RGB (libpng, libjpeg-turbo), within bounded memory.
// The declared dimensions are checked against the limits before any pixel memory is taken, and
// ancillary PNG chunks and JPEG scans are capped, so that a small file cannot ask for gigabytes
// or minutes (decompression bombs). Truncated data and what libpng and libjpeg call errors are
// errors, never a partial image; data libjpeg only warns about (extraneous bytes, a lost
// restart marker) decodes as libjpeg decodes it.
// Conversion follows stb_image (what llama.cpp's mtmd decodes with), so that a PNG gives the
// reference's exact pixels: alpha is dropped (not composited), 16-bit samples keep their high
// byte, grey is replicated, palettes are expanded; no gamma or colour-profile conversion.
#pragma once

#include "base/status.h"
#include "image/image.h"

#include <cstdint>
#include <span>

namespace offgraph::image {

struct DecodeLimits {
  int64_t max_pixels = int64_t(64) << 20; // width * height (64 Mpx: 192 MiB of RGB)
  int32_t max_side = 32768;
};

Result<Image> decode_image(std::span<const uint8_t> bytes, const DecodeLimits &limits = {});

} // namespace offgraph::image
