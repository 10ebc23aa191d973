// Image decoding and preprocessing on arbitrary bytes (PNG and JPEG through libpng and
// libjpeg-turbo, then the Muse Glimmer grid and Lanczos resize under a cap of 64 cells).
// Properties: no crash, hang or unbounded allocation (limits of 4 Mpx and 4096 px a side: the
// declared dimensions are refused before any pixel memory); a decoded image has exactly
// width x height x 3 bytes within the limits; an error has a message; the grid is within the
// cap in cells of 28 px and the resized image has its size.
#include "fuzz_util.h"

#include "image/decode.h"
#include "image/preprocess.h"

using namespace offgraph;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const image::DecodeLimits limits{.max_pixels = int64_t(1) << 22, .max_side = 4096};
  auto decoded = image::decode_image({data, size}, limits);
  if (!decoded.ok()) {
    FUZZ_CHECK(!decoded.message().empty(), "an error without a message");
    return 0;
  }
  const image::Image &img = *decoded;
  FUZZ_CHECK(img.width > 0 && img.height > 0 && img.width <= limits.max_side &&
                 img.height <= limits.max_side &&
                 int64_t(img.width) * img.height <= limits.max_pixels,
             "decoded %dx%d outside the limits", img.width, img.height);
  FUZZ_CHECK(img.rgb.size() == size_t(img.width) * size_t(img.height) * 3,
             "%zu bytes for %dx%d RGB", img.rgb.size(), img.width, img.height);
  const image::GridSize g = image::choose_grid(img.width, img.height, 28, 64);
  FUZZ_CHECK(g.width > 0 && g.height > 0 && g.width % 28 == 0 && g.height % 28 == 0 &&
                 (g.width / 28) * (g.height / 28) <= 64,
             "grid %dx%d for %dx%d", g.width, g.height, img.width, img.height);
  const image::Image resized = image::resize_lanczos(img, g.width, g.height);
  FUZZ_CHECK(resized.width == g.width && resized.height == g.height &&
                 resized.rgb.size() == size_t(g.width) * size_t(g.height) * 3,
             "resized to %dx%d, asked %dx%d", resized.width, resized.height, g.width, g.height);
  return 0;
}
