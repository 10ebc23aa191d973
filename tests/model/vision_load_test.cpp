// The Muse Glimmer mmproj loader on synthetic files (tools/synth/mmproj.h) and on variants that
// each break one rule: every tensor used or refused by name, missing tensors named, keys
// honoured, neutral or refused by name, shapes checked, the output width checked against the
// text model's, another projector or a text model refused.
#include "model/vision.h"
#include "model/vision_encoder.h"
#include "model_test_util.h"
#include "synth/mmproj.h"

#include "ggml-cpp.h"
#include "gguf.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>

namespace offgraph::model {
namespace {

using testing::temp_dir;

std::string good_file() {
  static const std::string path = [] {
    const std::string p = (temp_dir() / "mmproj.gguf").string();
    synth::MmprojSpec s;
    s.seed = 5;
    auto r = synth::write_mmproj(s, p);
    EXPECT_TRUE(r.ok()) << r.message();
    return p;
  }();
  return path;
}

// A copy of the good file with its keys edited and tensors dropped, renamed or added.
struct Edit {
  std::function<void(gguf_context *)> keys = {};
  std::string drop = {};                            // a tensor left out
  std::string add = {};                             // an extra f32 vector of 8
  std::function<void(ggml_tensor *)> retensor = {}; // changes a tensor's name or shape in the copy
};

std::string variant(const std::string &name, const Edit &e) {
  ggml_context *data = nullptr;
  gguf_init_params params = {false, &data};
  gguf_context_ptr in(gguf_init_from_file(good_file().c_str(), params));
  ggml_context_ptr data_owner(data);
  gguf_context_ptr out(gguf_init_empty());
  gguf_set_kv(out.get(), in.get());
  if (e.keys) e.keys(out.get());
  ggml_init_params p2 = {ggml_tensor_overhead() * 8 + 64, nullptr, false};
  ggml_context_ptr extra(ggml_init(p2));
  for (int64_t i = 0; i < gguf_get_n_tensors(in.get()); ++i) {
    const std::string n = gguf_get_tensor_name(in.get(), i);
    if (n == e.drop) continue;
    ggml_tensor *t = ggml_get_tensor(data, n.c_str());
    if (e.retensor) e.retensor(t);
    gguf_add_tensor(out.get(), t);
  }
  if (!e.add.empty()) {
    ggml_tensor *t = ggml_new_tensor_1d(extra.get(), GGML_TYPE_F32, 8);
    for (int i = 0; i < 8; ++i) static_cast<float *>(t->data)[i] = 0.5f;
    ggml_set_name(t, e.add.c_str());
    gguf_add_tensor(out.get(), t);
  }
  const std::string path = (temp_dir() / (name + ".gguf")).string();
  EXPECT_TRUE(gguf_write_to_file(out.get(), path.c_str(), false));
  return path;
}

void expect_refused(const std::string &path, const std::string &needle, int32_t n_embd_text = 0) {
  auto m = VisionModel::load(path, n_embd_text);
  ASSERT_FALSE(m.ok()) << path << " loaded";
  EXPECT_NE(m.message().find(needle), std::string::npos) << m.message();
}

TEST(VisionLoad, ASyntheticMmprojLoadsWithItsConfiguration) {
  auto m = VisionModel::load(good_file(), 64);
  ASSERT_TRUE(m.ok()) << m.message();
  const VisionConfig &c = (*m)->config();
  EXPECT_EQ(c.n_layer, 4);
  EXPECT_EQ(c.n_embd, 64);
  EXPECT_EQ(c.n_head, 4);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.n_ff, 96);
  EXPECT_EQ(c.patch, 14);
  EXPECT_EQ(c.merge, 2);
  EXPECT_EQ(c.pos_side, 32);
  EXPECT_EQ(c.adapter, 128);
  EXPECT_EQ(c.n_embd_out, 64);
  EXPECT_FLOAT_EQ(c.eps, 1e-5f);
  EXPECT_FLOAT_EQ(c.mean[1], 0.5f);
  EXPECT_FLOAT_EQ(c.std_dev[2], 0.5f);
  // Global layers: every fourth and the last (of 4: layer 3 only).
  EXPECT_FALSE(c.is_global(0));
  EXPECT_FALSE(c.is_global(2));
  EXPECT_TRUE(c.is_global(3));
  const VisionWeights &w = (*m)->weights();
  ASSERT_EQ(w.blocks.size(), 4u);
  EXPECT_NE(w.blocks[3].down.b, nullptr);
  EXPECT_EQ(w.patch_bias, nullptr);
  ASSERT_NE(w.pos_embd, nullptr);
  // The weights are mapped: the position table holds the file's values, not zeros.
  EXPECT_NE(static_cast<const float *>(w.pos_embd->data)[7], 0.0f);
  // The real encoder's layer pattern (50 layers): 3, 7, ..., 47 and 49 are global.
  VisionConfig real = c;
  real.n_layer = 50;
  int globals = 0;
  for (int i = 0; i < 50; ++i) globals += real.is_global(i);
  EXPECT_EQ(globals, 13);
  EXPECT_TRUE(real.is_global(49));
  EXPECT_FALSE(real.is_global(48));
}

TEST(VisionLoad, EachBrokenRuleIsRefusedByName) {
  expect_refused(good_file(), "output width is 64 but the text model's is 96", 96);
  expect_refused(variant("extra", {.add = "v.blk.0.attn_q_norm.weight"}),
                 "'v.blk.0.attn_q_norm.weight'");
  expect_refused(variant("adapter_bias", {.add = "mm.0.bias"}), "'mm.0.bias'");
  expect_refused(variant("missing", {.drop = "v.blk.1.ffn_up.bias"}),
                 "tensor 'v.blk.1.ffn_up.bias' is missing");
  expect_refused(
      variant(
          "projector",
          {.keys = [](gguf_context *g) { gguf_set_val_str(g, "clip.projector_type", "qwen2vl"); }}),
      "'qwen2vl' is not supported");
  expect_refused(
      variant(
          "unknown_key",
          {.keys = [](gguf_context *g) { gguf_set_val_u32(g, "clip.vision.window_size", 112); }}),
      "clip.vision.window_size");
  expect_refused(variant("mean2", {.keys =
                                       [](gguf_context *g) {
                                         const float two[2] = {0.5f, 0.5f};
                                         gguf_set_arr_data(g, "clip.vision.image_mean",
                                                           GGUF_TYPE_FLOAT32, two, 2);
                                       }}),
                 "must be 3 floats");
  expect_refused(
      variant("silu",
              {.keys = [](gguf_context *g) { gguf_set_val_bool(g, "clip.use_silu", true); }}),
      "use_silu");
  expect_refused(
      variant(
          "audio",
          {.keys = [](gguf_context *g) { gguf_set_val_bool(g, "clip.has_audio_encoder", true); }}),
      "audio encoders are not supported");
  expect_refused(
      variant(
          "projection_dim",
          {.keys = [](gguf_context *g) { gguf_set_val_u32(g, "clip.vision.projection_dim", 65); }}),
      "'mm.2.weight' has shape [128, 64], expected [128, 65]");
  expect_refused(
      variant("no_std",
              {.keys = [](gguf_context *g) { gguf_remove_key(g, "clip.vision.image_std"); }}),
      "clip.vision.image_std");
  expect_refused(variant("pos_table", {.retensor =
                                           [](ggml_tensor *t) {
                                             if (std::string(t->name) == "v.position_embd.weight")
                                               t->ne[1] = 1000;
                                           }}),
                 "not a square table");
  expect_refused(
      variant(
          "image_size",
          {.keys = [](gguf_context *g) { gguf_set_val_u32(g, "clip.vision.image_size", 448); }}),
      "clip.vision.image_size = 448");
  expect_refused(
      variant("no_gelu",
              {.keys = [](gguf_context *g) { gguf_set_val_bool(g, "clip.use_gelu", false); }}),
      "clip.use_gelu");
  // A text model where the encoder belongs.
  expect_refused(variant("arch", {.keys =
                                      [](gguf_context *g) {
                                        gguf_set_val_str(g, "general.architecture", "muse-glimmer");
                                      }}),
                 "expected 'clip'");
}

// The encoder refuses what its graph must not be built for: over the token cap (the global
// layers attend over every patch), sizes off the 28-px grid, planar data of the wrong size.
TEST(VisionLoad, TheEncoderRefusesImagesOffTheGridOrOverTheCap) {
  auto m = VisionModel::load(good_file(), 64);
  ASSERT_TRUE(m.ok()) << m.message();
  const int32_t side = 28 * 65; // 65 x 65 = 4,225 tokens > 4,096
  auto over = encode_image(**m, std::vector<float>(size_t(side) * side * 3, 0.1f), side, side, 2);
  ASSERT_FALSE(over.ok());
  EXPECT_NE(over.message().find("over the cap of 4096"), std::string::npos) << over.message();
  auto off = encode_image(**m, std::vector<float>(size_t(30) * 28 * 3, 0.1f), 30, 28, 2);
  ASSERT_FALSE(off.ok());
  EXPECT_NE(off.message().find("multiples of 28"), std::string::npos) << off.message();
  auto short_data = encode_image(**m, std::vector<float>(10, 0.1f), 28, 28, 2);
  ASSERT_FALSE(short_data.ok());
  EXPECT_NE(short_data.message().find("10 values"), std::string::npos) << short_data.message();
  // And one that fits encodes to one row per merged token, finite.
  std::vector<float> px(size_t(56) * 84 * 3);
  for (size_t i = 0; i < px.size(); ++i) px[i] = float(std::sin(0.01 * double(i)));
  auto ok = encode_image(**m, px, 84, 56, 2);
  ASSERT_TRUE(ok.ok()) << ok.message();
  EXPECT_EQ(ok->n_rows, 6);
  EXPECT_EQ(ok->width, 64);
  for (float v : ok->rows) ASSERT_TRUE(std::isfinite(v));
}

} // namespace
} // namespace offgraph::model
