#include "image/decode.h"

#include <png.h>
// jpeglib.h needs FILE and size_t declared first.
#include <cstddef>
#include <cstdio>
#include <jerror.h>
#include <jpeglib.h>

#include <csetjmp>
#include <cstring>
#include <string>
#include <string_view>

namespace offgraph::image {
namespace {

constexpr uint8_t kPngMagic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
// Memory one ancillary PNG chunk (text, ICC profile, ...) may take once decompressed: a
// compressed text chunk is a bomb of its own.
constexpr png_alloc_size_t kPngChunkMax = png_alloc_size_t(8) << 20;
// Scans of a progressive JPEG: each costs a pass over the coefficients, and a file of many tiny
// scans costs minutes (libjpeg-turbo's TurboJPEG API stops at 500 as well).
constexpr int kJpegMaxScans = 500;

std::string dims(int64_t w, int64_t h) { return std::to_string(w) + "x" + std::to_string(h); }

Status check_dimensions(const char *format, int64_t w, int64_t h, const DecodeLimits &limits) {
  if (w <= 0 || h <= 0)
    return Status::error(std::string(format) + " image has zero size (" + dims(w, h) + ")");
  if (w > limits.max_side || h > limits.max_side || w * h > limits.max_pixels)
    return Status::error(std::string(format) + " image is " + dims(w, h) + ", over the limit of " +
                         std::to_string(limits.max_side) + " pixels a side and " +
                         std::to_string(limits.max_pixels) + " pixels in all");
  return ok_status();
}

// ---- PNG (libpng's progressive-free read API; errors longjmp back to decode_png) ----

struct PngSource {
  std::span<const uint8_t> bytes;
  size_t at = 0;
};

struct PngState {
  char error[256] = {};
  char warning[256] = {}; // the last one: libpng names an IHDR problem in a warning first
};

void png_read_from_span(png_structp png, png_bytep out, png_size_t n) {
  auto *src = static_cast<PngSource *>(png_get_io_ptr(png));
  if (n > src->bytes.size() - src->at) png_error(png, "the data ends early (truncated PNG)");
  std::memcpy(out, src->bytes.data() + src->at, n);
  src->at += n;
}

void png_on_error(png_structp png, png_const_charp message) {
  auto *state = static_cast<PngState *>(png_get_error_ptr(png));
  std::snprintf(state->error, sizeof(state->error), "%s", message);
  png_longjmp(png, 1);
}

void png_on_warning(png_structp png, png_const_charp message) {
  auto *state = static_cast<PngState *>(png_get_error_ptr(png));
  std::snprintf(state->warning, sizeof(state->warning), "%s", message);
}

uint32_t big_endian_u32(const uint8_t *p) {
  return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | uint32_t(p[3]);
}

// Everything with a destructor is declared by the caller, before setjmp: a longjmp must not skip
// a destructor (C++ makes that undefined).
Status decode_png(std::span<const uint8_t> bytes, const DecodeLimits &limits, Image &out) {
  PngSource src{bytes};
  PngState state;
  std::vector<png_bytep> rows;
  Status checked = ok_status();
  png_structp png =
      png_create_read_struct(PNG_LIBPNG_VER_STRING, &state, png_on_error, png_on_warning);
  if (!png) return Status::error("PNG: out of memory", StatusCode::kInternal);
  png_infop info = png_create_info_struct(png);
  if (!info) {
    png_destroy_read_struct(&png, nullptr, nullptr);
    return Status::error("PNG: out of memory", StatusCode::kInternal);
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, nullptr);
    out = {};
    return Status::error(std::string("invalid PNG: ") + state.error +
                         (state.warning[0] ? std::string(" (") + state.warning + ")" : ""));
  }
  png_set_read_fn(png, &src, png_read_from_span);
  png_set_user_limits(png, png_uint_32(limits.max_side), png_uint_32(limits.max_side));
  png_set_chunk_malloc_max(png, kPngChunkMax);
  png_read_info(png, info);
  const int64_t w = png_get_image_width(png, info), h = png_get_image_height(png, info);
  checked = check_dimensions("PNG", w, h, limits);
  if (!checked.ok()) {
    png_destroy_read_struct(&png, &info, nullptr);
    return checked;
  }
  // To 8-bit RGB as stb_image does: palettes and low bit depths expanded, 16-bit to its high
  // byte, grey replicated, alpha (and a tRNS colour key) dropped.
  const int color = png_get_color_type(png, info);
  if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (color == PNG_COLOR_TYPE_GRAY && png_get_bit_depth(png, info) < 8)
    png_set_expand_gray_1_2_4_to_8(png);
  if (png_get_bit_depth(png, info) == 16) png_set_strip_16(png);
  if (color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(png);
  if ((color & PNG_COLOR_MASK_ALPHA) || png_get_valid(png, info, PNG_INFO_tRNS))
    png_set_strip_alpha(png); // a palette's tRNS becomes alpha on expansion
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  if (png_get_rowbytes(png, info) != size_t(w) * 3)
    png_error(png, "unexpected row layout after conversion to RGB");
  out.width = int32_t(w), out.height = int32_t(h);
  out.rgb.resize(size_t(w) * size_t(h) * 3);
  rows.resize(size_t(h));
  for (int64_t y = 0; y < h; ++y) rows[size_t(y)] = out.rgb.data() + size_t(y) * size_t(w) * 3;
  png_read_image(png, rows.data());
  png_read_end(png, nullptr); // reads (and checks) the rest: a truncated IDAT stream fails here
  png_destroy_read_struct(&png, &info, nullptr);
  return ok_status();
}

// ---- JPEG (libjpeg-turbo; errors longjmp back to decode_jpeg) ----

struct JpegError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX] = {};
  bool truncated = false;
};

