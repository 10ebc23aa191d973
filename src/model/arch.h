// The architectures offgraph runs, one table row each (architectures.cpp). Each lives in its own
// file (`<arch>.cpp`) with its three parts: the keys of its own it reads, the tensors it binds,
// and its forward graph. Adding one is a new file and a row (model/README.md).
#pragma once

#include "model/config.h"

#include <span>
#include <string>
#include <string_view>

struct ggml_tensor;

namespace offgraph::model {

class GraphBuilder;
class TensorBinder;
struct Weights;

// Sampling the model's authors recommend (Muse Glimmer: MUSE_GLIMMER.md section 11; Gemma 4:
// its generation_config.json), the defaults of a request that sets none of these.
struct RecommendedSampling {
  float temperature, top_p;
  int32_t top_k;
  float min_p;
};

struct Architecture {
  std::string_view name; // general.architecture
  // nullptr: the generic defaults (sample::SamplingParams).
  const RecommendedSampling *sampling;
  // After the keys every architecture shares (read_config): the architecture's own.
  Status (*read_config)(ConfigReader &keys, ModelConfig &c);
  // Binds every tensor the graph reads; tensors left unbound make the file refused.
  Status (*bind_weights)(TensorBinder &binder, const ModelConfig &c, Weights &w);
  Result<ggml_tensor *> (*build_graph)(const GraphBuilder &g);
};

std::span<const Architecture *const> architectures();
// The row for `name`, or nullptr.
const Architecture *find_architecture(std::string_view name);
// "muse-glimmer, llama": for messages.
std::string architecture_names();

// The rows, defined in their architectures' files.
extern const Architecture kMuseGlimmer;
extern const Architecture kLlama;
extern const Architecture kGemma4;

} // namespace offgraph::model
