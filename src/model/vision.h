// VisionModel: a Muse Glimmer mmproj GGUF (clip.projector_type = muse-glimmer), loaded with the
// same rules as model files: every key honoured, neutral or refused by name (ConfigReader's
// audit); every tensor used or the file refused (TensorBinder::finish); shapes and types checked
// against the configuration; the output width checked against the text model's. Keys and
// tensors are those llama.cpp's mtmd reads (tools/mtmd/clip.cpp in the pinned tree) and
// conversion/muse_glimmer.py writes; docs/vision.md lists them.
#pragma once

#include "base/status.h"
#include "model/gguf_file.h"
#include "model/weights.h"

#include <array>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace offgraph::model {

struct VisionConfig {
  int32_t n_layer = 0, n_embd = 0, n_head = 0, head_dim = 0, n_ff = 0;
  int32_t patch = 0, merge = 2;
  int32_t pos_side = 0;   // the learned position table is pos_side x pos_side patches; also the
                          // window side (windows of pos_side x pos_side patches)
  int32_t adapter = 0;    // mm.0's and mm.1's output width
  int32_t image_size = 0; // the nominal size the converter writes: pos_side x patch x merge
  int32_t n_embd_out = 0; // mm.2's output: the text model's width
  float eps = 0;          // every LayerNorm
  std::array<float, 3> mean{}, std_dev{};
  float rope_theta = 10000.0f; // fixed for this projector (clip.cpp sets it, no key)
  int32_t global_every = 4;    // layers i with (i + 1) % 4 == 0, and the last, attend globally
  int32_t max_tokens = 4096;   // merged tokens per image (mtmd's default cap)

  bool is_global(int32_t layer) const {
    return layer == n_layer - 1 || (layer + 1) % global_every == 0;
  }
};

struct VisionBlock {
  ggml_tensor *ln1_w = nullptr, *ln1_b = nullptr, *ln2_w = nullptr, *ln2_b = nullptr;
  Linear q, k, v, o, up, down; // each with its bias
};

struct VisionWeights {
  ggml_tensor *patch_embd = nullptr; // [patch, patch, 3, D]
  ggml_tensor *patch_bias = nullptr; // [D], optional
  ggml_tensor *pos_embd = nullptr;   // [D, pos_side * pos_side], f32
  ggml_tensor *pre_ln_w = nullptr, *pre_ln_b = nullptr, *post_ln_w = nullptr, *post_ln_b = nullptr;
  std::vector<VisionBlock> blocks;
  ggml_tensor *mm0 = nullptr, *mm1 = nullptr, *mm2 = nullptr; // [4D, A], [A, A], [A, E_text]
};

class VisionModel {
public:
  // The text architecture whose rows the encoder's projection writes (the only projector type
  // read, clip.projector_type = muse-glimmer).
  static constexpr std::string_view kTextArchitecture = "muse-glimmer";
  // Opens, validates and maps the file. `n_embd_text` (when not 0): the text model's width,
  // which the projection's output must equal.
  static Result<std::unique_ptr<VisionModel>> load(const std::string &path,
                                                   int32_t n_embd_text = 0);

  const VisionConfig &config() const { return config_; }
  const VisionWeights &weights() const { return weights_; }
  const GgufFile &file() const { return *file_; }

private:
  VisionModel() = default;
  std::unique_ptr<GgufFile> file_;
  VisionConfig config_;
  VisionWeights weights_;
};

} // namespace offgraph::model
