// A vision encoder's preprocessing, as llama.cpp's mtmd does it for Muse Glimmer (its
// mtmd-image.cpp, after transformers' get_aspect_ratio_preserving_size): the image is resized
// (stretched, no padding) to a grid of cells of `cell` pixels (patch x merge: 28) that keeps its
// aspect ratio as closely as floor/ceil per side allows, under `max_tokens` cells; resampled with
// Pillow's Lanczos filter exactly (fixed point, u8 between the horizontal and vertical passes);
// then scaled to [0, 1] and normalised per channel into planar floats.
#pragma once

#include "base/status.h"
#include "image/image.h"

#include <array>
#include <cstdint>
#include <vector>

namespace offgraph::image {

struct GridSize {
  int32_t width = 0, height = 0; // pixels, multiples of the cell
};

// The resized size of a w x h image: both sides multiples of `cell`, at most `max_tokens` cells
// (never grown past the image's own cell count but to 1 x 1), the floor/ceil combination whose
// aspect ratio is closest to the image's (ties: more cells). Where no combination fits (a long
// thin image under a small cap) the reference rounds and may pass its cap; here the longer side
// is then cut to fit.
GridSize choose_grid(int32_t width, int32_t height, int32_t cell, int32_t max_tokens);

// Pillow's Image.resize(size, Image.LANCZOS), byte for byte (libImaging/Resample.c: support 3,
// 22-bit fixed-point weights, horizontal pass then vertical, each rounded to u8; a pass whose
// side does not change is skipped, and an image already at the size is copied).
Image resize_lanczos(const Image &in, int32_t width, int32_t height);

// x / 255 then (x - mean[c]) / std[c], in float, planar: out[c * h * w + y * w + x], R, G, B.
std::vector<float> normalize_planar(const Image &in, const std::array<float, 3> &mean,
                                    const std::array<float, 3> &std_dev);

} // namespace offgraph::image
