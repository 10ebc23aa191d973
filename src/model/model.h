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
#include "model/weights.h"

#include <memory>
#include <string>
#include <vector>

namespace offgraph::model {

struct Architecture;

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
  // Which cache each layer reads and writes; graphs ask it, never assume layer i = cache i.
  const cache::Geometry &geometry() const { return geometry_; }
  const Architecture &architecture() const { return *arch_; }
  int64_t n_params() const;

private:
  std::unique_ptr<GgufFile> file_;
  const Architecture *arch_ = nullptr;
  ModelConfig config_;
  Weights weights_;
  SoftcapParams softcap_;
  cache::Geometry geometry_;
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
  // Layers whose input is wanted for every token beside the logits, ascending in [0, n_layer):
  // the residual stream after the layers before (layer 0's: the embedded tokens). What a drafter
  // conditioned on the target's hidden states reads (docs/speculative.md, DFlash).
  std::vector<int32_t> hidden_layers = {};
};

// Graph inputs the runner fills after allocation.
struct GraphInputs {
  ggml_tensor *tokens = nullptr;     // I32 [n_tokens]
  ggml_tensor *positions = nullptr;  // I32 [n_tokens]
  ggml_tensor *logit_rows = nullptr; // I32 [n_rows]
};

// Builds the forward graph of `batch` (whose spans were declared to `step` in order, as span
// indices 0..n-1) and returns the logits [n_vocab, n_rows]; `hidden` gets the tensors of
// batch.hidden_layers' inputs [n_embd, n_tokens], in order.
Result<ggml_tensor *> build_forward(const Model &model, ggml_context *ctx, const Batch &batch,
                                    const GraphInputs &in, kv::Step &step,
                                    std::vector<ggml_tensor *> *hidden = nullptr);

} // namespace offgraph::model
