// The llama.cpp side of the tokenizer comparison: loads a vocabulary (any GGUF; vocab only) with
// libllama from the pinned tree and tokenizes texts in llama.cpp's test-vector format (texts
// separated by "\n__ggml_vocab_test__\n"), writing one line of ids per text, as the pinned tree's
// `.out` files are written.
//
//   peer_tokenize VOCAB.gguf IN.inp OUT.out [--add-special] [--parse-special]
#include "llama.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

int main(int argc, char **argv) {
  if (argc < 4)
    return std::fprintf(stderr, "usage: peer_tokenize VOCAB IN OUT [--add-special] "
                                "[--parse-special]\n"),
           2;
  bool add_special = false, parse_special = false;
  for (int i = 4; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--add-special"))
      add_special = true;
    else if (!std::strcmp(argv[i], "--parse-special"))
      parse_special = true;
    else
      return std::fprintf(stderr, "peer_tokenize: unknown option %s\n", argv[i]), 2;
  }
  llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.vocab_only = true;
  llama_model *model = llama_model_load_from_file(argv[1], mp);
  if (!model) return std::fprintf(stderr, "peer_tokenize: cannot load %s\n", argv[1]), 1;
  const llama_vocab *vocab = llama_model_get_vocab(model);

  std::ifstream in(argv[2], std::ios::binary);
  std::stringstream raw;
  raw << in.rdbuf();
  const std::string all = raw.str(), sep = "\n__ggml_vocab_test__\n";
  std::ofstream out(argv[3], std::ios::binary);
  for (size_t pos = 0; pos <= all.size();) {
    size_t next = all.find(sep, pos);
    if (next == std::string::npos) next = all.size();
    const std::string text = all.substr(pos, next - pos);
    std::vector<llama_token> ids(text.size() + 8);
    const int n = llama_tokenize(vocab, text.c_str(), int32_t(text.size()), ids.data(),
                                 int32_t(ids.size()), add_special, parse_special);
    if (n < 0) return std::fprintf(stderr, "peer_tokenize: tokenization failed\n"), 1;
    for (int i = 0; i < n; ++i) out << (i ? " " : "") << ids[size_t(i)];
    out << "\n";
    if (next == all.size()) break;
    pos = next + sep.size();
  }
  llama_model_free(model);
  return out.good() ? 0 : 1;
}
