#include "image_flags.h"

#include <fstream>
#include <iterator>

namespace offgraph::cli {

void add_image_flags(CLI::App &cmd, ImageFlags &f, bool serving) {
  cmd.add_option("--mmproj", f.mmproj,
                 "the vision projector GGUF (clip.projector_type muse-glimmer): images in");
  cmd.add_option("--max-image-bytes", f.max_image_bytes, "largest image file accepted (bytes)")
      ->capture_default_str();
  cmd.add_option("--image-cache", f.image_cache_mib,
                 "MiB of encoded images kept for images sent again (0: none)")
      ->capture_default_str();
  if (!serving) return; // a command's own images are not queued: no budget to set
  cmd.add_option("--image-mib", f.image_rows_mib,
                 "MiB of encoded image rows alive at once (cached, in queued and active requests, "
                 "being encoded): a request's images wait for room, cached ones giving way first; "
                 "images that never fit are refused (0: no limit)")
      ->capture_default_str();
}

Result<ImageInput> load_image_input(const ImageFlags &f, const model::Model &text_model,
                                    const text::Tokenizer &tokenizer, int threads) {
  ImageInput in;
  if (f.mmproj.empty()) return in;
  if (f.max_image_bytes < 1) return Status::error("--max-image-bytes must be at least 1");
  if (f.image_cache_mib < 0) return Status::error("--image-cache must not be negative");
  if (f.image_rows_mib < 0) return Status::error("--image-mib must not be negative");
  if (text_model.config().arch_name != model::VisionModel::kTextArchitecture)
    return Status::error("--mmproj: the vision encoder offgraph reads feeds a " +
                         std::string(model::VisionModel::kTextArchitecture) +
                         " text model; this model is " + text_model.config().arch_name +
                         ", which takes no image rows");
  auto vision = model::VisionModel::load(f.mmproj, text_model.config().n_embd);
  if (!vision.ok()) return Status::error("--mmproj: " + vision.message());
  in.vision = std::move(vision).value();
  const std::pair<const char *, int32_t *> tokens[] = {{"<|patch|>", &in.markers.marker},
                                                       {"<|image_start|>", &in.markers.begin},
                                                       {"<|image_end|>", &in.markers.end}};
  for (const auto &[piece, id] : tokens) {
    const auto found = tokenizer.find_token(piece);
    if (!found)
      return Status::error(std::string("--mmproj: the model's vocabulary has no ") + piece +
                           " token, which image prompts are written with");
    *id = *found;
  }
  engine::ImageOptions o;
  o.max_bytes = f.max_image_bytes;
  o.cache_bytes = f.image_cache_mib << 20;
  o.rows_budget = f.image_rows_mib << 20;
  o.threads = threads;
  in.encoder = std::make_unique<engine::ImageEncoder>(*in.vision, o);
  return in;
}

Result<std::vector<engine::PreparedImage>>
encode_image_files(engine::ImageEncoder &encoder, const std::vector<std::string> &files) {
  std::vector<engine::PreparedImage> out;
  for (const std::string &path : files) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return Status::error("cannot read the image " + path);
    const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                                     std::istreambuf_iterator<char>());
    auto p = encoder.encode(bytes);
    if (!p.ok()) return Status::error(path + ": " + p.message());
    out.push_back(std::move(p).value());
  }
  return out;
}

std::vector<int32_t> tokenize_with_media(const text::Tokenizer &tokenizer, std::string_view text,
                                         int32_t marker_id, size_t n_images, bool bos) {
  std::vector<int32_t> out;
  if (bos && tokenizer.bos() >= 0) out.push_back(tokenizer.bos());
  if (n_images > 0 && text.find(kMediaMarker) == std::string_view::npos)
    out.insert(out.end(), n_images, marker_id);
  for (size_t at = 0;;) {
    const size_t m = text.find(kMediaMarker, at);
    const std::string_view piece = text.substr(at, m == std::string_view::npos ? m : m - at);
    const auto ids = tokenizer.encode(piece, false, false);
    out.insert(out.end(), ids.begin(), ids.end());
    if (m == std::string_view::npos) break;
    out.push_back(marker_id);
    at = m + kMediaMarker.size();
  }
  return out;
}

} // namespace offgraph::cli