void jpeg_on_error(j_common_ptr cinfo) {
  auto *err = reinterpret_cast<JpegError *>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// Warnings are where libjpeg reports data that ends early (it then pads with grey): an error.
void jpeg_on_message(j_common_ptr cinfo, int level) {
  auto *err = reinterpret_cast<JpegError *>(cinfo->err);
  if (level >= 0) return; // trace messages
  if (cinfo->err->msg_code == JWRN_JPEG_EOF) err->truncated = true;
}

void jpeg_on_progress(j_common_ptr cinfo) {
  if (cinfo->is_decompressor &&
      reinterpret_cast<j_decompress_ptr>(cinfo)->input_scan_number > kJpegMaxScans) {
    auto *err = reinterpret_cast<JpegError *>(cinfo->err);
    std::snprintf(err->message, sizeof(err->message), "more than %d scans", kJpegMaxScans);
    std::longjmp(err->jump, 1);
  }
}

Status decode_jpeg(std::span<const uint8_t> bytes, const DecodeLimits &limits, Image &out) {
  jpeg_decompress_struct cinfo{};
  JpegError err{};
  jpeg_progress_mgr progress;
  Status checked = ok_status();
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jpeg_on_error;
  err.mgr.emit_message = jpeg_on_message;
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    out = {};
    // libjpeg pads data that ends early with an end marker, then trips over it.
    return Status::error(std::string("invalid JPEG: ") + err.message +
                         (err.truncated ? " (the data ends early: truncated JPEG)" : ""));
  }
  jpeg_create_decompress(&cinfo);
  progress.progress_monitor = jpeg_on_progress;
  cinfo.progress = &progress;
  jpeg_mem_src(&cinfo, bytes.data(), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&cinfo, TRUE);
  checked = check_dimensions("JPEG", cinfo.image_width, cinfo.image_height, limits);
  if (!checked.ok()) {
    jpeg_destroy_decompress(&cinfo);
    return checked;
  }
  if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
    jpeg_destroy_decompress(&cinfo);
    return Status::error("JPEG: CMYK images are not supported (convert to RGB)");
  }
  cinfo.out_color_space = JCS_RGB;
  // What the coefficient buffers of a progressive image may take (they are full-image).
  cinfo.mem->max_memory_to_use = long(limits.max_pixels) * 3 * 4;
  jpeg_start_decompress(&cinfo);
  const int64_t w = cinfo.output_width, h = cinfo.output_height;
  if (cinfo.output_components != 3) {
    jpeg_destroy_decompress(&cinfo);
    return Status::error("JPEG: unexpected " + std::to_string(cinfo.output_components) +
                         " components after conversion to RGB");
  }
  out.width = int32_t(w), out.height = int32_t(h);
  out.rgb.resize(size_t(w) * size_t(h) * 3);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = out.rgb.data() + size_t(cinfo.output_scanline) * size_t(w) * 3;
    jpeg_read_scanlines(&cinfo, &row, 1);
    if (err.truncated) break;
  }
  if (!err.truncated) jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  if (err.truncated) {
    out = {};
    return Status::error("invalid JPEG: the data ends early (truncated JPEG)");
  }
  return ok_status();
}

} // namespace

Result<Image> decode_image(std::span<const uint8_t> bytes, const DecodeLimits &limits) {
  if (bytes.empty()) return Status::error("the image is empty (0 bytes)");
  Image out;
  if (bytes.size() >= sizeof(kPngMagic) && std::memcmp(bytes.data(), kPngMagic, 8) == 0) {
    // The dimensions first, from IHDR (always the first chunk), before libpng reads further.
    if (bytes.size() >= 24 && std::memcmp(bytes.data() + 12, "IHDR", 4) == 0)
      OFFGRAPH_TRY(check_dimensions("PNG", big_endian_u32(bytes.data() + 16),
                                    big_endian_u32(bytes.data() + 20), limits));
    OFFGRAPH_TRY(decode_png(bytes, limits, out));
    return out;
  }
  if (bytes.size() >= 3 && bytes[0] == 0xFF && bytes[1] == 0xD8 && bytes[2] == 0xFF) {
    OFFGRAPH_TRY(decode_jpeg(bytes, limits, out));
    return out;
  }
  auto at = [&](size_t offset, std::string_view magic) {
    return bytes.size() >= offset + magic.size() &&
           std::memcmp(bytes.data() + offset, magic.data(), magic.size()) == 0;
  };
  using namespace std::string_view_literals;
  const char *format = at(0, "GIF8")                          ? "GIF"
                       : at(0, "RIFF") && at(8, "WEBP")       ? "WebP"
                       : at(0, "BM")                          ? "BMP"
                       : at(0, "II*\0"sv) || at(0, "MM\0*"sv) ? "TIFF"
                       : at(4, "ftyp")                        ? "HEIF/AVIF"
                                                              : nullptr;
  if (format)
    return Status::error(std::string("unsupported image format ") + format +
                         " (PNG and JPEG are supported)");
  return Status::error("the data is not a PNG or JPEG image (unknown format; PNG and JPEG are "
                       "supported)");
}

} // namespace offgraph::image
