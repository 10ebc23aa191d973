// Model: a GGUF model loaded for inference. Hyperparameters are validated (config.h), every
// tensor is checked for presence, shape and type against them before any ggml call, and weights
// stay in host memory as weight_memory.h chooses (anonymous huge pages or the file's mapping). The
// forward graph of each architecture lives in its own file and reaches the cache only through
// kv::Step::update_and_attend.
#pragma once

#include "base/status.h"
#include "cache/geometry.h"
#include "kv/step.h"
#include "model/config.h"
#include "model/devices.h"
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
  // Opens, validates and loads a model; `progress` sees the bytes read in. With `devices`, the
  // weights of the layers the split puts on another device are uploaded there
  // (`device_progress` sees each device's bytes) and the file stays mapped; with every layer on
  // the CPU the weights go where choose_weight_storage says (weight_memory.h). An anonymous copy
  // that cannot be allocated falls back to the mapping.
  using DeviceProgress =
      std::function<void(const std::string &device, uint64_t done, uint64_t total)>;
  static Result<std::unique_ptr<Model>> load(const std::string &path,
                                             const Progress &progress = nullptr,
                                             std::shared_ptr<const Devices> devices = nullptr,
                                             const DeviceProgress &device_progress = nullptr);
  // Opens and validates metadata and tensor infos only (the file may hold no weights).
  static Result<std::unique_ptr<Model>> open_metadata(const std::string &path);

  const ModelConfig &config() const { return config_; }
  const GgufFile &file() const { return *file_; }
  // Where the weights live in host memory and why (model/weight_memory.h), for logs.
  const std::string &weight_storage() const { return weight_storage_; }
  const Weights &weights() const { return weights_; }
  // The final soft-cap's constants (cap 0: none), where graphs' softcap ops read them.
  const SoftcapParams *softcap() const { return &softcap_; }
  // Which cache each layer reads and writes; graphs ask it, never assume layer i = cache i.
  const cache::Geometry &geometry() const { return geometry_; }
  const Architecture &architecture() const { return *arch_; }
  int64_t n_params() const;
  // Bytes of every weight tensor the file holds, wherever they live.
  int64_t weight_bytes() const;

  // Where the layers run: the devices, and per layer (then the output head, entry n_layer) the
  // index of its device. The CPU alone unless loaded with devices.
  const Devices &devices() const { return *devices_; }
  std::shared_ptr<const Devices> shared_devices() const { return devices_; }
  int32_t layer_device(int32_t layer) const { return layer_device_.at(size_t(layer)); }
  int32_t output_device() const { return layer_device_.back(); }
  // Per cache id: the buffer type of its owning layer's device (kv::KvStore::create).
  std::vector<ggml_backend_buffer_type_t> cache_buffer_types() const;
  // Bytes of weights each device holds: those uploaded to it; for the CPU, the file's tensors it
  // still reads (every one not uploaded, and the token embedding, which the input lookup reads
  // there even where a tied head was uploaded).
  std::vector<int64_t> device_weight_bytes() const;

private:
  Status place(const DeviceProgress &progress);

  std::unique_ptr<GgufFile> file_;
  std::string weight_storage_;
  const Architecture *arch_ = nullptr;
  ModelConfig config_;
  Weights weights_;
  SoftcapParams softcap_;
  cache::Geometry geometry_;
  std::shared_ptr<const Devices> devices_ = Devices::cpu_only();
  std::vector<int32_t> layer_device_;
  int64_t host_released_bytes_ = 0; // mapped tensors uploaded that the CPU no longer reads
  // The weights uploaded to other devices: one context and buffer per device.
  std::vector<ggml_context_ptr> device_ctx_;
  std::vector<std::pair<int32_t, ggml_backend_buffer_ptr>> device_buffers_; // (device, buffer)
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
  // Rows whose input is an embedding instead of a token's (image rows: the vision encoder's
  // output, vision_encoder.h): indices into tokens, ascending, and their rows (n_embd floats
  // each, row after row). The tokens at those indices are not looked up (any value, e.g. an id
  // that keys the row for prefix reuse). Each architecture's input handling (its first norm)
  // applies to these rows as to token rows.
  std::vector<int32_t> embedding_at = {};
  std::vector<float> embeddings = {};
};

// Graph inputs the runner fills after allocation.
struct GraphInputs {
  ggml_tensor *tokens = nullptr;       // I32 [n_tokens]
  ggml_tensor *positions = nullptr;    // I32 [n_tokens]
  ggml_tensor *logit_rows = nullptr;   // I32 [n_rows]
  ggml_tensor *embedding_at = nullptr; // I64 [n_embedding_rows], or null
  ggml_tensor *embeddings = nullptr;   // F32 [n_embd, n_embedding_rows], or null
};

// Builds the forward graph of `batch` (whose spans were declared to `step` in order, as span
// indices 0..n-1) and returns the logits [n_vocab, n_rows]; `hidden` gets the tensors of
// batch.hidden_layers' inputs [n_embd, n_tokens], in order.
Result<ggml_tensor *> build_forward(const Model &model, ggml_context *ctx, const Batch &batch,
                                    const GraphInputs &in, kv::Step &step,
                                    std::vector<ggml_tensor *> *hidden = nullptr);

} // namespace offgraph::model
