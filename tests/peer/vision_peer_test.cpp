// The synthetic Muse Glimmer mmproj (offgraph synth-mmproj) against llama.cpp's mtmd from the
// pinned tree: llama-mtmd-cli loads it beside a synthetic text model and encodes images, and the
// embeddings it dumps (MTMD_DEBUG_EMBEDDINGS) have the row count offgraph's grid gives for each
// image size (non-square, above the 32-patch window, under a lowered token cap) and the text
// model's width; so the writer's keys and tensors are the reference's, and so is the grid.
#include "image/decode.h"
#include "image/preprocess.h"
#include "model/vision.h"
#include "model/vision_encoder.h"
#include "synth/mmproj.h"
#include "synth/synth.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <unistd.h>

namespace offgraph {
namespace {

namespace fs = std::filesystem;

fs::path work_dir() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("offgraph-vision-peer-" + std::to_string(getpid()));
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

struct Files {
  std::string text, mmproj;
  Files() {
    text = (work_dir() / "text.gguf").string();
    mmproj = (work_dir() / "mmproj.gguf").string();
    auto spec = synth::preset("tiny", "muse-glimmer");
    EXPECT_TRUE(spec.ok());
    spec->vocab_path = std::string(OFFGRAPH_LLAMA_TREE) + "/models/ggml-vocab-llama-bpe.gguf";
    spec->template_path = std::string(OFFGRAPH_LLAMA_TREE) + "/models/templates/muse-glimmer.jinja";
    auto t = synth::write_model(*spec, text);
    EXPECT_TRUE(t.ok()) << t.message();
    synth::MmprojSpec m;
    m.n_embd_text = spec->n_embd;
    m.seed = 9;
    auto v = synth::write_mmproj(m, mmproj);
    EXPECT_TRUE(v.ok()) << v.message();
  }
  ~Files() { fs::remove_all(work_dir()); }
};

Files &files() {
  static Files f;
  return f;
}

// A PNG of w x h through Pillow (python3-pil), a gradient.
std::string png(int w, int h) {
  const std::string path =
      (work_dir() / ("img" + std::to_string(w) + "x" + std::to_string(h) + ".png")).string();
  const std::string cmd =
      "/usr/bin/python3 -c \"from PIL import Image; im = Image.new('RGB', (" + std::to_string(w) +
      ", " + std::to_string(h) +
      ")); im.putdata([((x * 7) % 256, (y * 11) % 256, (x * y) % 256) for y in range(" +
      std::to_string(h) + ") for x in range(" + std::to_string(w) + ")]); im.save('" + path +
      "')\"";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return path;
}

// llama-mtmd-cli's encoding of one image: rows and width of the dumped embeddings, and (with
// `values`) the embeddings.
bool reference_rows(const std::string &image, int max_tokens, int &rows, int &width,
                    std::vector<float> *values = nullptr) {
  const std::string dump = (work_dir() / "emb.bin").string();
  fs::remove(dump);
  const std::string cmd =
      "MTMD_DEBUG_EMBEDDINGS=" + dump + " " + OFFGRAPH_PEER_DIR + "/bin/llama-mtmd-cli -m " +
      files().text + " --mmproj " + files().mmproj + " --image " + image +
      " -p Describe. -n 1 --temp 0 -fa off -t 2 --jinja --image-max-tokens " +
      std::to_string(max_tokens) + " > " + (work_dir() / "cli.log").string() + " 2>&1";
  if (std::system(cmd.c_str()) != 0) {
    ADD_FAILURE() << "llama-mtmd-cli failed: " << cmd;
    return false;
  }
  std::ifstream f(dump, std::ios::binary);
  int32_t head[2] = {0, 0};
  f.read(reinterpret_cast<char *>(head), sizeof(head));
  rows = head[0], width = head[1];
  if (values) {
    values->resize(size_t(rows) * size_t(width));
    f.read(reinterpret_cast<char *>(values->data()), std::streamsize(values->size() * 4));
  }
  return bool(f);
}

TEST(VisionPeer, TheReferenceLoadsTheSyntheticMmprojAndEncodesOurGridsRows) {
  auto m = model::VisionModel::load(files().mmproj, 64);
  ASSERT_TRUE(m.ok()) << m.message();
  struct Case {
    int w, h, cap;
  };
  for (const Case &c :
       {Case{100, 70, 4096}, Case{640, 480, 4096}, Case{300, 901, 4096}, Case{1000, 250, 64}}) {
    SCOPED_TRACE(std::to_string(c.w) + "x" + std::to_string(c.h));
    int rows = 0, width = 0;
    ASSERT_TRUE(reference_rows(png(c.w, c.h), c.cap, rows, width));
    const image::GridSize g = image::choose_grid(c.w, c.h, 28, c.cap);
    EXPECT_EQ(rows, (g.width / 28) * (g.height / 28));
    EXPECT_EQ(width, (*m)->config().n_embd_out);
    std::printf("[ vision   ] %dx%d (cap %d): the reference encoded %d rows of %d; offgraph's "
                "grid %dx%d\n",
                c.w, c.h, c.cap, rows, width, g.width, g.height);
  }
}

// The encoder's rows against the reference's (llama-mtmd-cli -fa off: f32 attention; both
// round the pixels to f16 in the patch convolution), on images decoded and preprocessed by
// offgraph: non-square, one window, several windows with partial ones at the right and bottom
// edges, the position table resized up and down (grids above and below 32 patches a side).
TEST(VisionPeer, EncoderRowsMatchTheReference) {
  auto m = model::VisionModel::load(files().mmproj, 64);
  ASSERT_TRUE(m.ok()) << m.message();
  struct Case {
    int w, h;
  };
  for (const Case &c :
       {Case{100, 70}, Case{448, 448}, Case{640, 480}, Case{300, 901}, Case{900, 470}}) {
    SCOPED_TRACE(std::to_string(c.w) + "x" + std::to_string(c.h));
    const std::string path = png(c.w, c.h);
    int rows = 0, width = 0;
    std::vector<float> ref;
    ASSERT_TRUE(reference_rows(path, 4096, rows, width, &ref));
    std::ifstream f(path, std::ios::binary);
    const std::vector<uint8_t> bytes{std::istreambuf_iterator<char>(f),
                                     std::istreambuf_iterator<char>()};
    auto img = image::decode_image(bytes);
    ASSERT_TRUE(img.ok()) << img.message();
    const model::VisionConfig &vc = (*m)->config();
    const image::GridSize g = image::choose_grid(img->width, img->height, 28, 4096);
    const image::Image resized = image::resize_lanczos(*img, g.width, g.height);
    auto enc = model::encode_image(**m, image::normalize_planar(resized, vc.mean, vc.std_dev),
                                   g.width, g.height, 2);
    ASSERT_TRUE(enc.ok()) << enc.message();
    ASSERT_EQ(enc->n_rows, rows);
    ASSERT_EQ(enc->width, width);
    double worst = 0, num = 0, den = 0;
    for (int r = 0; r < rows; ++r) {
      double rn = 0, rd = 0;
      for (int i = 0; i < width; ++i) {
        const double a = enc->rows[size_t(r) * size_t(width) + size_t(i)];
        const double b = ref[size_t(r) * size_t(width) + size_t(i)];
        rn += (a - b) * (a - b), rd += b * b;
      }
      worst = std::max(worst, std::sqrt(rn / rd));
      num += rn, den += rd;
    }
    std::printf("[ vision   ] %dx%d -> %d rows: worst row relative error %.3g, overall %.3g "
                "(bound 1e-4)\n",
                c.w, c.h, rows, worst, std::sqrt(num / den));
    EXPECT_LE(worst, 1e-4);
  }
}

} // namespace
} // namespace offgraph
