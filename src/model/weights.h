// Weights: the tensors of a model as its graphs use them, and TensorBinder, which looks each one
// up with its shape and role and keeps count, so that a file holding a tensor no graph reads is
// refused by name instead of silently computing another model.
#pragma once

#include "base/status.h"
#include "model/gguf_file.h"

#include <functional>
#include <set>
#include <string>
#include <vector>

namespace offgraph::model {

// A projection y = W x with the optional pieces a GGUF may carry beside W. Shapes in ggml order.
struct Linear {
  ggml_tensor *w = nullptr; // [in, out]
  ggml_tensor *b = nullptr; // [out] bias, optional
  ggml_tensor *s = nullptr; // [1] per-tensor weight scale (NVFP4's second-level scale), optional
  bool bias_before_scale = false; // (W x + b) s instead of (W x) s + b: see Projection

  explicit operator bool() const { return w != nullptr; }
  // y = W x with scale and bias as above; no node for an absent piece.
  ggml_tensor *apply(ggml_context *ctx, ggml_tensor *x) const;
};

// What llama.cpp's graphs (llama-graph.cpp in the pinned tree) do with a projection's optional
// pieces, which offgraph follows: attention projections compute (W x) s + b (build_qkv,
// build_attn), FFN projections (W x + b) s (build_ffn); a projection whose bias llama.cpp's
// loader never creates takes none here either (the bias is left unbound, so the file is
// refused). Per-tensor scales are taken on every projection.
enum class Projection { Attention, Ffn, ScaleOnly };

// Every architecture's layer tensors; an architecture binds the ones it has (its file says which).
struct LayerWeights {
  ggml_tensor *attn_norm = nullptr; // [E]
  // Either wq, wk, wv ([E, H_q*D_k], [E, H_kv*D_k], [E, H_kv*D_v]) or the fused wqkv
  // ([E, H_q*D_k + H_kv*D_k + H_kv*D_v]), whose bias may also come as wq.b, wk.b, wv.b.
  Linear wq, wk, wv, wqkv;
  Linear wo;                             // [H_q*D_v, E]
  ggml_tensor *ffn_norm = nullptr;       // [E]
  Linear ffn_gate, ffn_up;               // [E, F]
  Linear ffn_down;                       // [F, E]
  Linear attn_gate;                      // [E, H_q*D_k] (Muse Glimmer)
  ggml_tensor *q_norm = nullptr;         // [D_k] (Muse Glimmer; the 3.87 factor lives here)
  ggml_tensor *k_norm = nullptr;         // [D_k] (Muse Glimmer)
  ggml_tensor *post_attn_norm = nullptr; // [E] (Muse Glimmer, Gemma 4)
  ggml_tensor *post_ffn_norm = nullptr;  // [E] (Muse Glimmer, Gemma 4)
  ggml_tensor *out_scale = nullptr;      // [1] the layer output's multiplier (Gemma 4)
  // Gemma 4's per-layer embedding: gate [E, P], projection [P, E], its norm [E].
  Linear ple_gate, ple_proj;
  ggml_tensor *ple_post_norm = nullptr;
};

struct Weights {
  ggml_tensor *tok_embd = nullptr;    // [E, V]
  ggml_tensor *output_norm = nullptr; // [E]
  Linear output;                      // [E, V]; w may be tok_embd (a tied head)
  ggml_tensor *rope_freqs = nullptr;  // [n_rot/2] frequency factors (Llama 3.1; Gemma 4's global
                                      // layers' proportional RoPE)
  // Gemma 4's per-layer embeddings (P per layer, L layers): the token table [P*L, V], the
  // projection of the embedding [E, P*L] and its norm [P]. Read at the input, on the CPU.
  ggml_tensor *ple_tok_embd = nullptr, *ple_model_proj = nullptr, *ple_proj_norm = nullptr;
  std::vector<LayerWeights> layers;
};

// Calls f(slot) for every tensor slot of the layer, bound or not (placement repoints them).
template <class F> void for_each_slot(LayerWeights &l, F &&f) {
  for (ggml_tensor **t : {&l.attn_norm, &l.ffn_norm, &l.q_norm, &l.k_norm, &l.post_attn_norm,
                          &l.post_ffn_norm, &l.out_scale, &l.ple_post_norm})
    f(*t);
  for (Linear *p : {&l.wq, &l.wk, &l.wv, &l.wqkv, &l.wo, &l.ffn_gate, &l.ffn_up, &l.ffn_down,
                    &l.attn_gate, &l.ple_gate, &l.ple_proj})
    for (ggml_tensor **t : {&p->w, &p->b, &p->s}) f(*t);
}
// The output head's slots: its norm and projection. (The rope frequencies stay on the CPU: every
// layer reads them, and they are a few hundred floats.)
template <class F> void for_each_output_slot(Weights &w, F &&f) {
  for (ggml_tensor **t : {&w.output_norm, &w.output.w, &w.output.b, &w.output.s}) f(*t);
}

// What a tensor is for decides the types it may have.
enum class Role { Matrix, Vector, Embedding };

// One tensor an architecture's bind_weights asks for, as a planning binder records it.
struct TensorRequest {
  std::string name;
  std::vector<int64_t> shape; // ggml order
  Role role;
  bool required;
};

class TensorBinder {
public:
  explicit TensorBinder(const GgufFile &file) : file_(&file) {}
  // Planning (synth writes files from it): looks nothing up, binds nothing, and records in
  // binding order every tensor that is required or that `present` says the file to be written
  // will hold (an optional tensor, or the fused form of a projection, through has()).
  // Planning checks nothing (no shapes, types, or pairings of a weight with its bias and scale):
  // the file it plans is loaded with the binder above like any other.
  explicit TensorBinder(std::function<bool(const std::string &)> present)
      : present_(present ? std::move(present) : [](const std::string &) { return false; }) {}
  const std::vector<TensorRequest> &requests() const { return requests_; }

  // Looks `name` up, checks shape and type for `role`, and counts it as used. Absent and not
  // required: `out` is nullptr and no error.
  Status bind(ggml_tensor *&out, const std::string &name, std::vector<int64_t> shape, Role role,
              bool required = true);
  // `<prefix>.weight` [in, out] with its optional `.bias` [out] (as `kind` allows), `.scale`
  // [1] and `.input_scale` [1]. The input scale calibrates W4A4 kernels that quantize
  // activations with it; a product with dequantized weights (ggml's, and llama.cpp's graphs)
  // has no use for it, so only its shape is checked and it counts as read.
  Status bind(Linear &out, const std::string &prefix, int64_t in, int64_t n_out, Projection kind,
              bool required = true);
  // The attention input projections under `p` ("blk.N."): attn_q, attn_k, attn_v, or the fused
  // attn_qkv (llama.cpp reads both forms), each with its optional bias and scales.
  Status attention_qkv(const std::string &p, int64_t in, int64_t q_out, int64_t k_out,
                       int64_t v_out, LayerWeights &l);
  bool has(const std::string &name) const {
    return file_ ? file_->tensor(name) != nullptr : present_(name);
  }

  // Every tensor of the file was bound, or an error naming those that were not.
  Status finish(const std::string &arch) const;

private:
  const std::string &path() const;

  const GgufFile *file_ = nullptr; // null: planning
  std::function<bool(const std::string &)> present_;
  std::vector<TensorRequest> requests_;
  std::set<std::string> used_;
};

} // namespace offgraph::model
