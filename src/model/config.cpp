#include "model/config.h"

#include "model/arch.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace offgraph::model {

int32_t ModelConfig::n_sliding() const {
  int32_t n = 0;
  for (const LayerConfig &l : layers) n += l.sliding;
  return n;
}

RopeParams ModelConfig::rope(int32_t i) const {
  const bool swa = sliding(i);
  // llama.cpp never scales the sliding layers' frequencies (rope_freq_scale_train_swa is 1).
  return {
      layer(i).n_rot,   rope_mode,  swa ? rope_base_swa : rope_base, swa ? 1.0f : rope_freq_scale,
      rope_attn_factor, n_ctx_train};
}

std::vector<cache::LayerSpec> ModelConfig::layer_specs() const {
  std::vector<cache::LayerSpec> specs;
  for (const LayerConfig &l : layers)
    specs.push_back(
        {cache::AttentionKind{l.sliding ? window : 0}, l.n_head_kv, l.head_dim_k, l.head_dim_v});
  return specs;
}

namespace {

// "8" when every layer has it, else "8/2" (the distinct values in order of first use).
std::string per_layer_values(const std::vector<LayerConfig> &layers, int32_t LayerConfig::*field) {
  std::vector<int32_t> seen;
  for (const LayerConfig &l : layers)
    if (std::find(seen.begin(), seen.end(), l.*field) == seen.end()) seen.push_back(l.*field);
  std::string s;
  for (int32_t v : seen) s += (s.empty() ? "" : "/") + std::to_string(v);
  return s;
}

} // namespace

std::string ModelConfig::describe() const {
  return arch_name + ": " + std::to_string(n_layer) + " layers, embd " + std::to_string(n_embd) +
         ", " + per_layer_values(layers, &LayerConfig::n_head) + " heads / " +
         per_layer_values(layers, &LayerConfig::n_head_kv) + " KV heads x " +
         per_layer_values(layers, &LayerConfig::head_dim_k) + ", ff " +
         per_layer_values(layers, &LayerConfig::n_ff) + ", vocab " + std::to_string(n_vocab) +
         (window > 0 ? ", window " + std::to_string(window) + " on " + std::to_string(n_sliding()) +
                           " layers"
                     : "") +
         (n_kv_shared_layers > 0
              ? ", the last " + std::to_string(n_kv_shared_layers) + " layers reading donors' KV"
              : "");
}

// ---- ConfigReader ------------------------------------------------------------------------------

Status ConfigReader::u32(const std::string &suffix, int32_t &out, int64_t lo, int64_t hi,
                         bool required) {
  const std::string k = key(suffix);
  if (!required && !f_.has(k)) return ok_status();
  auto v = f_.u32(k);
  if (!v.ok()) return v.status();
  if (int64_t(*v) < lo || int64_t(*v) > hi)
    return Status::error(f_.path() + ": key '" + k + "' = " + std::to_string(*v) + " is outside " +
                         std::to_string(lo) + ".." + std::to_string(hi));
  out = int32_t(*v);
  return ok_status();
}

Status ConfigReader::f32(const std::string &suffix, float &out, float lo, float hi, bool required) {
  const std::string k = key(suffix);
  if (!required && !f_.has(k)) return ok_status();
  auto v = f_.f32(k);
  if (!v.ok()) return v.status();
  if (!std::isfinite(*v) || *v < lo || *v > hi)
    return Status::error(f_.path() + ": key '" + k + "' = " + std::to_string(*v) + " is outside " +
                         std::to_string(lo) + ".." + std::to_string(hi));
  out = *v;
  return ok_status();
}

Result<std::optional<std::string>> ConfigReader::str(const std::string &suffix) {
  const std::string k = key(suffix);
  if (!f_.has(k)) return std::optional<std::string>();
  auto v = f_.str(k);
  if (!v.ok()) return v.status();
  return std::optional<std::string>(*v);
}

Result<std::optional<std::vector<bool>>> ConfigReader::bool_array(const std::string &suffix) {
  return f_.optional_bool_array(key(suffix));
}

