// What synth's writers share: the tensors of a file to be (their names, shapes, types and how
// their values are drawn) and the writer of a GGUF from its keys and such a plan.
#pragma once

#include "base/status.h"

#include "ggml.h"
#include "gguf.h"

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace offgraph::synth {

struct TensorPlan {
  std::string name;
  std::array<int64_t, 4> ne; // ggml order; trailing 1s for fewer dimensions
  ggml_type type;
  enum Init { Normal, Gain, Constant } init;
  float scale;                    // std-dev (Normal), spread (Gain) or value (Constant)
  int n_dims = 2;                 // as written (1 for vectors)
  std::vector<float> values = {}; // exact values instead of draws (f32 vectors: rope_freqs)
};

inline TensorPlan vector_plan(std::string name, int64_t n, TensorPlan::Init init, float scale) {
  return {std::move(name), {n, 1, 1, 1}, GGML_TYPE_F32, init, scale, 1};
}
inline TensorPlan matrix_plan(std::string name, int64_t ne0, int64_t ne1, ggml_type type,
                              TensorPlan::Init init, float scale) {
  return {std::move(name), {ne0, ne1, 1, 1}, type, init, scale, 2};
}

// The type a matrix gets: the requested one when its rows are whole blocks, else the best that
// fits (as llama.cpp's quantizer falls back).
ggml_type fit(ggml_type want, int64_t ne0);

// Adds the plan's tensors to `keys` (which holds the metadata) and writes the file; values are
// seeded normal draws (or constants), written in the plan's order. `n_params` and `bytes` get
// the totals. With `metadata_only`, the tensor data is left out.
Status write_gguf(gguf_context *keys, const std::vector<TensorPlan> &plan, const std::string &path,
                  bool metadata_only, uint64_t seed,
                  const std::function<void(uint64_t, uint64_t)> &progress, uint64_t &n_params,
                  uint64_t &bytes);

} // namespace offgraph::synth
