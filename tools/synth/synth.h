// Model generator: writes GGUF files of the supported architectures with the keys, tensor names,
// shapes and types of the published files, seeded random weights at scales that keep activations
// realistic, a real vocabulary copied from a vocab-only GGUF, and a real chat template.
#pragma once

#include "base/status.h"

#include "ggml.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace offgraph::synth {

struct SynthSpec {
  std::string arch = "muse-glimmer"; // or "llama"
  std::string name = "offgraph-synth";
  int32_t n_layer = 4, n_embd = 64, n_head = 4, n_head_kv = 2, head_dim = 16, n_ff = 128;
  int32_t n_ctx = 4096;
  int32_t window = 16;        // muse-glimmer: sliding window
  bool pattern_array = false; // muse-glimmer: write sliding_window_pattern as a bool array
  int32_t pattern_period = 4; // ... or as this scalar period
  // gemma4: sliding layers' head size and KV heads (0: as the global ones), the last layers that
  // read a donor's KV, the per-layer embedding width, and whether global layers have a V
  // projection (without, V = K) and the head its own tensor (without, tied to the embedding).
  int32_t head_dim_swa = 0, n_head_kv_swa = 0, n_kv_shared = 0, n_embd_per_layer = 0;
  bool global_v = true, own_head = false;
  bool double_wide_shared = false;       // gemma4: the shared layers' FFN twice as wide
  ggml_type weight_type = GGML_TYPE_F32; // matrices and the embedding; norms stay f32
  uint64_t seed = 1;
  std::string vocab_path;     // a vocab-only GGUF whose tokenizer.* keys are copied
  int32_t n_vocab = 0;        // without a vocabulary: this many tokens, no tokenizer keys
  std::string template_path;  // the chat template to embed, if any
  bool metadata_only = false; // write keys and tensor infos, no weights
};

// Named presets, sizes with the 128K-token llama-bpe vocabulary; gemma4 has its own ("e2b",
// "e4b", "31b": those files' shapes at test widths; "e2b-bench", "31b-bench": at benchmark widths,
// q8_0; see synth.cpp): "tiny" (17M parameters, f32,
// 66 MB; 18 MB as q8_0), "small" (q8_0), "0.4b" (f16, ~0.8 GB), "1b" (q8_0, ~1.2 GB), "30b" (the
// real Muse Glimmer hyperparameters, 27.85B parameters; metadata only).
Result<SynthSpec> preset(const std::string &name, const std::string &arch);
std::vector<std::string> preset_names();

// Writes the file; `progress(done, total)` sees bytes of tensor data written. Returns a summary.
Result<std::string> write_model(const SynthSpec &spec, const std::string &path,
                                const std::function<void(uint64_t, uint64_t)> &progress = nullptr);

} // namespace offgraph::synth
