// ModelConfig: the hyperparameters of a GGUF model, read and checked key by key. Everything the
// cache needs (which layers slide, the window, KV heads and dims) comes from here, never from
// code constants. ConfigReader records which keys were read, so that a key no reader honours is
// refused with its value unless it states the neutral value (docs/model-files.md).
#pragma once

#include "base/status.h"
#include "cache/geometry.h"
#include "model/gguf_file.h"

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace offgraph::model {

// ggml_rope_ext's parameters that a file can set (the YaRN ones stay off: YaRN is refused).
struct RopeParams {
  int32_t n_rot = 0;        // rotated dims per head (rope.dimension_count[_swa])
  int mode = 0;             // GGML_ROPE_TYPE_NORMAL (adjacent pairs) or _NEOX (halves)
  float base = 10000.0f;    // rope.freq_base (rope.freq_base_swa on sliding layers)
  float freq_scale = 1.0f;  // 1 / rope.scaling.factor (linear scaling)
  float attn_factor = 1.0f; // rope.scaling.attn_factor: multiplies cos and sin (as llama.cpp)
  int32_t n_ctx_orig = 0;   // the training context; only YaRN, which is refused, reads it
};

// One layer's shape. Architectures whose layers differ (Gemma 4: per-kind head sizes and
// rotation, per-layer KV heads and FFN widths) set these per layer; the others repeat the
// file's scalar keys. The cache geometry is built from them (layer_specs).
struct LayerConfig {
  bool sliding = false;
  int32_t n_head = 0, n_head_kv = 0, head_dim_k = 0, head_dim_v = 0, n_rot = 0, n_ff = 0;

  // Projection widths: q (and an attention gate), k, v, and the attention output's input.
  int64_t q_width() const { return int64_t(n_head) * head_dim_k; }
  int64_t k_width() const { return int64_t(n_head_kv) * head_dim_k; }
  int64_t v_width() const { return int64_t(n_head_kv) * head_dim_v; }
  int64_t o_width() const { return int64_t(n_head) * head_dim_v; }
};

struct ModelConfig {
  std::string arch_name; // general.architecture
  std::string name;      // general.name, if any
  int32_t n_vocab = 0, n_embd = 0, n_layer = 0, n_ctx_train = 0;
  std::vector<LayerConfig> layers; // n_layer of them
  // The last n layers read the KV of a donor instead of writing their own (Geometry::build).
  int32_t n_kv_shared_layers = 0;
  int32_t n_embd_per_layer = 0; // Gemma 4's per-layer embedding width (0: none)
  float rms_eps = 1e-5f;
  float post_norm_eps = 1e-8f; // Muse Glimmer's post-attention and post-FFN norms (no GGUF key)
  int rope_mode = 0;           // GGML_ROPE_TYPE_NORMAL unless the architecture says otherwise
  float rope_base = 10000.0f, rope_base_swa = 10000.0f;
  float rope_freq_scale = 1.0f;  // 1 / rope.scaling.factor
  float rope_attn_factor = 1.0f; // rope.scaling.attn_factor
  int32_t window = 0;            // sliding window of the sliding layers (0: none)
  float logit_scale = 1.0f;
  float softcap = 0.0f;    // final logit soft-cap (0: none)
  float attn_scale = 1.0f; // softmax scale, 1/sqrt(head_dim_k) unless the architecture says

  const LayerConfig &layer(int32_t i) const { return layers.at(size_t(i)); }
  bool sliding(int32_t i) const { return layer(i).sliding; }
  int32_t n_sliding() const;
  // RoPE of layer i (its kind's base, its n_rot).
  RopeParams rope(int32_t layer) const;
  // One cache layer description per model layer.
  std::vector<cache::LayerSpec> layer_specs() const;
  std::string describe() const;
};

// Reads typed keys under the architecture's prefix ("muse-glimmer.") and remembers each key it
// was asked for, present or not; audit() then judges every key of the file.
class ConfigReader {
public:
  ConfigReader(const GgufFile &file, std::string prefix) : f_(file), p_(std::move(prefix)) {}
  const GgufFile &file() const { return f_; }
  const std::string &prefix() const { return p_; }

  // `<prefix><suffix>` as an integer or float within [lo, hi]; absent and not required: `out`
  // keeps its default.
  Status u32(const std::string &suffix, int32_t &out, int64_t lo, int64_t hi, bool required);
  Status f32(const std::string &suffix, float &out, float lo, float hi, bool required);
  Result<std::optional<std::string>> str(const std::string &suffix);
  Result<std::optional<std::vector<bool>>> bool_array(const std::string &suffix);
  bool has(const std::string &suffix) const { return f_.has(p_ + suffix); }
  // Keys the reader honours in a way of its own (read by other code, or checked against
  // another key): counted as read.
  void mark_read(const std::string &suffix) { read_.insert(p_ + suffix); }
  // The values that make a key ask for nothing when they are not 0 / false / "" (a
  // multiplier of 1, attention.causal true); they replace that default.
  void set_neutral(const std::string &key, std::vector<double> values) {
    neutral_[key] = std::move(values);
  }

  // Every key of the file is read, of a namespace with its own reader (general., tokenizer.,
  // quantize.), or states a neutral value (0, false, "", or set_neutral's; for an array, every
  // element): it then asks for nothing. Any other key is refused with its value.
  Status audit() const;

private:
  std::string key(const std::string &suffix) {
    read_.insert(p_ + suffix);
    return p_ + suffix;
  }

  const GgufFile &f_;
  std::string p_;
  std::set<std::string> read_;
  std::map<std::string, std::vector<double>> neutral_;
};

// `<prefix><suffix>` as one value for every layer or a per-layer array (llama.cpp's
// get_key_or_arr), each within [lo, hi]; absent and not required: `out` is left alone.
Status read_per_layer(ConfigReader &keys, const std::string &suffix, int32_t n_layer,
                      std::vector<int32_t> &out, int64_t lo, int64_t hi, bool required);

// The sliding layers' head sizes and rotation (attention.key_length_swa, value_length_swa,
// rope.dimension_count_swa), once the architecture has said which layers slide. `per_kind`:
// they apply to the sliding layers (Gemma 4); otherwise a value other than the other layers' is
// refused, for an architecture whose graph has one head size.
Status read_sliding_shapes(ConfigReader &keys, ModelConfig &c, bool per_kind);
// Every layer has layer 0's heads, KV heads, FFN width and head sizes, or an error naming the
// first that differs (architectures whose llama.cpp graph reads them once).
Status same_shape_on_every_layer(const ConfigReader &keys, const ModelConfig &c);

// RoPE scaling as llama.cpp reads it (rope.scaling.type linear, its default, or none; YaRN and
// LongRoPE are refused with the value; rope.scaling.factor divides the frequencies, none or 0
// meaning 1; rope.scaling.attn_factor scales cos and sin), into c.rope_freq_scale and
// c.rope_attn_factor. Each architecture calls it from its read_config.
Status read_rope_scaling(ConfigReader &keys, ModelConfig &c);

// A key's value as an error message shows it ("2.5", "'yarn'", "[4 x u32: 1, 0, 1, 0]").
std::string describe_value(const gguf_context *ctx, int64_t key_id);

// Reads and validates the hyperparameters (architecture known, required keys present with the
// right types, values in range, every key honoured or neutral). The vocabulary size comes from
// token_embd.weight.
Result<ModelConfig> read_config(const GgufFile &file);

} // namespace offgraph::model