namespace {

// Numeric value of a scalar key (bools as 0/1); nullopt for strings and arrays.
std::optional<double> scalar_value(const gguf_context *ctx, int64_t id) {
  switch (gguf_get_kv_type(ctx, id)) {
  case GGUF_TYPE_UINT8:
    return gguf_get_val_u8(ctx, id);
  case GGUF_TYPE_INT8:
    return gguf_get_val_i8(ctx, id);
  case GGUF_TYPE_UINT16:
    return gguf_get_val_u16(ctx, id);
  case GGUF_TYPE_INT16:
    return gguf_get_val_i16(ctx, id);
  case GGUF_TYPE_UINT32:
    return gguf_get_val_u32(ctx, id);
  case GGUF_TYPE_INT32:
    return gguf_get_val_i32(ctx, id);
  case GGUF_TYPE_UINT64:
    return double(gguf_get_val_u64(ctx, id));
  case GGUF_TYPE_INT64:
    return double(gguf_get_val_i64(ctx, id));
  case GGUF_TYPE_FLOAT32:
    return gguf_get_val_f32(ctx, id);
  case GGUF_TYPE_FLOAT64:
    return gguf_get_val_f64(ctx, id);
  case GGUF_TYPE_BOOL:
    return gguf_get_val_bool(ctx, id) ? 1.0 : 0.0;
  default:
    return std::nullopt;
  }
}

// Element i of a numeric array as a double.
double array_value(const gguf_context *ctx, int64_t id, size_t i) {
  const void *d = gguf_get_arr_data(ctx, id);
  switch (gguf_get_arr_type(ctx, id)) {
  case GGUF_TYPE_UINT8:
    return static_cast<const uint8_t *>(d)[i];
  case GGUF_TYPE_INT8:
    return static_cast<const int8_t *>(d)[i];
  case GGUF_TYPE_UINT16:
    return static_cast<const uint16_t *>(d)[i];
  case GGUF_TYPE_INT16:
    return static_cast<const int16_t *>(d)[i];
  case GGUF_TYPE_UINT32:
    return static_cast<const uint32_t *>(d)[i];
  case GGUF_TYPE_INT32:
    return static_cast<const int32_t *>(d)[i];
  case GGUF_TYPE_UINT64:
    return double(static_cast<const uint64_t *>(d)[i]);
  case GGUF_TYPE_INT64:
    return double(static_cast<const int64_t *>(d)[i]);
  case GGUF_TYPE_FLOAT32:
    return static_cast<const float *>(d)[i];
  case GGUF_TYPE_FLOAT64:
    return static_cast<const double *>(d)[i];
  case GGUF_TYPE_BOOL:
    return static_cast<const int8_t *>(d)[i] ? 1.0 : 0.0;
  default:
    return 0.0;
  }
}

std::string number(double v) {
  char buf[32];
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 1e18) // integers in full
    std::snprintf(buf, sizeof buf, "%.0f", v);
  else
    std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// True when the key states one of `neutral` (scalars), is empty, or every element does.
bool is_neutral(const gguf_context *ctx, int64_t id, const std::vector<double> &neutral) {
  const gguf_type t = gguf_get_kv_type(ctx, id);
  // An f32 key holds the float rounding of a listed value (0.05f); other types compare exactly.
  const bool f32 = t == GGUF_TYPE_FLOAT32 ||
                   (t == GGUF_TYPE_ARRAY && gguf_get_arr_type(ctx, id) == GGUF_TYPE_FLOAT32);
  auto neutral_value = [&](double v) {
    for (double n : neutral)
      if (f32 ? float(v) == float(n) : v == n) return true;
    return false;
  };
  if (t == GGUF_TYPE_STRING) return std::string(gguf_get_val_str(ctx, id)).empty();
  if (t != GGUF_TYPE_ARRAY) return neutral_value(*scalar_value(ctx, id));
  const size_t n = gguf_get_arr_n(ctx, id);
  if (gguf_get_arr_type(ctx, id) == GGUF_TYPE_STRING) {
    for (size_t i = 0; i < n; ++i)
      if (*gguf_get_arr_str(ctx, id, i)) return false;
    return true;
  }
  for (size_t i = 0; i < n; ++i)
    if (!neutral_value(array_value(ctx, id, i))) return false;
  return true;
}

} // namespace

