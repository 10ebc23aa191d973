// One image through the vision encoder, timed: what bench/vision runs on offgraph's side (one
// process per image size, so VmHWM is that size's peak). Each rep does what
// engine::ImageEncoder::encode does with its cache off (SHA-256 of the bytes, decode, grid,
// Lanczos resize, normalise, model::encode_image), step by step, so that the encoder's share can
// be set beside llama.cpp's "image slice encoded in N ms" (which times mtmd_encode_chunk alone).
//
//   vision_encode_bench MMPROJ IMAGE [REPS=3] [THREADS=2] [DUMP]
//
// DUMP: the last rep's rows written there as llama.cpp's MTMD_DEBUG_EMBEDDINGS writes them (i32
// rows, i32 width, then rows x width f32), for a check against the reference's.
// Prints one JSON object on stdout: per-rep seconds of each step, the grid and rows, and the
// process's VmRSS after loading and VmHWM at the end (bytes; the mmproj is mapped, so its pages
// count once touched).
#include "engine/images.h"
#include "image/decode.h"
#include "image/preprocess.h"
#include "model/vision.h"
#include "model/vision_encoder.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace {

int64_t status_bytes(const char *key) { // a "kB" line of /proc/self/status, in bytes
  std::ifstream f("/proc/self/status");
  std::string line;
  const std::string k = std::string(key) + ":";
  while (std::getline(f, line))
    if (line.rfind(k, 0) == 0) return std::atoll(line.c_str() + k.size()) * 1024;
  return -1;
}

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string list(const std::vector<double> &v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    char b[32];
    std::snprintf(b, sizeof b, "%s%.4f", i ? ", " : "", v[i]);
    s += b;
  }
  return s + "]";
}

} // namespace

int main(int argc, char **argv) {
  using namespace offgraph;
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s MMPROJ IMAGE [REPS=3] [THREADS=2] [DUMP]\n", argv[0]);
    return 2;
  }
  const int reps = argc > 3 ? std::atoi(argv[3]) : 3;
  const int threads = argc > 4 ? std::atoi(argv[4]) : 2;
  const auto t_load = std::chrono::steady_clock::now();
  auto vision = model::VisionModel::load(argv[1]);
  if (!vision.ok()) {
    std::fprintf(stderr, "%s: %s\n", argv[1], vision.message().c_str());
    return 1;
  }
  const double load_s = since(t_load);
  const int64_t rss_loaded = status_bytes("VmRSS");
  std::ifstream in(argv[2], std::ios::binary);
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                                   std::istreambuf_iterator<char>());
  if (bytes.empty()) {
    std::fprintf(stderr, "cannot read %s\n", argv[2]);
    return 1;
  }
  const model::VisionConfig &c = (*vision)->config();
  const engine::ImageOptions options; // the decode limits ImageEncoder applies
  std::vector<double> digest_s, decode_s, preprocess_s, encode_s, total_s;
  int32_t width = 0, height = 0, grid_w = 0, grid_h = 0, rows = 0, row_width = 0;
  double checksum = 0;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    const engine::ImageDigest digest = engine::image_digest(bytes);
    (void)digest;
    digest_s.push_back(since(t0));
    auto t = std::chrono::steady_clock::now();
    auto decoded = image::decode_image(bytes, options.decode);
    if (!decoded.ok()) {
      std::fprintf(stderr, "%s: %s\n", argv[2], decoded.message().c_str());
      return 1;
    }
    decode_s.push_back(since(t));
    t = std::chrono::steady_clock::now();
    width = decoded->width, height = decoded->height;
    const image::GridSize g =
        image::choose_grid(decoded->width, decoded->height, c.patch * c.merge, c.max_tokens);
    grid_w = g.width, grid_h = g.height;
    const image::Image resized = image::resize_lanczos(*decoded, g.width, g.height);
    decoded->rgb = {};
    const std::vector<float> planar = image::normalize_planar(resized, c.mean, c.std_dev);
    preprocess_s.push_back(since(t));
    t = std::chrono::steady_clock::now();
    auto out = model::encode_image(**vision, planar, g.width, g.height, threads);
    if (!out.ok()) {
      std::fprintf(stderr, "encode: %s\n", out.message().c_str());
      return 1;
    }
    encode_s.push_back(since(t));
    total_s.push_back(since(t0));
    rows = out->n_rows, row_width = out->width;
    checksum = 0;
    for (float v : out->rows) checksum += std::fabs(double(v));
    if (argc > 5 && r == reps - 1) {
      std::ofstream dump(argv[5], std::ios::binary);
      const int32_t head[2] = {out->n_rows, out->width};
      dump.write(reinterpret_cast<const char *>(head), sizeof head);
      dump.write(reinterpret_cast<const char *>(out->rows.data()),
                 std::streamsize(out->rows.size() * sizeof(float)));
      if (!dump) {
        std::fprintf(stderr, "cannot write %s\n", argv[5]);
        return 1;
      }
    }
    std::fprintf(stderr, "rep %d: encode %.3f s (%d rows)\n", r + 1, encode_s.back(), rows);
  }
  std::printf("{\"image\": \"%s\", \"width\": %d, \"height\": %d, \"grid_width\": %d, "
              "\"grid_height\": %d, \"rows\": %d, \"row_width\": %d, \"patches\": %d, "
              "\"threads\": %d, \"load_s\": %.4f, \"digest_s\": %s, \"decode_s\": %s, "
              "\"preprocess_s\": %s, \"encode_s\": %s, \"total_s\": %s, \"abs_sum\": %.6g, "
              "\"rss_loaded\": %lld, \"vm_hwm\": %lld}\n",
              argv[2], width, height, grid_w, grid_h, rows, row_width,
              (grid_w / c.patch) * (grid_h / c.patch), threads, load_s, list(digest_s).c_str(),
              list(decode_s).c_str(), list(preprocess_s).c_str(), list(encode_s).c_str(),
              list(total_s).c_str(), checksum, (long long)rss_loaded,
              (long long)status_bytes("VmHWM"));
  return 0;
}
