#include "model/vision_encoder.h"

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpp.h"
#include "ggml-cpu.h"

#include <cmath>

namespace offgraph::model {
namespace {

// Where the patches go: window order (windows in raster order, patches in raster order inside
// each), its inverse, the 2-D RoPE positions in window order, the 2x2 gathers of the pixel
// shuffle, and the runs of equal-sized consecutive windows.
struct Layout {
  int32_t gw = 0, gh = 0, n_tok = 0, n_out = 0;
  std::vector<int32_t> window_order, inverse, pos_w, pos_h, shuffle;
  struct Run {
    int32_t first = 0, size = 0, count = 0; // `count` windows of `size` patches from `first`
  };
  std::vector<Run> runs;
};

Layout plan_layout(int32_t gw, int32_t gh, int32_t side, int32_t merge) {
  Layout l;
  l.gw = gw, l.gh = gh, l.n_tok = gw * gh, l.n_out = (gw / merge) * (gh / merge);
  for (int32_t wy = 0; wy * side < gh; ++wy)
    for (int32_t wx = 0; wx * side < gw; ++wx) {
      const int32_t first = int32_t(l.window_order.size());
      for (int32_t y = wy * side; y < std::min(gh, (wy + 1) * side); ++y)
        for (int32_t x = wx * side; x < std::min(gw, (wx + 1) * side); ++x)
          l.window_order.push_back(y * gw + x);
      const int32_t size = int32_t(l.window_order.size()) - first;
      if (!l.runs.empty() && l.runs.back().size == size)
        ++l.runs.back().count;
      else
        l.runs.push_back({first, size, 1});
    }
  l.inverse.resize(size_t(l.n_tok));
  for (int32_t i = 0; i < l.n_tok; ++i) {
    const int32_t p = l.window_order[size_t(i)];
    l.inverse[size_t(p)] = i;
    l.pos_w.push_back(p % gw + 1);
    l.pos_h.push_back(p / gw + 1);
  }
  for (int32_t oy = 0; oy < gh / merge; ++oy)
    for (int32_t ox = 0; ox < gw / merge; ++ox)
      for (int32_t ry = 0; ry < merge; ++ry)
        for (int32_t rx = 0; rx < merge; ++rx)
          l.shuffle.push_back((oy * merge + ry) * gw + (ox * merge + rx));
  return l;
}

ggml_tensor *layer_norm(ggml_context *ctx, ggml_tensor *x, ggml_tensor *w, ggml_tensor *b,
                        float eps) {
  return ggml_add(ctx, ggml_mul(ctx, ggml_norm(ctx, x, eps), w), b);
}

// Attention over batches of equal windows (or, global, over all patches as one window).
// q, k, v: [hd, heads, n_tok] in window order. Returns [hd * heads, n_tok].
ggml_tensor *attend(ggml_context *ctx, ggml_tensor *q, ggml_tensor *k, ggml_tensor *v,
                    const std::vector<Layout::Run> &runs, float scale) {
  const int64_t hd = q->ne[0], heads = q->ne[1];
  ggml_tensor *out = nullptr;
  for (const Layout::Run &r : runs) {
    auto batch = [&](ggml_tensor *t) { // [hd, size, heads, count]
      ggml_tensor *view = ggml_view_3d(ctx, t, hd, heads, int64_t(r.size) * r.count, t->nb[1],
                                       t->nb[2], size_t(r.first) * t->nb[2]);
      return ggml_permute(
          ctx, ggml_reshape_4d(ctx, ggml_cont(ctx, view), hd, heads, r.size, r.count), 0, 2, 1, 3);
    };
    ggml_tensor *a =
        ggml_flash_attn_ext(ctx, batch(q), batch(k), batch(v), nullptr, scale, 0.0f, 0.0f);
    ggml_prec_set_acc(a, GGML_PREC_F32);
    a = ggml_reshape_2d(ctx, a, hd * heads, int64_t(r.size) * r.count); // [hd, heads, size, count]
    out = out ? ggml_concat(ctx, out, a, 1) : a;
  }
  return out;
}

} // namespace

Result<EncodedImage> encode_image(const VisionModel &model, const std::vector<float> &planar,
                                  int32_t width, int32_t height, int n_threads,
                                  const std::function<bool()> &cancelled,
                                  const std::function<bool()> &allocation_fault) {
  const VisionConfig &c = model.config();
  const VisionWeights &w = model.weights();
  const int32_t cell = c.patch * c.merge;
  if (width <= 0 || height <= 0 || width % cell != 0 || height % cell != 0)
    return Status::error("vision: the image must be resized to multiples of " +
                         std::to_string(cell) + " pixels, got " + std::to_string(width) + "x" +
                         std::to_string(height));
  if (planar.size() != size_t(width) * size_t(height) * 3)
    return Status::error("vision: " + std::to_string(planar.size()) + " values for a " +
                         std::to_string(width) + "x" + std::to_string(height) + " RGB image");
  // The token cap bounds the graph (global layers attend over every patch).
  const int64_t merged = (int64_t(width) / cell) * (int64_t(height) / cell);
  if (merged > c.max_tokens)
    return Status::error("vision: a " + std::to_string(width) + "x" + std::to_string(height) +
                         " image is " + std::to_string(merged) + " tokens, over the cap of " +
                         std::to_string(c.max_tokens) + " (image::choose_grid keeps under it)");
  const int32_t gw = width / c.patch, gh = height / c.patch;
  const Layout l = plan_layout(gw, gh, c.pos_side, c.merge);
  const int64_t D = c.n_embd, hd = c.head_dim, H = c.n_head;

  const size_t n_nodes = 64 + size_t(c.n_layer) * (48 + 24 * l.runs.size());
  ggml_init_params params = {
      n_nodes * ggml_tensor_overhead() + ggml_graph_overhead_custom(n_nodes, false), nullptr, true};
  ggml_context_ptr ctx_owner(ggml_init(params));
  ggml_context *ctx = ctx_owner.get();
  ggml_cgraph *gf = ggml_new_graph_custom(ctx, n_nodes, false);
  auto input_i32 = [&](int64_t n) {
    ggml_tensor *t = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n);
    ggml_set_input(t);
    return t;
  };
  ggml_tensor *pixels = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, width, height, 3, 1);
  ggml_set_input(pixels);
  ggml_tensor *pos_w = input_i32(l.n_tok), *pos_h = input_i32(l.n_tok);
  ggml_tensor *order = input_i32(l.n_tok), *inverse = input_i32(l.n_tok);
  ggml_tensor *shuffle = input_i32(l.n_tok);

  // Patch embedding: [gw, gh, D] -> [D, n_tok] in raster order.
  ggml_tensor *x = ggml_conv_2d(ctx, w.patch_embd, pixels, c.patch, c.patch, 0, 0, 1, 1);
  x = ggml_reshape_2d(ctx, x, l.n_tok, D);
  x = ggml_cont(ctx, ggml_transpose(ctx, x));
  if (w.patch_bias) x = ggml_add(ctx, x, w.patch_bias);
  // The position table, resized to the grid (bilinear, half-pixel centres) unless it fits.
  ggml_tensor *pos = w.pos_embd;
  if (gw != c.pos_side || gh != c.pos_side) {
    pos = ggml_reshape_3d(ctx, pos, D, c.pos_side, c.pos_side);
    pos = ggml_permute(ctx, pos, 2, 0, 1, 3); // [x, y, D]
    pos = ggml_interpolate(ctx, pos, gw, gh, D, 1, GGML_SCALE_MODE_BILINEAR);
    pos = ggml_permute(ctx, pos, 1, 2, 0, 3);
    pos = ggml_cont_2d(ctx, pos, D, l.n_tok);
  }
  x = ggml_add(ctx, x, pos);
  x = ggml_get_rows(ctx, x, order); // window order from here on
  x = layer_norm(ctx, x, w.pre_ln_w, w.pre_ln_b, c.eps);
  const std::vector<Layout::Run> global = {{0, l.n_tok, 1}};
  const float scale = 1.0f / std::sqrt(float(hd));
  for (int32_t i = 0; i < c.n_layer; ++i) {
    const VisionBlock &b = w.blocks[size_t(i)];
    ggml_tensor *h = layer_norm(ctx, x, b.ln1_w, b.ln1_b, c.eps);
    auto rope2d = [&](ggml_tensor *t) {
      t = ggml_reshape_3d(ctx, t, hd, H, l.n_tok);
      t = ggml_rope_ext(ctx, t, pos_w, nullptr, int(hd / 2), 0, 0, c.rope_theta, 1.0f, 0.0f, 1.0f,
                        0.0f, 0.0f);
      t = ggml_rope_ext(ctx, t, pos_h, nullptr, int(hd / 2), 0, 0, c.rope_theta, 1.0f, 0.0f, 1.0f,
                        0.0f, 0.0f);
      return ggml_rope_set_offset(t, int(hd / 2));
    };
    ggml_tensor *q = rope2d(b.q.apply(ctx, h));
    ggml_tensor *k = rope2d(b.k.apply(ctx, h));
    ggml_tensor *v = ggml_reshape_3d(ctx, b.v.apply(ctx, h), hd, H, l.n_tok);
    ggml_tensor *a = attend(ctx, q, k, v, c.is_global(i) ? global : l.runs, scale);
    x = ggml_add(ctx, x, b.o.apply(ctx, a));
    h = layer_norm(ctx, x, b.ln2_w, b.ln2_b, c.eps);
    h = b.down.apply(ctx, ggml_gelu_erf(ctx, b.up.apply(ctx, h)));
    x = ggml_add(ctx, x, h);
  }
  x = layer_norm(ctx, x, w.post_ln_w, w.post_ln_b, c.eps);
  x = ggml_get_rows(ctx, x, inverse); // raster order
  // Pixel shuffle: each merged token's merge x merge patches, feature = channel * 4 + sub-patch.
  const int64_t sub = int64_t(c.merge) * c.merge;
  x = ggml_get_rows(ctx, x, shuffle);
  x = ggml_reshape_3d(ctx, x, D, sub, l.n_out);
  x = ggml_cont(ctx, ggml_permute(ctx, x, 1, 0, 2, 3));
  x = ggml_reshape_2d(ctx, x, D * sub, l.n_out);
  x = ggml_gelu_erf(ctx, ggml_mul_mat(ctx, w.mm0, x));
  x = ggml_gelu_erf(ctx, ggml_mul_mat(ctx, w.mm1, x));
  x = ggml_mul_mat(ctx, w.mm2, x);
  ggml_set_output(x);
  ggml_build_forward_expand(gf, x);

  ggml_backend_ptr backend(ggml_backend_cpu_init());
  ggml_backend_cpu_set_n_threads(backend.get(), n_threads);
  ggml_gallocr_ptr alloc(ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend.get())));
  if ((allocation_fault && allocation_fault()) || !ggml_gallocr_alloc_graph(alloc.get(), gf))
    return Status::error("vision: could not allocate the encoder's graph for a " +
                             std::to_string(width) + "x" + std::to_string(height) +
                             " image (out of memory)",
                         StatusCode::kUnavailable);
  ggml_backend_tensor_set(pixels, planar.data(), 0, ggml_nbytes(pixels));
  for (auto [t, v] : {std::pair{pos_w, &l.pos_w},
                      {pos_h, &l.pos_h},
                      {order, &l.window_order},
                      {inverse, &l.inverse},
                      {shuffle, &l.shuffle}})
    ggml_backend_tensor_set(t, v->data(), 0, ggml_nbytes(t));
  if (cancelled)
    ggml_backend_cpu_set_abort_callback(
        backend.get(),
        [](void *data) { return (*static_cast<const std::function<bool()> *>(data))(); },
        const_cast<std::function<bool()> *>(&cancelled));
  const ggml_status status = ggml_backend_graph_compute(backend.get(), gf);
  if (status == GGML_STATUS_ABORTED)
    return Status::error("vision: the encode was cancelled", StatusCode::kUnavailable);
  if (status != GGML_STATUS_SUCCESS)
    return Status::error("vision: the encoder's graph failed to compute", StatusCode::kInternal);
  EncodedImage out;
  out.n_rows = l.n_out;
  out.width = int32_t(x->ne[0]);
  out.rows.resize(size_t(ggml_nelements(x)));
  ggml_backend_tensor_get(x, out.rows.data(), 0, ggml_nbytes(x));
  return out;
}

} // namespace offgraph::model
