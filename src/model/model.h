// Model: a GGUF model loaded for inference. Hyperparameters are validated (config.h), every
// tensor is checked for presence, shape and type against them before any ggml call, and weights
// stay in the file's mapping. The forward graph of each architecture lives in its own file and
// reaches the cache only through kv::Step::update_and_attend.
#pragma once

#include "base/status.h"
#include "cache/geometry.h"
#include "kv/step.h"
#include "model/config.h"
#include "model/gguf_file.h"
#include "model/softcap.h"

#include <memory>
#include <string>
#include <vector>

namespace offgraph::model {

struct LayerWeights {
  ggml_tensor *attn_norm = nullptr, *wq = nullptr, *wk = nullptr, *wv = nullptr, *wo = nullptr;
  ggml_tensor *ffn_norm = nullptr, *ffn_gate = nullptr, *ffn_up = nullptr, *ffn_down = nullptr;
  // Muse Glimmer only.
  ggml_tensor *attn_gate = nullptr, *q_norm = nullptr, *k_norm = nullptr;
  ggml_tensor *post_attn_norm = nullptr, *post_ffn_norm = nullptr;
};

struct Weights {
  ggml_tensor *tok_embd = nullptr, *output_norm = nullptr, *output = nullptr;
  ggml_tensor *rope_freqs = nullptr; // Llama 3.1 frequency factors, optional
  std::vector<LayerWeights> layers;
};

class Model {
public:
  // Opens, validates and maps a model; `progress` sees the bytes read in.
  static Result<std::unique_ptr<Model>> load(const std::string &path,
                                             const Progress &progress = nullptr);
  // Opens and validates metadata and tensor infos only (the file may hold no weights).
  static Result<std::unique_ptr<Model>> open_metadata(const std::string &path);

  const ModelConfig &config() const { return config_; }
  const GgufFile &file() const { return *file_; }
  const Weights &weights() const { return weights_; }
  // The final soft-cap's constants (cap 0: none), where graphs' softcap ops read them.
  const SoftcapParams *softcap() const { return &softcap_; }
  Result<cache::Geometry> geometry() const;
  int64_t n_params() const;

private:
  std::unique_ptr<GgufFile> file_;
  ModelConfig config_;
  Weights weights_;
  SoftcapParams softcap_;
};

// The tokens of one forward pass: spans of consecutive tokens, each continuing one sequence.
struct Batch {
  struct Span {
    kv::SeqId seq = 0;
    int32_t position = 0; // the sequence's length
    int32_t n_tokens = 0;
  };
  std::vector<int32_t> tokens; // all spans' tokens, span after span
  std::vector<Span> spans;
  std::vector<int32_t> logit_rows; // indices into tokens whose logits are wanted, ascending
};

// Graph inputs the runner fills after allocation.
struct GraphInputs {
  ggml_tensor *tokens = nullptr;     // I32 [n_tokens]
  ggml_tensor *positions = nullptr;  // I32 [n_tokens]
  ggml_tensor *logit_rows = nullptr; // I32 [n_rows]
};

// Builds the forward graph of `batch` (whose spans were declared to `step` in order, as span
// indices 0..n-1) and returns the logits [n_vocab, n_rows].
Result<ggml_tensor *> build_forward(const Model &model, ggml_context *ctx, const Batch &batch,
                                    const GraphInputs &in, kv::Step &step);

// Per-architecture builders (muse_glimmer.cpp, llama.cpp), behind build_forward.
Result<ggml_tensor *> build_muse_glimmer(const Model &model, ggml_context *ctx, const Batch &batch,
                                         const GraphInputs &in, kv::Step &step);
Result<ggml_tensor *> build_llama(const Model &model, ggml_context *ctx, const Batch &batch,
                                  const GraphInputs &in, kv::Step &step);

// Attention for every span of the batch at one layer: q [D_k, H_q, n_tokens], k and v
// [D, H_kv, n_tokens] -> [D_v * H_q, n_tokens]. The only place model code touches the cache.
Result<ggml_tensor *> attend_spans(ggml_context *ctx, const Batch &batch, kv::Step &step,
                                   ggml_tensor *q, ggml_tensor *k, ggml_tensor *v,
                                   cache::CacheId cache, float scale);

} // namespace offgraph::model