std::string describe_value(const gguf_context *ctx, int64_t id) {
  const gguf_type t = gguf_get_kv_type(ctx, id);
  if (t == GGUF_TYPE_STRING) {
    std::string s = gguf_get_val_str(ctx, id);
    return "'" + (s.size() > 40 ? s.substr(0, 40) + "..." : s) + "'";
  }
  if (t != GGUF_TYPE_ARRAY) return number(*scalar_value(ctx, id));
  const size_t n = gguf_get_arr_n(ctx, id);
  const gguf_type et = gguf_get_arr_type(ctx, id);
  std::string s = "[" + std::to_string(n) + " x " + gguf_type_label(et) + ":";
  for (size_t i = 0; i < n && i < 6; ++i)
    s += (i ? ", " : " ") + (et == GGUF_TYPE_STRING
                                 ? "'" + std::string(gguf_get_arr_str(ctx, id, i)) + "'"
                                 : number(array_value(ctx, id, i)));
  return s + (n > 6 ? ", ...]" : "]");
}

Status ConfigReader::audit() const {
  const gguf_context *ctx = f_.gguf();
  for (int64_t id = 0; id < gguf_get_n_kv(ctx); ++id) {
    const std::string k = gguf_get_key(ctx, id);
    if (read_.count(k)) continue;
    // Namespaces with readers of their own: description (general.), the tokenizer's keys
    // (tokenizer., read by text/tokenizer), quantization provenance (quantize.imatrix.*).
    if (k.rfind("general.", 0) == 0 || k.rfind("tokenizer.", 0) == 0 ||
        k.rfind("quantize.", 0) == 0)
      continue;
    if (k == "split.count" && !is_neutral(ctx, id, {0.0, 1.0}))
      return Status::error(f_.path() + ": this is one part of a split model (split.count = " +
                           describe_value(ctx, id) +
                           "); offgraph loads single files: merge the parts first (llama.cpp's "
                           "llama-gguf-split --merge)");
    if (k.rfind("split.", 0) == 0) continue; // split.no 0 / tensors.count of a one-part file
    const auto n = neutral_.find(k);
    if (is_neutral(ctx, id, n == neutral_.end() ? std::vector<double>{0.0} : n->second)) continue;
    return Status::error(f_.path() + ": key '" + k + "' = " + describe_value(ctx, id) +
                         (k.rfind(p_, 0) == 0 ? " is not something offgraph's " +
                                                    p_.substr(0, p_.size() - 1) + " computes"
                                              : " belongs to no reader offgraph has") +
                         "; refusing rather than computing another model than the file describes "
                         "(docs/model-files.md lists the keys each architecture honours)");
  }
  return ok_status();
}

// ---- the keys every architecture shares --------------------------------------------------------

Status same_shape_on_every_layer(const ConfigReader &keys, const ModelConfig &c) {
  const LayerConfig &a = c.layers.at(0);
  for (size_t i = 1; i < c.layers.size(); ++i) {
    const LayerConfig &b = c.layers[i];
    if (b.n_head != a.n_head || b.n_head_kv != a.n_head_kv || b.n_ff != a.n_ff ||
        b.head_dim_k != a.head_dim_k || b.head_dim_v != a.head_dim_v || b.n_rot != a.n_rot)
      return Status::error(keys.file().path() + ": layer " + std::to_string(i) + " has " +
                           std::to_string(b.n_head) + " heads / " + std::to_string(b.n_head_kv) +
                           " KV heads / FFN " + std::to_string(b.n_ff) + " where layer 0 has " +
                           std::to_string(a.n_head) + " / " + std::to_string(a.n_head_kv) + " / " +
                           std::to_string(a.n_ff) + "; " +
                           keys.prefix().substr(0, keys.prefix().size() - 1) +
                           " has one shape for every layer (as llama.cpp's graph)");
  }
  return ok_status();
}

