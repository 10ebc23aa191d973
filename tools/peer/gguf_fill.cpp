// Copies a GGUF, changing what the rules say: REGEX=VALUE sets every element of the f32 tensors
// whose names match, REGEX*=VALUE multiplies them, key:NAME=VALUE sets an f32 key and
// key:NAME='TEXT' a string key. The peer corpus uses it to neutralise (set to 1) the per-tensor
// scales that llama.cpp's muse-glimmer graph loads but does not apply, so that both sides compute
// one model, to fold a scale into its weight for the test that offgraph applies the scales, and to
// set RoPE scaling keys. Every tensor rule must match at least one tensor.
//
//   gguf_fill IN OUT RULE ...   e.g. 'blk\.[0-9]+\.ffn_up\.scale=1'
//   'blk\.[0-9]+\.ffn_up\.weight*=1.5'
//                                    key:llama.rope.scaling.factor=4
#include "ggml.h"
#include "gguf.h"

#include <cstdio>
#include <cstdlib>
#include <regex>
#include <string>
#include <vector>

namespace {

struct Rule {
  std::string text;
  std::regex names;
  float value = 0;
  bool multiply = false;
  int matched = 0;
};

bool parse_float(const std::string &s, float &out) {
  char *end = nullptr;
  out = std::strtof(s.c_str(), &end);
  return !s.empty() && end == s.c_str() + s.size();
}

} // namespace

int main(int argc, char **argv) {
  if (argc < 4) return std::fprintf(stderr, "usage: gguf_fill IN OUT RULE ...\n"), 2;
  std::vector<Rule> rules;
  std::vector<std::pair<std::string, std::string>> keys; // name, value
  for (int i = 3; i < argc; ++i) {
    const std::string a = argv[i];
    const size_t eq = a.rfind('=');
    if (eq == std::string::npos || eq == 0)
      return std::fprintf(stderr, "gguf_fill: rule '%s' has no NAME=VALUE\n", argv[i]), 2;
    if (a.rfind("key:", 0) == 0) {
      keys.emplace_back(a.substr(4, a.find('=') - 4), a.substr(a.find('=') + 1));
      continue;
    }
    Rule r;
    r.text = a;
    r.multiply = a[eq - 1] == '*';
    r.names = std::regex(a.substr(0, r.multiply ? eq - 1 : eq));
    if (!parse_float(a.substr(eq + 1), r.value))
      return std::fprintf(stderr, "gguf_fill: '%s' is not a number\n", a.c_str() + eq + 1), 2;
    rules.push_back(std::move(r));
  }
  ggml_context *data = nullptr;
  gguf_init_params params{false, &data};
  gguf_context *g = gguf_init_from_file(argv[1], params);
  if (!g) return std::fprintf(stderr, "gguf_fill: cannot read %s\n", argv[1]), 1;
  // A new context with the same keys and the tensors of `data` in the file's order.
  gguf_context *out = gguf_init_empty();
  gguf_set_kv(out, g);
  for (const auto &[name, value] : keys) {
    float f = 0;
    if (value.size() >= 2 && value.front() == '\'' && value.back() == '\'')
      gguf_set_val_str(out, name.c_str(), value.substr(1, value.size() - 2).c_str());
    else if (parse_float(value, f))
      gguf_set_val_f32(out, name.c_str(), f);
    else
      return std::fprintf(stderr, "gguf_fill: key value '%s' is neither a number nor 'text'\n",
                          value.c_str()),
             2;
  }
  int filled = 0;
  for (int64_t i = 0; i < gguf_get_n_tensors(g); ++i) {
    ggml_tensor *t = ggml_get_tensor(data, gguf_get_tensor_name(g, i));
    gguf_add_tensor(out, t);
    for (Rule &r : rules) {
      if (!std::regex_match(ggml_get_name(t), r.names)) continue;
      if (t->type != GGML_TYPE_F32)
        return std::fprintf(stderr, "gguf_fill: %s is not f32\n", ggml_get_name(t)), 1;
      float *x = static_cast<float *>(t->data);
      for (int64_t j = 0; j < ggml_nelements(t); ++j) x[j] = r.multiply ? x[j] * r.value : r.value;
      ++r.matched;
      ++filled;
      break; // the first matching rule decides
    }
  }
  for (const Rule &r : rules)
    if (r.matched == 0)
      return std::fprintf(stderr, "gguf_fill: rule '%s' matched no tensor\n", r.text.c_str()), 1;
  if (!gguf_write_to_file(out, argv[2], false))
    return std::fprintf(stderr, "gguf_fill: cannot write %s\n", argv[2]), 1;
  std::printf("gguf_fill: %d tensors and %zu keys changed\n", filled, keys.size());
  gguf_free(out);
  gguf_free(g);
  ggml_free(data);
  return 0;
}
