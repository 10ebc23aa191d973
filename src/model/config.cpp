#include "model/config.h"

#include <cmath>

namespace offgraph::model {

int32_t ModelConfig::n_sliding() const {
  int32_t n = 0;
  for (bool s : sliding) n += s;
  return n;
}

std::vector<cache::LayerSpec> ModelConfig::layer_specs() const {
  std::vector<cache::LayerSpec> layers;
  for (int32_t i = 0; i < n_layer; ++i)
    layers.push_back(
        {cache::AttentionKind{sliding[size_t(i)] ? window : 0}, n_head_kv, head_dim_k, head_dim_v});
  return layers;
}

std::string ModelConfig::describe() const {
  return arch_name + ": " + std::to_string(n_layer) + " layers, embd " + std::to_string(n_embd) +
         ", " + std::to_string(n_head) + " heads / " + std::to_string(n_head_kv) + " KV heads x " +
         std::to_string(head_dim_k) + ", ff " + std::to_string(n_ff) + ", vocab " +
         std::to_string(n_vocab) +
         (window > 0 ? ", window " + std::to_string(window) + " on " + std::to_string(n_sliding()) +
                           " layers"
                     : "");
}

namespace {

// Reads a u32 hyperparameter into an int32 and checks its range.
Status get(const GgufFile &f, const std::string &key, int32_t &out, int64_t lo, int64_t hi) {
  auto v = f.u32(key);
  if (!v.ok()) return v.status();
  if (int64_t(*v) < lo || int64_t(*v) > hi)
    return Status::error(f.path() + ": key '" + key + "' = " + std::to_string(*v) + " is outside " +
                         std::to_string(lo) + ".." + std::to_string(hi));
  out = int32_t(*v);
  return ok_status();
}

Status get_optional(const GgufFile &f, const std::string &key, int32_t &out, int64_t lo,
                    int64_t hi) {
  if (!f.has(key)) return ok_status();
  return get(f, key, out, lo, hi);
}

Status get_f(const GgufFile &f, const std::string &key, float &out, bool required, float lo,
             float hi) {
  if (!required && !f.has(key)) return ok_status();
  auto v = f.f32(key);
  if (!v.ok()) return v.status();
  if (!std::isfinite(*v) || *v < lo || *v > hi)
    return Status::error(f.path() + ": key '" + key + "' = " + std::to_string(*v) + " is outside " +
                         std::to_string(lo) + ".." + std::to_string(hi));
  out = *v;
  return ok_status();
}

#define TRY(expr)                                                                                  \
  do {                                                                                             \
    if (Status _s = (expr); !_s.ok()) return _s;                                                   \
  } while (0)

} // namespace

Result<ModelConfig> read_config(const GgufFile &f) {
  ModelConfig c;
  auto arch = f.str("general.architecture");
  if (!arch.ok()) return arch.status();
  c.arch_name = *arch;
  if (c.arch_name == "muse-glimmer")
    c.arch = Arch::MuseGlimmer;
  else if (c.arch_name == "llama")
    c.arch = Arch::Llama;
  else
    return Status::error(f.path() + ": architecture '" + c.arch_name +
                         "' is not supported (supported: muse-glimmer, llama)");
  if (auto name = f.str("general.name"); name.ok()) c.name = *name;
  const std::string p = c.arch_name + ".";
  constexpr int64_t kBig = int64_t(1) << 24;

  TRY(get(f, p + "block_count", c.n_layer, 1, 4096));
  TRY(get(f, p + "embedding_length", c.n_embd, 1, kBig));
  TRY(get(f, p + "feed_forward_length", c.n_ff, 1, kBig));
  TRY(get(f, p + "attention.head_count", c.n_head, 1, 65536));
  c.n_head_kv = c.n_head;
  TRY(get_optional(f, p + "attention.head_count_kv", c.n_head_kv, 1, 65536));
  TRY(get(f, p + "context_length", c.n_ctx_train, 1, int64_t(1) << 29));
  if (c.n_head % c.n_head_kv != 0)
    return Status::error(f.path() + ": " + std::to_string(c.n_head) +
                         " attention heads are not a multiple of " + std::to_string(c.n_head_kv) +
                         " KV heads");
  c.head_dim_k = c.n_embd / c.n_head;
  TRY(get_optional(f, p + "attention.key_length", c.head_dim_k, 1, 65536));
  c.head_dim_v = c.head_dim_k;
  TRY(get_optional(f, p + "attention.value_length", c.head_dim_v, 1, 65536));
  if (c.head_dim_k < 1)
    return Status::error(f.path() + ": head dim is 0 (embedding_length < head_count)");
  c.n_rot = c.head_dim_k;
  TRY(get_optional(f, p + "rope.dimension_count", c.n_rot, 2, c.head_dim_k));
  TRY(get_f(f, p + "attention.layer_norm_rms_epsilon", c.rms_eps, true, 0.0f, 1.0f));
  TRY(get_f(f, p + "rope.freq_base", c.rope_base, false, 1e-3f, 1e12f));
  c.rope_base_swa = c.rope_base;
  c.attn_scale = 1.0f / std::sqrt(float(c.head_dim_k));
  c.sliding.assign(size_t(c.n_layer), false);

  if (c.arch == Arch::MuseGlimmer) {
    if (c.head_dim_k != c.head_dim_v)
      return Status::error(f.path() + ": muse-glimmer needs equal K and V head dims, got " +
                           std::to_string(c.head_dim_k) + " and " + std::to_string(c.head_dim_v));
    TRY(get_f(f, p + "rope.freq_base_swa", c.rope_base_swa, false, 1e-3f, 1e12f));
    TRY(get(f, p + "attention.sliding_window", c.window, 1, int64_t(1) << 29));
    TRY(get_f(f, p + "logit_scale", c.logit_scale, true, 0.0f, 1e6f));
    c.softcap = 30.0f; // llama.cpp's default when the key is absent
    TRY(get_f(f, p + "final_logit_softcapping", c.softcap, false, 0.0f, 1e6f));
    // sliding_window_pattern: a per-layer bool array (true = sliding), or a scalar period n
    // (layer i slides iff i % n < n - 1), or absent (period 4).
    const std::string key = p + "attention.sliding_window_pattern";
    auto arr = f.optional_bool_array(key);
    if (!arr.ok()) return arr.status();
    if (*arr) {
      if (int32_t((*arr)->size()) != c.n_layer)
        return Status::error(f.path() + ": key '" + key + "' has " +
                             std::to_string((*arr)->size()) + " entries for " +
                             std::to_string(c.n_layer) + " layers");
      c.sliding = **arr;
    } else {
      int32_t period = 4;
      TRY(get_optional(f, key, period, 1, 4096));
      for (int32_t i = 0; i < c.n_layer; ++i) c.sliding[size_t(i)] = i % period < period - 1;
    }
  }

  ggml_tensor *embd = f.tensor("token_embd.weight");
  if (!embd) return Status::error(f.path() + ": tensor 'token_embd.weight' is missing");
  if (embd->ne[0] != c.n_embd || embd->ne[1] < 1 || embd->ne[1] > kBig)
    return Status::error(f.path() + ": tensor 'token_embd.weight' has shape [" +
                         std::to_string(embd->ne[0]) + ", " + std::to_string(embd->ne[1]) +
                         "], expected [" + std::to_string(c.n_embd) + ", n_vocab]");
  c.n_vocab = int32_t(embd->ne[1]);
  return c;
}

} // namespace offgraph::model