Status read_sliding_shapes(ConfigReader &keys, ModelConfig &c, bool per_kind) {
  const LayerConfig &first = c.layers.at(0);
  const std::pair<const char *, int32_t LayerConfig::*> fields[] = {
      {"attention.key_length_swa", &LayerConfig::head_dim_k},
      {"attention.value_length_swa", &LayerConfig::head_dim_v},
      {"rope.dimension_count_swa", &LayerConfig::n_rot}};
  for (const auto &[suffix, field] : fields) {
    int32_t swa = first.*field;
    OFFGRAPH_TRY(keys.u32(suffix, swa, 1, 65536, false));
    if (!keys.has(suffix)) continue;
    if (!per_kind) {
      if (swa != first.*field)
        return Status::error(keys.file().path() + ": key '" + keys.prefix() + suffix +
                             "' = " + std::to_string(swa) + " differs from the other layers' " +
                             std::to_string(first.*field) + "; " +
                             keys.prefix().substr(0, keys.prefix().size() - 1) +
                             " has one head size for every layer (as llama.cpp's graph)");
      continue;
    }
    for (LayerConfig &l : c.layers)
      if (l.sliding) l.*field = swa;
  }
  for (size_t i = 0; i < c.layers.size(); ++i)
    if (c.layers[i].n_rot > c.layers[i].head_dim_k)
      return Status::error(keys.file().path() + ": layer " + std::to_string(i) + " rotates " +
                           std::to_string(c.layers[i].n_rot) + " dims of a head of " +
                           std::to_string(c.layers[i].head_dim_k));
  return ok_status();
}

Status read_per_layer(ConfigReader &keys, const std::string &suffix, int32_t n_layer,
                      std::vector<int32_t> &out, int64_t lo, int64_t hi, bool required) {
  const std::string k = keys.prefix() + suffix;
  auto arr = keys.file().optional_int_array(k);
  if (!arr.ok()) return arr.status();
  if (!*arr) {
    int32_t v = out.empty() ? 0 : out[0];
    OFFGRAPH_TRY(keys.u32(suffix, v, lo, hi, required));
    if (keys.has(suffix)) out.assign(size_t(n_layer), v);
    return ok_status();
  }
  keys.mark_read(suffix);
  if (int64_t((*arr)->size()) != n_layer)
    return Status::error(keys.file().path() + ": key '" + k + "' has " +
                         std::to_string((*arr)->size()) + " entries for " +
                         std::to_string(n_layer) + " layers");
  out.clear();
  for (size_t i = 0; i < (*arr)->size(); ++i) {
    const int64_t v = (**arr)[i];
    if (v < lo || v > hi)
      return Status::error(keys.file().path() + ": key '" + k + "'[" + std::to_string(i) +
                           "] = " + std::to_string(v) + " is outside " + std::to_string(lo) + ".." +
                           std::to_string(hi));
    out.push_back(int32_t(v));
  }
  return ok_status();
}

