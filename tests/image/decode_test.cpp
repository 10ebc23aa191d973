// decode_image against stb_image (Debian's libstb, the decoder llama.cpp's mtmd uses): every
// PNG variant gives stb_image's exact pixels (RGB, grey, grey + alpha, RGBA, palettes with
// transparency, 1-bit, 16-bit, interlaced), JPEG within a few levels of stb_image's (two IDCTs);
// and hostile data (truncated, zero size, huge declared dimensions, CMYK, other formats,
// garbage) is an error that names the problem.
#include "image/decode.h"

#include <png.h>
// jpeglib.h needs FILE and size_t declared first.
#include <cstddef>
#include <cstdio>
#include <jpeglib.h>

#define STB_IMAGE_IMPLEMENTATION
#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb/stb_image.h>
#include <stb/stb_image_write.h>

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace offgraph::image {
namespace {

using Bytes = std::vector<uint8_t>;

// A smooth colour field with noise: compresses like a photo, not like flat colour.
Bytes pixels(int w, int h, int channels, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> noise(-12, 12);
  Bytes p(size_t(w) * size_t(h) * size_t(channels));
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < channels; ++c) {
        const double v = 128 + 100 * std::sin(0.07 * x * (c + 1) + 0.05 * y) + noise(rng);
        p[(size_t(y) * size_t(w) + size_t(x)) * size_t(channels) + size_t(c)] =
            uint8_t(std::clamp(v, 0.0, 255.0));
      }
  return p;
}

void append(void *context, void *data, int size) {
  auto *out = static_cast<Bytes *>(context);
  out->insert(out->end(), static_cast<uint8_t *>(data), static_cast<uint8_t *>(data) + size);
}

Bytes stb_png(const Bytes &p, int w, int h, int channels) {
  Bytes out;
  EXPECT_TRUE(stbi_write_png_to_func(append, &out, w, h, channels, p.data(), w * channels));
  return out;
}

Bytes stb_jpeg(const Bytes &p, int w, int h, int channels, int quality) {
  Bytes out;
  EXPECT_TRUE(stbi_write_jpg_to_func(append, &out, w, h, channels, p.data(), quality));
  return out;
}

// stb_image's RGB of a file (what mtmd feeds its preprocessing).
Bytes stb_rgb(const Bytes &file, int &w, int &h) {
  int n = 0;
  stbi_uc *d = stbi_load_from_memory(file.data(), int(file.size()), &w, &h, &n, 3);
  EXPECT_NE(d, nullptr) << stbi_failure_reason();
  if (!d) return {};
  Bytes out(d, d + size_t(w) * size_t(h) * 3);
  stbi_image_free(d);
  return out;
}

// libpng writes what stb_image_write cannot: palettes (with tRNS), low and 16-bit depths,
// interlacing; or only the header (rows = nullptr: the file ends after IHDR).
struct PngSpec {
  int w = 0, h = 0, color = PNG_COLOR_TYPE_RGB, depth = 8;
  bool interlaced = false;
};
Bytes libpng_file(const PngSpec &s, const Bytes *rows_data) {
  Bytes out;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  if (setjmp(png_jmpbuf(png))) {
    ADD_FAILURE() << "libpng could not write the test image";
    png_destroy_write_struct(&png, &info);
    return {};
  }
  png_set_write_fn(
      png, &out,
      [](png_structp p, png_bytep d, png_size_t n) {
        auto *o = static_cast<Bytes *>(png_get_io_ptr(p));
        o->insert(o->end(), d, d + n);
      },
      nullptr);
  png_set_IHDR(png, info, png_uint_32(s.w), png_uint_32(s.h), s.depth, s.color,
               s.interlaced ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  if (s.color == PNG_COLOR_TYPE_PALETTE) {
    png_color palette[16];
    png_byte alpha[16];
    for (int i = 0; i < 16; ++i) {
      palette[i] = {png_byte(i * 16), png_byte(255 - i * 15), png_byte(i * 7)};
      alpha[i] = png_byte(i * 17);
    }
    png_set_PLTE(png, info, palette, 16);
    png_set_tRNS(png, info, alpha, 16, nullptr);
  }
  png_write_info(png, info);
  if (rows_data) {
    const size_t row_bytes = png_get_rowbytes(png, info);
    std::vector<png_bytep> rows(size_t(s.h));
    for (int y = 0; y < s.h; ++y)
      rows[size_t(y)] = const_cast<png_bytep>(rows_data->data()) + size_t(y) * row_bytes;
    png_write_image(png, rows.data());
    png_write_end(png, nullptr);
  }
  png_destroy_write_struct(&png, &info);
  return out;
}

// The decoder gives stb_image's pixels exactly.
void expect_stb_pixels(const Bytes &file, const char *what) {
  SCOPED_TRACE(what);
  int w = 0, h = 0;
  const Bytes ref = stb_rgb(file, w, h);
  auto got = decode_image(file);
  ASSERT_TRUE(got.ok()) << got.message();
  ASSERT_EQ(got->width, w);
  ASSERT_EQ(got->height, h);
  ASSERT_EQ(got->rgb.size(), ref.size());
  size_t differ = 0;
  for (size_t i = 0; i < ref.size(); ++i) differ += got->rgb[i] != ref[i];
  EXPECT_EQ(differ, 0u) << "of " << ref.size() << " samples";
}

TEST(ImageDecode, PngVariantsGiveStbImagesPixels) {
  // stb_image_write: 8-bit grey, grey + alpha, RGB, RGBA, odd sizes.
  for (int channels : {1, 2, 3, 4}) {
    const Bytes p = pixels(37, 23, channels, 10 + uint64_t(channels));
    expect_stb_pixels(stb_png(p, 37, 23, channels),
                      ("stb png, channels " + std::to_string(channels)).c_str());
  }
  // An RGB PNG is the original pixels.
  const Bytes rgb = pixels(64, 48, 3, 5);
  auto d = decode_image(stb_png(rgb, 64, 48, 3));
  ASSERT_TRUE(d.ok()) << d.message();
  EXPECT_EQ(d->rgb, rgb);
  // libpng: palette with per-entry alpha, 1-bit grey, 16-bit grey and RGB(A), interlaced.
  std::mt19937_64 rng(3);
  auto random_rows = [&](int w, int h, int color, int depth) {
    const int channels = color == PNG_COLOR_TYPE_RGB          ? 3
                         : color == PNG_COLOR_TYPE_RGB_ALPHA  ? 4
                         : color == PNG_COLOR_TYPE_GRAY_ALPHA ? 2
                                                              : 1;
    const size_t row_bytes = (size_t(w) * size_t(channels) * size_t(depth) + 7) / 8;
    Bytes b(row_bytes * size_t(h));
    for (uint8_t &x : b) x = uint8_t(rng());
    if (color == PNG_COLOR_TYPE_PALETTE && depth == 8)
      for (uint8_t &x : b) x &= 15; // 16 palette entries
    return b;
  };
  struct Case {
    PngSpec spec;
    const char *what;
  };
  for (const Case &c : {Case{{29, 17, PNG_COLOR_TYPE_PALETTE, 8, false}, "palette + tRNS"},
                        Case{{29, 17, PNG_COLOR_TYPE_GRAY, 1, false}, "1-bit grey"},
                        Case{{29, 17, PNG_COLOR_TYPE_GRAY, 16, false}, "16-bit grey"},
                        Case{{29, 17, PNG_COLOR_TYPE_RGB, 16, false}, "16-bit RGB"},
                        Case{{29, 17, PNG_COLOR_TYPE_RGB_ALPHA, 16, false}, "16-bit RGBA"},
                        Case{{33, 21, PNG_COLOR_TYPE_RGB, 8, true}, "interlaced RGB"}}) {
    const Bytes rows = random_rows(c.spec.w, c.spec.h, c.spec.color, c.spec.depth);
    expect_stb_pixels(libpng_file(c.spec, &rows), c.what);
  }
}

TEST(ImageDecode, JpegIsWithinAFewLevelsOfStbImage) {
  for (int channels : {1, 3}) {
    const Bytes p = pixels(61, 45, channels, 20 + uint64_t(channels));
    const Bytes file = stb_jpeg(p, 61, 45, channels, 92);
    int w = 0, h = 0;
    const Bytes ref = stb_rgb(file, w, h);
    auto got = decode_image(file);
    ASSERT_TRUE(got.ok()) << got.message();
    ASSERT_EQ(got->width, 61);
    ASSERT_EQ(got->height, 45);
    ASSERT_EQ(got->rgb.size(), ref.size());
    // Two decoders of one file differ by their IDCT and chroma upsampling only.
    int worst = 0;
    double sum = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const int diff = std::abs(int(got->rgb[i]) - int(ref[i]));
      worst = std::max(worst, diff), sum += diff;
    }
    std::printf("[ image    ] JPEG, %d channel(s): worst %d levels from stb_image, mean %.3f\n",
                channels, worst, sum / double(ref.size()));
    EXPECT_LE(worst, 4); // measured 1 (grey) and 2 (colour)
    EXPECT_LE(sum / double(ref.size()), 0.1);
  }
}

void expect_error(const Bytes &file, const std::string &needle, const DecodeLimits &limits = {}) {
  auto got = decode_image(file, limits);
  ASSERT_FALSE(got.ok()) << "decoded " << got->width << "x" << got->height;
  EXPECT_NE(got.message().find(needle), std::string::npos) << got.message();
}

TEST(ImageDecode, HostileDataIsAnErrorThatNamesTheProblem) {
  const Bytes p = pixels(40, 30, 3, 9);
  const Bytes png = stb_png(p, 40, 30, 3), jpeg = stb_jpeg(p, 40, 30, 3, 90);
  // Truncated anywhere past the signature: never a partial image.
  for (size_t cut : {size_t(8), size_t(20), png.size() / 2, png.size() - 13})
    expect_error(Bytes(png.begin(), png.begin() + long(cut)), "invalid PNG");
  for (size_t cut : {size_t(3), size_t(100), jpeg.size() / 2, jpeg.size() - 2})
    expect_error(Bytes(jpeg.begin(), jpeg.begin() + long(cut)), "JPEG");
  expect_error(Bytes(jpeg.begin(), jpeg.begin() + long(jpeg.size() / 2)), "truncated JPEG");
  // Declared dimensions over the limits, refused from the header (the file has no pixels).
  expect_error(libpng_file({100000, 100000, PNG_COLOR_TYPE_RGB, 8, false}, nullptr),
               "over the limit");
  expect_error(libpng_file({5000, 5000, PNG_COLOR_TYPE_GRAY, 8, false}, nullptr), "5000x5000",
               {.max_pixels = 1 << 20, .max_side = 32768});
  // A flipped bit in the data: a CRC or zlib error, not pixels.
  Bytes flipped = png;
  flipped[flipped.size() / 2] ^= 0x40;
  expect_error(flipped, "invalid PNG");
  // Zero size in the header.
  Bytes zero = png;
  zero[16] = zero[17] = zero[18] = zero[19] = 0; // IHDR width
  expect_error(zero, "zero size");
  // Other formats and garbage, by name.
  expect_error(Bytes{'G', 'I', 'F', '8', '9', 'a', 1, 0, 1, 0}, "unsupported image format GIF");
  expect_error(Bytes{'R', 'I', 'F', 'F', 0, 0, 0, 0, 'W', 'E', 'B', 'P'},
               "unsupported image format WebP");
  expect_error(Bytes{'B', 'M', 0, 0}, "unsupported image format BMP");
  expect_error(Bytes{'n', 'o', 't', ' ', 'a', 'n', ' ', 'i', 'm', 'a', 'g', 'e'},
               "not a PNG or JPEG");
  expect_error(Bytes{}, "empty");
}

TEST(ImageDecode, CmykJpegIsRefusedByName) {
  jpeg_compress_struct c;
  jpeg_error_mgr err;
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  unsigned char *buf = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&c, &buf, &size);
  c.image_width = 16, c.image_height = 8, c.input_components = 4, c.in_color_space = JCS_CMYK;
  jpeg_set_defaults(&c);
  jpeg_start_compress(&c, TRUE);
  Bytes row(16 * 4, 100);
  while (c.next_scanline < c.image_height) {
    JSAMPROW r = row.data();
    jpeg_write_scanlines(&c, &r, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  const Bytes file(buf, buf + size);
  free(buf);
  expect_error(file, "CMYK");
}

} // namespace
} // namespace offgraph::image
