// GraphBuilder: what an architecture's forward graph is built from (the model, the graph's
// context, the batch and its inputs, the step that owns the cache), and the pieces every
// architecture's graph uses, so that each is written once: norms, RoPE, attention through the
// cache of a layer, and keeping only the rows whose logits are wanted.
#pragma once

#include "model/model.h"

#include <map>
#include <utility>

namespace offgraph::model {

class GraphBuilder {
public:
  // `hidden` collects the inputs of batch.hidden_layers (layer_input).
  GraphBuilder(const Model &model, ggml_context *ctx, const Batch &batch, const GraphInputs &in,
               kv::Step &step, std::vector<ggml_tensor *> *hidden = nullptr)
      : model_(model), ctx_(ctx), batch_(batch), in_(in), step_(step), hidden_(hidden) {}

  const Model &model() const { return model_; }
  const ModelConfig &config() const { return model_.config(); }
  const Weights &weights() const { return model_.weights(); }
  ggml_context *ctx() const { return ctx_; }
  int64_t n_tokens() const { return int64_t(batch_.tokens.size()); }
  ggml_tensor *token_ids() const { return in_.tokens; }
  // The batch's input rows [n_embd, n]: the tokens' rows of `tok_embd`, with the batch's
  // embedding rows (Batch::embeddings) in place of theirs.
  ggml_tensor *input_rows(ggml_tensor *tok_embd) const;

  // rms(x, eps) * gain; gain may be absent (a weightless norm).
  ggml_tensor *rms_norm(ggml_tensor *x, ggml_tensor *gain, float eps) const;
  // RoPE in the mode the architecture gives (ggml's NORM: adjacent pairs; NEOX: halves) at the
  // batch's positions, `freq_factors` optional ([n_rot/2]: Llama 3.1's, Gemma 4's proportional
  // RoPE). No YaRN: its files are refused (config.cpp).
  ggml_tensor *rope(ggml_tensor *x, const RopeParams &p, ggml_tensor *freq_factors = nullptr) const;
  // The layer's q [D_k, H_q, n], k [D_k, H_kv, n] and v [D_v, H_kv, n] from its input, through
  // separate projections or the fused one.
  struct Qkv {
    ggml_tensor *q, *k, *v;
  };
  Qkv project_qkv(int32_t layer, const LayerWeights &l, ggml_tensor *x) const;
  // q [D_k, H_q, n], k and v [D, H_kv, n] -> [D_v * H_q, n] through the cache the geometry gives
  // `layer` (its own, or its donor's on an architecture that shares KV: a shared layer passes
  // no k and v, and the donor's are served again). The only place a graph touches the cache.
  Result<ggml_tensor *> attend(int32_t layer, ggml_tensor *q, ggml_tensor *k, ggml_tensor *v,
                               float scale) const;
  // The head's output with the model's logit scale and final soft-cap (ModelConfig::logit_scale,
  // softcap): cap * tanh(logits * scale / cap) in one pass on the CPU (softcap.h says why not
  // ggml's ops there), ggml's ops on a device (no custom op ever reaches a device, and the
  // logits stay there until they are read); without a cap, the scale alone (none when 1).
  ggml_tensor *scaled_logits(ggml_tensor *logits) const;
  // True when only some rows' logits are wanted: after the last layer's attention has written
  // every row's K/V, the graph may keep just those rows (a 512-token prompt chunk keeps 1).
  bool keeps_logit_rows() const { return int64_t(batch_.logit_rows.size()) < n_tokens(); }
  ggml_tensor *logit_rows(ggml_tensor *x) const { return ggml_get_rows(ctx_, x, in_.logit_rows); }
  // Every architecture calls it with each layer's input x [n_embd, n_tokens] (all rows: before
  // the last layer keeps only the logit rows); x is kept when batch.hidden_layers names the layer.
  ggml_tensor *layer_input(int32_t layer, ggml_tensor *x) const;

private:
  const Model &model_;
  ggml_context *ctx_;
  const Batch &batch_;
  const GraphInputs &in_;
  kv::Step &step_;
  std::vector<ggml_tensor *> *hidden_;
  // Each cache's k and v as its owner gave them, for the layers that share it.
  mutable std::map<cache::CacheId, std::pair<ggml_tensor *, ggml_tensor *>> donor_kv_;
};

} // namespace offgraph::model
