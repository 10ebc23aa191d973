// Muse Glimmer's vision encoder as a ggml graph of its own (MUSE_GLIMMER.md §13; llama.cpp's
// tools/mtmd/models/muse-glimmer.cpp is the reference): patch embedding (a 14-px convolution),
// the learned position table resized bilinearly to the grid, patches regrouped into windows of
// pos_side x pos_side patches, pre-LayerNorm blocks with a 2-D RoPE (width positions on the
// first half of each head, height on the second, 1-based), attention within each window except
// on the global layers, post-LayerNorm, back to raster order, a 2x2 pixel shuffle and the
// three-matrix projector with exact GELU. One row per merged token, before the text model's
// input norm (which the text model applies to image rows as to token rows).
//
// Windows are attended as batches of equal-sized windows (consecutive in window order), never
// through a dense n_patch x n_patch mask (1 GiB at the token cap).
#pragma once

#include "base/status.h"
#include "model/vision.h"

#include <functional>
#include <vector>

namespace offgraph::model {

struct EncodedImage {
  int32_t n_rows = 0, width = 0; // rows of the text model's width
  std::vector<float> rows;       // n_rows x width, row after row (merged tokens in raster order)
};

// `planar`: the preprocessed image (image::normalize_planar), 3 x height x width floats, width
// and height multiples of patch x merge. `cancelled`, where given, is asked between the graph's
// nodes (from one thread): true ends the encode early with a kUnavailable error. A graph whose
// buffers cannot be allocated is a kUnavailable error naming it; `allocation_fault` (tests)
// returning true fails that allocation.
Result<EncodedImage> encode_image(const VisionModel &model, const std::vector<float> &planar,
                                  int32_t width, int32_t height, int n_threads,
                                  const std::function<bool()> &cancelled = {},
                                  const std::function<bool()> &allocation_fault = {});

} // namespace offgraph::model