Status read_rope_scaling(ConfigReader &keys, ModelConfig &c) {
  auto type = keys.str("rope.scaling.type");
  if (!type.ok()) return type.status();
  const std::string t = type->value_or("linear");
  if (t != "linear" && t != "none")
    return Status::error(keys.file().path() + ": key '" + keys.prefix() + "rope.scaling.type' = '" +
                         t + "' is not supported (offgraph applies 'linear' and 'none')");
  float factor = 0.0f; // 0: none, as llama.cpp reads it
  OFFGRAPH_TRY(keys.f32("rope.scaling.factor", factor, 0.0f, 1e6f, false));
  if (factor == 0.0f && !keys.has("rope.scaling.factor")) {
    float old = 0.0f; // the key's old name
    OFFGRAPH_TRY(keys.f32("rope.scale_linear", old, 0.0f, 1e6f, false));
    factor = old;
  } else {
    keys.mark_read("rope.scale_linear");
  }
  if (factor != 0.0f && factor < 1e-6f)
    return Status::error(keys.file().path() + ": rope scaling factor " + std::to_string(factor) +
                         " is too small");
  c.rope_freq_scale = t == "none" || factor == 0.0f ? 1.0f : 1.0f / factor;
  OFFGRAPH_TRY(keys.f32("rope.scaling.attn_factor", c.rope_attn_factor, 0.0f, 1e3f, false));
  // YaRN's keys are inert without YaRN; the original context only feeds YaRN's ranges.
  keys.mark_read("rope.scaling.original_context_length");
  keys.mark_read("rope.scaling.finetuned");
  return ok_status();
}

namespace {

// What llama.cpp's model saver writes for a feature the architecture does not have: its hparams
// defaults, written into every file it saves (test-llama-archs's among them). Each asks for
// nothing; any other value of these keys is refused by the audit. docs/model-files.md.
void set_saver_defaults(ConfigReader &keys) {
  const std::string &p = keys.prefix();
  const double inf = std::numeric_limits<double>::infinity();
  const std::pair<const char *, std::vector<double>> defaults[] = {
      {"attention.causal", {1}},             // false would be an encoder
      {"attention.rope_pattern", {1}},       // per-layer RoPE on/off: 1 = as the arch says
      {"pooling_type", {0, 4294967295.0}},   // none / unspecified: embeddings only
      {"decoder_start_token_id", {-1}},      // encoder-decoder models
      {"attn_logit_softcapping", {0, 50}},   // Gemma 2's attention cap, off unless read
      {"router_logit_softcapping", {0, 30}}, // MoE routers
      {"expert_group_scale", {0, 0.05}},     // MoE groups
      {"expert_weights_scale", {0, 1}},      // MoE
      {"token_shift_count", {0, 2}},         // RWKV
      {"deepstack_mapping", {-1}},           // Qwen3-VL deepstack
      {"kda.gate_lower_bound", {0, -inf}},   // Kimi linear attention
      {"activation.situ_beta", {0, 1}},      // SiTU activation
      {"rope.scaling.attn_factor", {0, 1}},  // a magnitude llama.cpp applies to YaRN only
      {"rope.scaling.yarn_ext_factor", {-1, 0}},
      {"rope.scaling.yarn_attn_factor", {1}},
      {"rope.scaling.yarn_beta_fast", {32}},
      {"rope.scaling.yarn_beta_slow", {1}},
  };
  for (const auto &[suffix, values] : defaults) keys.set_neutral(p + suffix, values);
}

} // namespace

