#include "image/decode.h"

#include <png.h>
// jpeglib.h needs FILE and size_t declared first.
#include <cstddef>
#include <cstdio>
#include <jerror.h>
#include <jpeglib.h>

#include <csetjmp>
#include <cstring>
#include <memory>
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

bool dimensions_fit(int64_t w, int64_t h, const DecodeLimits &limits) {
  return w > 0 && h > 0 && w <= limits.max_side && h <= limits.max_side &&
         w * h <= limits.max_pixels;
}

// What a decode run ended with; the messages are built by the caller, outside the frame that
// called setjmp.
enum class Outcome { Ok, LibraryError, Dimensions, Cmyk, Components, Truncated };

// One PNG decode. Its frame calls setjmp, so it holds no object with a destructor and builds no
// C++ string (a longjmp must not skip a destructor, and GCC warns of locals it may clobber):
// the state lives in `r`, the caller's.
struct PngRun {
  PngSource src;
  PngState state;
  const DecodeLimits *limits;
  Image *out;
  std::vector<png_bytep> *rows;
  int64_t w = 0, h = 0;
};

[[gnu::noinline]] Outcome run_png(PngRun *r) {
  png_structp png =
      png_create_read_struct(PNG_LIBPNG_VER_STRING, &r->state, png_on_error, png_on_warning);
  if (!png) return Outcome::LibraryError;
  png_infop info = png_create_info_struct(png);
  if (!info) {
    png_destroy_read_struct(&png, nullptr, nullptr);
    return Outcome::LibraryError;
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, nullptr);
    return Outcome::LibraryError;
  }
  png_set_read_fn(png, &r->src, png_read_from_span);
  png_set_user_limits(png, png_uint_32(r->limits->max_side), png_uint_32(r->limits->max_side));
  png_set_chunk_malloc_max(png, kPngChunkMax);
  png_read_info(png, info);
  r->w = png_get_image_width(png, info), r->h = png_get_image_height(png, info);
  if (!dimensions_fit(r->w, r->h, *r->limits)) {
    png_destroy_read_struct(&png, &info, nullptr);
    return Outcome::Dimensions;
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
  if (png_get_rowbytes(png, info) != size_t(r->w) * 3)
    png_error(png, "unexpected row layout after conversion to RGB");
  r->out->width = int32_t(r->w), r->out->height = int32_t(r->h);
  r->out->rgb.resize(size_t(r->w) * size_t(r->h) * 3);
  r->rows->resize(size_t(r->h));
  for (int64_t y = 0; y < r->h; ++y)
    (*r->rows)[size_t(y)] = r->out->rgb.data() + size_t(y) * size_t(r->w) * 3;
  png_read_image(png, r->rows->data());
  png_read_end(png, nullptr); // reads (and checks) the rest: a truncated IDAT stream fails here
  png_destroy_read_struct(&png, &info, nullptr);
  return Outcome::Ok;
}

Status decode_png(std::span<const uint8_t> bytes, const DecodeLimits &limits, Image &out) {
  std::vector<png_bytep> rows;
  PngRun r{{bytes}, {}, &limits, &out, &rows};
  switch (run_png(&r)) {
  case Outcome::Ok:
    return ok_status();
  case Outcome::Dimensions:
    out = {};
    return check_dimensions("PNG", r.w, r.h, limits);
  default:
    out = {};
    if (!r.state.error[0]) return Status::error("PNG: out of memory", StatusCode::kInternal);
    return Status::error(std::string("invalid PNG: ") + r.state.error +
                         (r.state.warning[0] ? std::string(" (") + r.state.warning + ")" : ""));
  }
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

// One JPEG decode; as run_png, nothing with a destructor in the frame that calls setjmp.
struct JpegRun {
  std::span<const uint8_t> bytes;
  const DecodeLimits *limits;
  Image *out;
  jpeg_decompress_struct cinfo{};
  JpegError err{};
  jpeg_progress_mgr progress{};
  int components = 0;
};

[[gnu::noinline]] Outcome run_jpeg(JpegRun *r) {
  jpeg_decompress_struct *cinfo = &r->cinfo;
  cinfo->err = jpeg_std_error(&r->err.mgr);
  r->err.mgr.error_exit = jpeg_on_error;
  r->err.mgr.emit_message = jpeg_on_message;
  if (setjmp(r->err.jump)) {
    jpeg_destroy_decompress(cinfo);
    return Outcome::LibraryError;
  }
  jpeg_create_decompress(cinfo);
  r->progress.progress_monitor = jpeg_on_progress;
  cinfo->progress = &r->progress;
  jpeg_mem_src(cinfo, r->bytes.data(), static_cast<unsigned long>(r->bytes.size()));
  jpeg_read_header(cinfo, TRUE);
  if (!dimensions_fit(cinfo->image_width, cinfo->image_height, *r->limits)) {
    jpeg_destroy_decompress(cinfo);
    return Outcome::Dimensions;
  }
  if (cinfo->jpeg_color_space == JCS_CMYK || cinfo->jpeg_color_space == JCS_YCCK) {
    jpeg_destroy_decompress(cinfo);
    return Outcome::Cmyk;
  }
  cinfo->out_color_space = JCS_RGB;
  // What the coefficient buffers of a progressive image may take (they are full-image).
  cinfo->mem->max_memory_to_use = long(r->limits->max_pixels) * 3 * 4;
  jpeg_start_decompress(cinfo);
  if (cinfo->output_components != 3) {
    r->components = cinfo->output_components;
    jpeg_destroy_decompress(cinfo);
    return Outcome::Components;
  }
  const size_t w = cinfo->output_width, h = cinfo->output_height;
  r->out->width = int32_t(w), r->out->height = int32_t(h);
  r->out->rgb.resize(w * h * 3);
  while (cinfo->output_scanline < cinfo->output_height && !r->err.truncated) {
    JSAMPROW row = r->out->rgb.data() + size_t(cinfo->output_scanline) * w * 3;
    jpeg_read_scanlines(cinfo, &row, 1);
  }
  if (!r->err.truncated) jpeg_finish_decompress(cinfo);
  jpeg_destroy_decompress(cinfo);
  return r->err.truncated ? Outcome::Truncated : Outcome::Ok;
}

Status decode_jpeg(std::span<const uint8_t> bytes, const DecodeLimits &limits, Image &out) {
  auto r = std::make_unique<JpegRun>();
  r->bytes = bytes, r->limits = &limits, r->out = &out;
  const Outcome outcome = run_jpeg(r.get());
  if (outcome != Outcome::Ok) out = {};
  switch (outcome) {
  case Outcome::Ok:
    return ok_status();
  case Outcome::Dimensions:
    return check_dimensions("JPEG", r->cinfo.image_width, r->cinfo.image_height, limits);
  case Outcome::Cmyk:
    return Status::error("JPEG: CMYK images are not supported (convert to RGB)");
  case Outcome::Components:
    return Status::error("JPEG: unexpected " + std::to_string(r->components) +
                         " components after conversion to RGB");
  case Outcome::Truncated:
    return Status::error("invalid JPEG: the data ends early (truncated JPEG)");
  case Outcome::LibraryError:
    break;
  }
  // libjpeg pads data that ends early with an end marker, then trips over it.
  return Status::error(std::string("invalid JPEG: ") + r->err.message +
                       (r->err.truncated ? " (the data ends early: truncated JPEG)" : ""));
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
