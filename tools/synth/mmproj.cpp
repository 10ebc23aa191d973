#include "synth/mmproj.h"
#include "synth/tensor_plan.h"

#include "ggml-cpp.h"
#include "gguf.h"

#include <cmath>

namespace offgraph::synth {

Result<std::string> write_mmproj(const MmprojSpec &s, const std::string &path) {
  if (s.n_layer < 1 || s.n_embd < 1 || s.n_head < 1 || s.n_embd % s.n_head != 0 ||
      (s.n_embd / s.n_head) % 4 != 0 || s.n_ff < 1 || s.patch < 1 || s.merge < 1 ||
      s.pos_side < 1 || s.adapter < 1 || s.n_embd_text < 1)
    return Status::error("synth mmproj: inconsistent sizes (heads divide the width into head "
                         "dims that are multiples of 4, for the two RoPE halves)");
  gguf_context_ptr out(gguf_init_empty());
  gguf_context *g = out.get();
  gguf_set_val_str(g, "general.architecture", "clip");
  gguf_set_val_str(g, "general.type", "mmproj");
  gguf_set_val_str(g, "general.name", "offgraph-synth-mmproj");
  gguf_set_val_u32(g, "general.file_type", s.weight_type == GGML_TYPE_F32 ? 0 : 1);
  gguf_set_val_bool(g, "clip.has_vision_encoder", true);
  gguf_set_val_str(g, "clip.projector_type", "muse-glimmer");
  gguf_set_val_u32(g, "clip.vision.projection_dim", uint32_t(s.n_embd_text));
  gguf_set_val_u32(g, "clip.vision.image_size", uint32_t(s.pos_side * s.patch * s.merge));
  gguf_set_val_u32(g, "clip.vision.patch_size", uint32_t(s.patch));
  gguf_set_val_u32(g, "clip.vision.embedding_length", uint32_t(s.n_embd));
  gguf_set_val_u32(g, "clip.vision.feed_forward_length", uint32_t(s.n_ff));
  gguf_set_val_u32(g, "clip.vision.block_count", uint32_t(s.n_layer));
  gguf_set_val_u32(g, "clip.vision.attention.head_count", uint32_t(s.n_head));
  gguf_set_arr_data(g, "clip.vision.image_mean", GGUF_TYPE_FLOAT32, s.mean.data(), 3);
  gguf_set_arr_data(g, "clip.vision.image_std", GGUF_TYPE_FLOAT32, s.std_dev.data(), 3);
  gguf_set_val_f32(g, "clip.vision.attention.layer_norm_epsilon", s.eps);
  gguf_set_val_u32(g, "clip.vision.spatial_merge_size", uint32_t(s.merge));

  const int64_t D = s.n_embd;
  const ggml_type wt = s.weight_type;
  auto mat = [&](const std::string &n, int64_t in, int64_t outw, float gain = 1.0f) {
    return matrix_plan(n, in, outw, fit(wt, in), TensorPlan::Normal,
                       gain * float(1.0 / std::sqrt(double(in))));
  };
  auto bias = [&](const std::string &n, int64_t ne0) {
    return vector_plan(n, ne0, TensorPlan::Normal, 0.02f);
  };
  auto norm = [&](const std::string &p) {
    return std::vector<TensorPlan>{vector_plan(p + ".weight", D, TensorPlan::Gain, 0.1f),
                                   vector_plan(p + ".bias", D, TensorPlan::Normal, 0.02f)};
  };
  // Residual branches start small (1/sqrt(2 x layers)), as the text generator's.
  const float branch = float(1.0 / std::sqrt(2.0 * s.n_layer));
  const int64_t patch_in = int64_t(s.patch) * s.patch * 3;
  std::vector<TensorPlan> plan;
  plan.push_back({"v.patch_embd.weight",
                  {s.patch, s.patch, 3, D},
                  wt == GGML_TYPE_F32 ? GGML_TYPE_F32 : GGML_TYPE_F16,
                  TensorPlan::Normal,
                  float(1.0 / std::sqrt(double(patch_in))),
                  4});
  plan.push_back(matrix_plan("v.position_embd.weight", D, int64_t(s.pos_side) * s.pos_side,
                             GGML_TYPE_F32, TensorPlan::Normal, 0.5f));
  for (auto &t : norm("v.pre_ln")) plan.push_back(t);
  for (int32_t i = 0; i < s.n_layer; ++i) {
    const std::string b = "v.blk." + std::to_string(i) + ".";
    for (auto &t : norm(b + "ln1")) plan.push_back(t);
    for (const char *m : {"attn_q", "attn_k", "attn_v"}) {
      plan.push_back(mat(b + m + ".weight", D, D));
      plan.push_back(bias(b + m + ".bias", D));
    }
    plan.push_back(mat(b + "attn_out.weight", D, D, branch));
    plan.push_back(bias(b + "attn_out.bias", D));
    for (auto &t : norm(b + "ln2")) plan.push_back(t);
    plan.push_back(mat(b + "ffn_up.weight", D, s.n_ff));
    plan.push_back(bias(b + "ffn_up.bias", s.n_ff));
    plan.push_back(mat(b + "ffn_down.weight", s.n_ff, D, branch));
    plan.push_back(bias(b + "ffn_down.bias", D));
  }
  for (auto &t : norm("v.post_ln")) plan.push_back(t);
  const int64_t merged = D * s.merge * s.merge;
  plan.push_back(mat("mm.0.weight", merged, s.adapter));
  plan.push_back(mat("mm.1.weight", s.adapter, s.adapter));
  plan.push_back(mat("mm.2.weight", s.adapter, s.n_embd_text));
  uint64_t n_params = 0, bytes = 0;
  OFFGRAPH_TRY(write_gguf(g, plan, path, false, s.seed, nullptr, n_params, bytes));
  return "muse-glimmer mmproj, " + std::to_string(s.n_layer) + " layers, width " +
         std::to_string(D) + ", " + std::to_string(n_params) + " parameters, output width " +
         std::to_string(s.n_embd_text);
}

} // namespace offgraph::synth
