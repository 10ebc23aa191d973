// Images in: --mmproj and its limits on every command that takes images (serve, run, chat,
// logits), the vision model and encoder they load, and text prompts with mtmd's media marker.
#pragma once

#include "engine/images.h"
#include "model/model.h"
#include "text/tokenizer/tokenizer.h"

#include <CLI/CLI.hpp>

#include <memory>
#include <string>
#include <vector>

namespace offgraph::cli {

// Where a raw text prompt (run without --chat, logits) places an image: llama.cpp's marker.
inline constexpr std::string_view kMediaMarker = "<__media__>";

struct ImageFlags {
  std::string mmproj;
  int64_t max_image_bytes = int64_t(20) << 20;
  int64_t image_cache_mib = 256;
  int64_t image_rows_mib = 1024; // engine::ImageOptions::rows_budget
};

// `serving`: also the flags of a server's image queue (--image-mib).
void add_image_flags(CLI::App &cmd, ImageFlags &flags, bool serving = false);

// The vision side of a text model: null members without --mmproj.
struct ImageInput {
  std::unique_ptr<model::VisionModel> vision;
  std::unique_ptr<engine::ImageEncoder> encoder;
  engine::ImageMarkers markers;
};
// Loads --mmproj for `text_model` (widths checked) and finds its marker tokens in `tokenizer`;
// errors name the flag or the missing token.
Result<ImageInput> load_image_input(const ImageFlags &flags, const model::Model &text_model,
                                    const text::Tokenizer &tokenizer, int threads);

// Encodes each file (errors name it).
Result<std::vector<engine::PreparedImage>>
encode_image_files(engine::ImageEncoder &encoder, const std::vector<std::string> &files);

// A raw prompt: its text between media markers tokenized piece by piece (special tokens as plain
// text, BOS first when `bos`), each marker as `marker_id` (place_images expands them). Without a
// marker and with `n_images` > 0, the images go first (as llama-mtmd-cli puts them).
std::vector<int32_t> tokenize_with_media(const text::Tokenizer &tokenizer, std::string_view text,
                                         int32_t marker_id, size_t n_images, bool bos);

} // namespace offgraph::cli