Result<ModelConfig> read_config(const GgufFile &f) {
  ModelConfig c;
  auto arch_name = f.str("general.architecture");
  if (!arch_name.ok()) return arch_name.status();
  c.arch_name = *arch_name;
  const Architecture *arch = find_architecture(c.arch_name);
  if (!arch)
    return Status::error(f.path() + ": architecture '" + c.arch_name +
                         "' is not supported (supported: " + architecture_names() + ")");
  if (auto name = f.str("general.name"); name.ok()) c.name = *name;
  ConfigReader keys(f, c.arch_name + ".");
  constexpr int64_t kBig = int64_t(1) << 24;

  OFFGRAPH_TRY(keys.u32("block_count", c.n_layer, 1, 4096, true));
  OFFGRAPH_TRY(keys.u32("embedding_length", c.n_embd, 1, kBig, true));
  OFFGRAPH_TRY(keys.u32("context_length", c.n_ctx_train, 1, int64_t(1) << 29, true));
  // Head counts and FFN widths: one value, or one per layer (llama.cpp's get_key_or_arr).
  std::vector<int32_t> heads, kv_heads, ff;
  OFFGRAPH_TRY(read_per_layer(keys, "attention.head_count", c.n_layer, heads, 1, 65536, true));
  kv_heads = heads;
  OFFGRAPH_TRY(
      read_per_layer(keys, "attention.head_count_kv", c.n_layer, kv_heads, 1, 65536, false));
  OFFGRAPH_TRY(read_per_layer(keys, "feed_forward_length", c.n_layer, ff, 1, kBig, true));
  // Head sizes and rotation: scalars (the sliding layers' own come from the architecture,
  // read_sliding_shapes).
  int32_t head_dim_k = 0, head_dim_v = 0, n_rot = 0;
  OFFGRAPH_TRY(keys.u32("attention.key_length", head_dim_k, 1, 65536, false));
  OFFGRAPH_TRY(keys.u32("attention.value_length", head_dim_v, 1, 65536, false));
  OFFGRAPH_TRY(keys.u32("rope.dimension_count", n_rot, 2, 65536, false));
  c.layers.resize(size_t(c.n_layer));
  for (int32_t i = 0; i < c.n_layer; ++i) {
    LayerConfig &l = c.layers[size_t(i)];
    l.n_head = heads[size_t(i)], l.n_head_kv = kv_heads[size_t(i)], l.n_ff = ff[size_t(i)];
    if (l.n_head % l.n_head_kv != 0)
      return Status::error(f.path() + ": layer " + std::to_string(i) + ": " +
                           std::to_string(l.n_head) + " attention heads are not a multiple of " +
                           std::to_string(l.n_head_kv) + " KV heads");
    // llama.cpp's default head size: embedding / the first layer's head count, for every layer.
    l.head_dim_k = head_dim_k > 0 ? head_dim_k : c.n_embd / heads[0];
    if (l.head_dim_k < 1)
      return Status::error(f.path() + ": head dim is 0 (embedding_length < head_count)");
    l.head_dim_v = head_dim_v > 0 ? head_dim_v : l.head_dim_k;
    l.n_rot = n_rot > 0 ? n_rot : l.head_dim_k;
    if (l.n_rot > l.head_dim_k)
      return Status::error(f.path() + ": key '" + keys.prefix() +
                           "rope.dimension_count' = " + std::to_string(l.n_rot) +
                           " exceeds the head dim " + std::to_string(l.head_dim_k));
  }
  c.attn_scale = 1.0f / std::sqrt(float(c.layers[0].head_dim_k));
  OFFGRAPH_TRY(keys.f32("attention.layer_norm_rms_epsilon", c.rms_eps, 0.0f, 1.0f, true));
  OFFGRAPH_TRY(keys.f32("rope.freq_base", c.rope_base, 1e-3f, 1e12f, false));
  c.rope_base_swa = c.rope_base;
  c.rope_mode = GGML_ROPE_TYPE_NORMAL;
  set_saver_defaults(keys);

  ggml_tensor *embd = f.tensor("token_embd.weight");
  if (!embd) return Status::error(f.path() + ": tensor 'token_embd.weight' is missing");
  if (embd->ne[0] != c.n_embd || embd->ne[1] < 1 || embd->ne[1] > kBig)
    return Status::error(f.path() + ": tensor 'token_embd.weight' has shape [" +
                         std::to_string(embd->ne[0]) + ", " + std::to_string(embd->ne[1]) +
                         "], expected [" + std::to_string(c.n_embd) + ", n_vocab]");
  c.n_vocab = int32_t(embd->ne[1]);
  int32_t vocab_size = c.n_vocab;
  OFFGRAPH_TRY(keys.u32("vocab_size", vocab_size, 1, kBig, false));
  if (vocab_size != c.n_vocab)
    return Status::error(f.path() + ": key '" + keys.prefix() +
                         "vocab_size' = " + std::to_string(vocab_size) +
                         " but token_embd.weight has " + std::to_string(c.n_vocab) + " rows");

  OFFGRAPH_TRY(arch->read_config(keys, c));
  OFFGRAPH_TRY(keys.audit());
  return c;
}

} // namespace offgraph::model
