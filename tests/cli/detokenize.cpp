// detokenize MODEL ID...: the text of token ids as `offgraph run` prints a generation (the model's
// tokenizer, control tokens not rendered, nothing from the first end-of-generation id on). For
// tests that compare run's text with `offgraph logits --greedy` picks.
#include "text/tokenizer/tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <string>

int main(int argc, char **argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: detokenize MODEL ID...\n");
    return 2;
  }
  auto tok = offgraph::text::Tokenizer::from_gguf(argv[1]);
  if (!tok.ok()) {
    std::fprintf(stderr, "detokenize: %s\n", tok.message().c_str());
    return 1;
  }
  const std::vector<int32_t> stops = (*tok)->end_of_generation_ids();
  offgraph::text::Detokenizer detok(**tok);
  std::string text;
  for (int i = 2; i < argc; ++i) {
    int32_t id = 0;
    try {
      id = std::stoi(argv[i]);
    } catch (...) {
      std::fprintf(stderr, "detokenize: '%s' is not a token id\n", argv[i]);
      return 1;
    }
    if (id < 0 || id >= (*tok)->n_vocab()) {
      std::fprintf(stderr, "detokenize: %d is outside the vocabulary\n", id);
      return 1;
    }
    if (std::find(stops.begin(), stops.end(), id) != stops.end()) break;
    text += detok.feed(id);
  }
  text += detok.flush();
  std::fputs(text.c_str(), stdout);
  return 0;
}
