#include "model/vision.h"

#include "model/config.h"
#include "model/weights.h"

#include <cmath>

namespace offgraph::model {
namespace {

Status read_config(const GgufFile &f, ConfigReader &keys, VisionConfig &c) {
  const std::string &path = f.path();
  // What the file is: an mmproj with a vision encoder of projector type muse-glimmer.
  auto type = keys.str("projector_type");
  if (!type.ok()) return type.status();
  std::optional<std::string> projector = *type;
  if (!projector) {
    auto v = keys.str("vision.projector_type");
    if (!v.ok()) return v.status();
    projector = *v;
  } else {
    keys.mark_read("vision.projector_type");
  }
  if (!projector)
    return Status::error(path + ": key 'clip.projector_type' is missing (is this an mmproj "
                                "file? offgraph reads Muse Glimmer's: clip.projector_type = "
                                "muse-glimmer)");
  if (*projector != "muse-glimmer")
    return Status::error(path + ": clip.projector_type = '" + *projector +
                         "' is not supported (offgraph reads Muse Glimmer's encoder: "
                         "'muse-glimmer')");
  for (const char *flag :
       {"clip.has_vision_encoder", "clip.has_audio_encoder", "clip.has_gen_audio_encoder"}) {
    auto v = f.optional_bool(flag);
    if (!v.ok()) return v.status();
    const bool want = std::string(flag) == "clip.has_vision_encoder";
    if (v->value_or(false) != want)
      return Status::error(
          path + ": " + flag + " = " + (v->value_or(false) ? "true" : "false") +
          (want ? "; the file has no vision encoder" : "; audio encoders are not supported"));
    keys.mark_read(std::string(flag).substr(5));
  }
  OFFGRAPH_TRY(keys.u32("vision.embedding_length", c.n_embd, 1, 1 << 16, true));
  OFFGRAPH_TRY(keys.u32("vision.attention.head_count", c.n_head, 1, 1024, true));
  OFFGRAPH_TRY(keys.u32("vision.feed_forward_length", c.n_ff, 1, 1 << 20, true));
  OFFGRAPH_TRY(keys.u32("vision.block_count", c.n_layer, 1, 1024, true));
  OFFGRAPH_TRY(keys.u32("vision.patch_size", c.patch, 1, 1024, true));
  OFFGRAPH_TRY(keys.u32("vision.spatial_merge_size", c.merge, 1, 64, false));
  OFFGRAPH_TRY(keys.f32("vision.attention.layer_norm_epsilon", c.eps, 1e-12f, 1.0f, true));
  if (c.n_embd % c.n_head != 0)
    return Status::error(path + ": clip.vision.embedding_length " + std::to_string(c.n_embd) +
                         " is not a multiple of attention.head_count " + std::to_string(c.n_head));
  c.head_dim = c.n_embd / c.n_head;
  int32_t head_dim = c.head_dim, kv_heads = c.n_head;
  OFFGRAPH_TRY(keys.u32("vision.attention.head_dim", head_dim, 1, 1 << 16, false));
  OFFGRAPH_TRY(keys.u32("vision.attention.head_count_kv", kv_heads, 1, 1024, false));
  if (head_dim != c.head_dim || kv_heads != c.n_head)
    return Status::error(path + ": head_dim " + std::to_string(head_dim) + " and head_count_kv " +
                         std::to_string(kv_heads) + " must be embedding_length / head_count (" +
                         std::to_string(c.head_dim) + ") and head_count (" +
                         std::to_string(c.n_head) + ") for this encoder");
  if (c.head_dim % 4 != 0)
    return Status::error(path + ": head dim " + std::to_string(c.head_dim) +
                         " is not a multiple of 4 (the 2-D RoPE rotates pairs in two halves)");
  // Without effect in mtmd for this projector, so checked instead: the nominal size (the position
  // table decides; checked once it is bound) and the projection width (mm.2's shape).
  int32_t projection = 0;
  OFFGRAPH_TRY(keys.u32("vision.image_size", c.image_size, 1, 1 << 20, true));
  OFFGRAPH_TRY(keys.u32("vision.projection_dim", projection, 1, 1 << 20, true));
  c.n_embd_out = projection;
  for (auto [key, out] :
       {std::pair{"vision.image_mean", &c.mean}, {"vision.image_std", &c.std_dev}}) {
    auto v = f.optional_f32_array(std::string("clip.") + key);
    if (!v.ok()) return v.status();
    if (!*v || (*v)->size() != 3)
      return Status::error(path + ": key 'clip." + key + "' must be 3 floats (R, G, B)" +
                           (*v ? ", got " + std::to_string((*v)->size()) : ", missing"));
    for (int i = 0; i < 3; ++i) (*out)[size_t(i)] = (**v)[size_t(i)];
    keys.mark_read(key);
  }
  for (float s : c.std_dev)
    if (!(s > 0) || !std::isfinite(s))
      return Status::error(path + ": clip.vision.image_std holds " + std::to_string(s) +
                           "; every channel's must be a positive number");
  // The feed-forward is exact GELU in this encoder whatever these say; SiLU would be another
  // model.
  auto silu = f.optional_bool("clip.use_silu");
  if (!silu.ok()) return silu.status();
  if (silu->value_or(false))
    return Status::error(path + ": clip.use_silu = true, but Muse Glimmer's encoder uses GELU");
  keys.mark_read("use_silu");
  keys.set_neutral("clip.use_gelu", {1.0}); // true agrees; false asks for another activation
  return ok_status();
}

Status bind_weights(const GgufFile &f, TensorBinder &b, VisionConfig &c, VisionWeights &w) {
  const int64_t D = c.n_embd;
  OFFGRAPH_TRY(b.bind(w.patch_embd, "v.patch_embd.weight", {c.patch, c.patch, 3, D}, Role::Matrix));
  OFFGRAPH_TRY(b.bind(w.patch_bias, "v.patch_embd.bias", {D}, Role::Vector, false));
  ggml_tensor *pos = f.tensor("v.position_embd.weight");
  if (!pos) return Status::error(f.path() + ": tensor 'v.position_embd.weight' is missing");
  c.pos_side = int32_t(std::lround(std::sqrt(double(pos->ne[1]))));
  if (pos->ne[1] < 1 || int64_t(c.pos_side) * c.pos_side != pos->ne[1])
    return Status::error(f.path() + ": tensor 'v.position_embd.weight' has " +
                         std::to_string(pos->ne[1]) +
                         " positions, which is not a square table (side x side)");
  OFFGRAPH_TRY(b.bind(w.pos_embd, "v.position_embd.weight", {D, pos->ne[1]}, Role::Vector));
  if (c.image_size != c.pos_side * c.patch * c.merge)
    return Status::error(f.path() + ": clip.vision.image_size = " + std::to_string(c.image_size) +
                         ", but the position table (" + std::to_string(c.pos_side) + " x " +
                         std::to_string(c.pos_side) + " patches of " + std::to_string(c.patch) +
                         " px, merge " + std::to_string(c.merge) + ") makes " +
                         std::to_string(c.pos_side * c.patch * c.merge));
  OFFGRAPH_TRY(b.bind(w.pre_ln_w, "v.pre_ln.weight", {D}, Role::Vector));
  OFFGRAPH_TRY(b.bind(w.pre_ln_b, "v.pre_ln.bias", {D}, Role::Vector));
  OFFGRAPH_TRY(b.bind(w.post_ln_w, "v.post_ln.weight", {D}, Role::Vector));
  OFFGRAPH_TRY(b.bind(w.post_ln_b, "v.post_ln.bias", {D}, Role::Vector));
  w.blocks.resize(size_t(c.n_layer));
  for (int32_t i = 0; i < c.n_layer; ++i) {
    VisionBlock &l = w.blocks[size_t(i)];
    const std::string p = "v.blk." + std::to_string(i) + ".";
    OFFGRAPH_TRY(b.bind(l.ln1_w, p + "ln1.weight", {D}, Role::Vector));
    OFFGRAPH_TRY(b.bind(l.ln1_b, p + "ln1.bias", {D}, Role::Vector));
    OFFGRAPH_TRY(b.bind(l.ln2_w, p + "ln2.weight", {D}, Role::Vector));
    OFFGRAPH_TRY(b.bind(l.ln2_b, p + "ln2.bias", {D}, Role::Vector));
    struct Matrix {
      Linear *out;
      const char *name;
      int64_t in, n_out;
    };
    for (const Matrix &m :
         {Matrix{&l.q, "attn_q", D, D}, Matrix{&l.k, "attn_k", D, D}, Matrix{&l.v, "attn_v", D, D},
          Matrix{&l.o, "attn_out", D, D}, Matrix{&l.up, "ffn_up", D, c.n_ff},
          Matrix{&l.down, "ffn_down", c.n_ff, D}}) {
      // Weight and bias both required (the converter writes both; this encoder has no scales).
      OFFGRAPH_TRY(b.bind(m.out->w, p + m.name + ".weight", {m.in, m.n_out}, Role::Matrix));
      OFFGRAPH_TRY(b.bind(m.out->b, p + m.name + ".bias", {m.n_out}, Role::Vector));
    }
  }
  const int64_t merged = D * c.merge * c.merge;
  ggml_tensor *mm0 = f.tensor("mm.0.weight");
  if (!mm0) return Status::error(f.path() + ": tensor 'mm.0.weight' is missing");
  c.adapter = int32_t(mm0->ne[1]);
  OFFGRAPH_TRY(b.bind(w.mm0, "mm.0.weight", {merged, c.adapter}, Role::Matrix));
  OFFGRAPH_TRY(b.bind(w.mm1, "mm.1.weight", {c.adapter, c.adapter}, Role::Matrix));
  OFFGRAPH_TRY(b.bind(w.mm2, "mm.2.weight", {c.adapter, c.n_embd_out}, Role::Matrix));
  return b.finish("Muse Glimmer vision");
}

} // namespace

Result<std::unique_ptr<VisionModel>> VisionModel::load(const std::string &path,
                                                       int32_t n_embd_text) {
  auto file = GgufFile::open(path);
  if (!file.ok()) return file.status();
  std::unique_ptr<VisionModel> m(new VisionModel());
  m->file_ = std::move(file).value();
  const GgufFile &f = *m->file_;
  auto arch = f.str("general.architecture");
  if (!arch.ok() || *arch != "clip")
    return Status::error(path + ": general.architecture is " +
                         (arch.ok() ? "'" + *arch + "'" : std::string("missing")) +
                         ", expected 'clip' (an mmproj file; --mmproj takes the vision encoder, "
                         "-m the text model)");
  ConfigReader keys(f, "clip.");
  OFFGRAPH_TRY(read_config(f, keys, m->config_));
  OFFGRAPH_TRY(keys.audit());
  TensorBinder binder(f);
  OFFGRAPH_TRY(bind_weights(f, binder, m->config_, m->weights_));
  if (n_embd_text != 0 && m->config_.n_embd_out != n_embd_text)
    return Status::error(path + ": the encoder's output width is " +
                         std::to_string(m->config_.n_embd_out) + " but the text model's is " +
                         std::to_string(n_embd_text) + " (an mmproj of another model?)");
  if (!f.has_weights())
    return Status::error(path + ": tensor data is missing (" + f.weights_missing() + ")");
  // (Mapped: an image reads the encoder's weights once, where a TLB walk a page costs little;
  // anonymous memory would hold the whole file for it.)
  OFFGRAPH_TRY(m->file_->map_weights());
  return m;
}

} // namespace offgraph::model
