// Muse Glimmer mmproj generator: a vision-encoder GGUF with the keys, tensor names, shapes and
// types llama.cpp's mtmd reads for projector type muse-glimmer (tools/mtmd/clip.cpp and
// conversion/muse_glimmer.py in the pinned tree), seeded random weights at scales that keep
// activations near unit size. The real encoder is 50 layers of width 1536 (16 heads of 96), MLP
// 8960, a 32x32 position table, patch 14, merge 2, an adapter 6144 -> 4096 -> 4096 and a
// projection to the text model's width (6656).
#pragma once

#include "base/status.h"

#include "ggml.h"

#include <array>
#include <cstdint>
#include <string>

namespace offgraph::synth {

struct MmprojSpec {
  int32_t n_layer = 4, n_embd = 64, n_head = 4, n_ff = 96;
  int32_t patch = 14, merge = 2;
  int32_t pos_side = 32;    // the learned position table is pos_side x pos_side
  int32_t adapter = 128;    // the adapter's width (4096 in the real file)
  int32_t n_embd_text = 64; // the projection's output: the text model's width
  float eps = 1e-5f;
  std::array<float, 3> mean = {0.5f, 0.5f, 0.5f}, std_dev = {0.5f, 0.5f, 0.5f};
  ggml_type weight_type = GGML_TYPE_F32; // matrices; the patch kernel is f32 or f16 (as the
                                         // converter writes it), vectors and the table f32
  uint64_t seed = 1;
};

// Writes the file; returns a summary.
Result<std::string> write_mmproj(const MmprojSpec &spec, const std::string &path);

} // namespace offgraph::synth
