// ModelConfig: the hyperparameters of a GGUF model, read and checked key by key. Everything the
// cache needs (which layers slide, the window, KV heads and dims) comes from here, never from
// code constants.
#pragma once

#include "base/status.h"
#include "cache/geometry.h"
#include "model/gguf_file.h"

#include <cstdint>
#include <string>
#include <vector>

namespace offgraph::model {

enum class Arch { MuseGlimmer, Llama };

struct ModelConfig {
  Arch arch = Arch::Llama;
  std::string arch_name; // general.architecture
  std::string name;      // general.name, if any
  int32_t n_vocab = 0, n_embd = 0, n_layer = 0, n_head = 0, n_head_kv = 0;
  int32_t head_dim_k = 0, head_dim_v = 0, n_ff = 0, n_ctx_train = 0, n_rot = 0;
  float rms_eps = 1e-5f;
  float post_norm_eps = 1e-8f; // Muse Glimmer's post-attention and post-FFN norms (no GGUF key)
  float rope_base = 10000.0f, rope_base_swa = 10000.0f;
  int32_t window = 0;        // sliding window of the sliding layers (0: none)
  std::vector<bool> sliding; // per layer
  float logit_scale = 1.0f;
  float softcap = 0.0f;    // final logit soft-cap (0: none)
  float attn_scale = 1.0f; // softmax scale, 1/sqrt(head_dim_k)

  int32_t n_sliding() const;
  // One cache layer description per model layer (no KV sharing in these architectures).
  std::vector<cache::LayerSpec> layer_specs() const;
  std::string describe() const;
};

// Reads and validates the hyperparameters (architecture known, required keys present with the
// right types, values in range). The vocabulary size comes from token_embd.weight.
Result<ModelConfig> read_config(const GgufFile &file);

} // namespace offgraph::model
