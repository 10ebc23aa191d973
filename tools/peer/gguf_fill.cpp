// Copies a GGUF, setting (REGEX=VALUE) or multiplying (REGEX*=VALUE) every element of the f32
// tensors whose names match a regular expression: the peer corpus uses it to neutralise (set to
// 1) the per-tensor scales that llama.cpp's muse-glimmer graph loads but does not apply, so that
// both sides compute one model, and to fold a scale into its weight for the test that offgraph
// applies the scales.
//
//   gguf_fill IN OUT RULE ...      e.g. 'blk\.[0-9]+\.ffn_up\.scale=1'
//   'blk\.[0-9]+\.ffn_up\.weight*=1.5'
#include "ggml.h"
#include "gguf.h"

#include <cstdio>
#include <cstdlib>
#include <regex>
#include <string>
#include <utility>
#include <vector>

int main(int argc, char **argv) {
  if (argc < 4) return std::fprintf(stderr, "usage: gguf_fill IN OUT REGEX=VALUE ...\n"), 2;
  struct Rule {
    std::regex names;
    float value;
    bool multiply;
  };
  std::vector<Rule> rules;
  for (int i = 3; i < argc; ++i) {
    const std::string a = argv[i];
    const size_t eq = a.rfind('=');
    if (eq == std::string::npos)
      return std::fprintf(stderr, "gguf_fill: '%s' has no '='\n", argv[i]), 2;
    const bool multiply = eq > 0 && a[eq - 1] == '*';
    rules.push_back({std::regex(a.substr(0, multiply ? eq - 1 : eq)),
                     std::strtof(a.c_str() + eq + 1, nullptr), multiply});
  }
  ggml_context *data = nullptr;
  gguf_init_params params{false, &data};
  gguf_context *g = gguf_init_from_file(argv[1], params);
  if (!g) return std::fprintf(stderr, "gguf_fill: cannot read %s\n", argv[1]), 1;
  // A new context with the same keys and the tensors of `data` in the file's order.
  gguf_context *out = gguf_init_empty();
  gguf_set_kv(out, g);
  int filled = 0;
  for (int64_t i = 0; i < gguf_get_n_tensors(g); ++i) {
    ggml_tensor *t = ggml_get_tensor(data, gguf_get_tensor_name(g, i));
    gguf_add_tensor(out, t);
    for (const Rule &r : rules)
      if (std::regex_match(ggml_get_name(t), r.names)) {
        if (t->type != GGML_TYPE_F32)
          return std::fprintf(stderr, "gguf_fill: %s is not f32\n", ggml_get_name(t)), 1;
        float *x = static_cast<float *>(t->data);
        for (int64_t j = 0; j < ggml_nelements(t); ++j)
          x[j] = r.multiply ? x[j] * r.value : r.value;
        ++filled;
        break;
      }
  }
  if (!gguf_write_to_file(out, argv[2], false))
    return std::fprintf(stderr, "gguf_fill: cannot write %s\n", argv[2]), 1;
  std::printf("gguf_fill: %d tensors filled\n", filled);
  gguf_free(out);
  gguf_free(g);
  ggml_free(data);
  return filled > 0 ? 0 : 1;
}
