// The llama.cpp side of the peer comparison: loads a GGUF with libllama from the pinned tree,
// feeds the same prompt in the same chunks, decodes greedily, and writes every logits row in the
// format of `offgraph logits -o` (logits_file.h). Built only against the cached peer build.
//
//   peer_logits -m FILE --random N --seed S --chunk C --greedy G --ctk f32 --ctv f32 -o OUT
#include "llama_reference.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

// llama.cpp's pieces may end or start mid-character; a client must only ever see valid UTF-8.
// Replaces each maximal ill-formed subpart by U+FFFD (Unicode 15 §3.9, Table 3-7 ranges).
std::string sanitize_utf8(const std::string &s) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    int need = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c < 0x80)
      need = 0;
    else if (c >= 0xC2 && c <= 0xDF)
      need = 1;
    else if (c >= 0xE0 && c <= 0xEF)
      need = 2, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4)
      need = 3, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    else
      need = -1;
    if (need < 0) {
      out += "\xEF\xBF\xBD";
      ++i;
      continue;
    }
    size_t j = 1;
    for (; j <= size_t(need) && i + j < s.size(); ++j) {
      const unsigned char d = static_cast<unsigned char>(s[i + j]);
      if (d < (j == 1 ? lo : 0x80) || d > (j == 1 ? hi : 0xBF)) break;
    }
    if (j == size_t(need) + 1)
      out.append(s, i, j);
    else
      out += "\xEF\xBF\xBD";
    i += j;
  }
  return out;
}

ggml_type parse_type(const std::string &s) {
  if (s == "f32") return GGML_TYPE_F32;
  if (s == "f16") return GGML_TYPE_F16;
  if (s == "q8_0") return GGML_TYPE_Q8_0;
  std::fprintf(stderr, "peer_logits: unknown cache type %s\n", s.c_str());
  std::exit(2);
}

} // namespace

int main(int argc, char **argv) {
  std::string model_path, out, ctk = "f32", ctv = "f32", prompt_text, text_out;
  int random = 0, chunk = 32, greedy = 0, threads = 2;
  unsigned long long seed = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "-m")
      model_path = v;
    else if (k == "--random")
      random = std::atoi(v.c_str());
    else if (k == "--prompt")
      prompt_text = v;
    else if (k == "--text-out")
      text_out = v;
    else if (k == "--seed")
      seed = std::strtoull(v.c_str(), nullptr, 10);
    else if (k == "--chunk")
      chunk = std::atoi(v.c_str());
    else if (k == "--greedy")
      greedy = std::atoi(v.c_str());
    else if (k == "--ctk")
      ctk = v;
    else if (k == "--ctv")
      ctv = v;
    else if (k == "-t")
      threads = std::atoi(v.c_str());
    else if (k == "-o")
      out = v;
    else
      return std::fprintf(stderr, "peer_logits: unknown option %s\n", k.c_str()), 2;
  }
  if (model_path.empty() || (random < 1 && prompt_text.empty()) || chunk < 1)
    return std::fprintf(stderr, "peer_logits: need -m, --random or --prompt, --chunk\n"), 2;

  llama_model *model = offgraph::peer::load_reference_model(model_path);
  if (!model)
    return std::fprintf(stderr, "peer_logits: llama.cpp could not load %s\n", model_path.c_str()),
           1;
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

  const uint32_t n_ctx =
      uint32_t((prompt_text.empty() ? random : int(prompt_text.size()) + 8) + greedy + 1);
  llama_context *ctx = offgraph::peer::reference_context(model, n_ctx, chunk, threads,
                                                         parse_type(ctk), parse_type(ctv));
  if (!ctx) return std::fprintf(stderr, "peer_logits: could not create a context\n"), 1;

  offgraph::peer::LogitsFile file;
  file.n_vocab = uint32_t(n_vocab);
  if (!prompt_text.empty()) {
    // llama.cpp's own tokenizer: BOS as the vocabulary says, special tokens as plain text.
    std::vector<llama_token> ids(prompt_text.size() + 8);
    const int n =
        llama_tokenize(llama_model_get_vocab(model), prompt_text.c_str(),
                       int32_t(prompt_text.size()), ids.data(), int32_t(ids.size()), true, false);
    if (n < 0) return std::fprintf(stderr, "peer_logits: tokenization failed\n"), 1;
    for (int i = 0; i < n; ++i) file.tokens.push_back(uint32_t(ids[size_t(i)]));
    random = n;
  } else {
    // The same random prompt as `offgraph logits --random N --seed S`.
    std::mt19937_64 rng(seed);
    for (int i = 0; i < random; ++i)
      file.tokens.push_back(uint32_t(std::uniform_int_distribution<int32_t>(0, n_vocab - 1)(rng)));
  }
  file.n_prompt = uint32_t(random);

  {
    offgraph::peer::LogitsDecoder decoder("peer_logits", ctx, file, chunk);
    const std::vector<llama_token> prompt(file.tokens.begin(), file.tokens.end());
    for (int at = 0; at < random; at += chunk)
      decoder.decode(prompt.data() + at, std::min(chunk, random - at), at);
    decoder.greedy(greedy, random);
  }
  if (!text_out.empty()) {
    // The greedy continuation as text, stopping at an end-of-generation token like `offgraph run`.
    std::string text;
    const llama_vocab *vocab = llama_model_get_vocab(model);
    for (size_t i = file.n_prompt; i < file.tokens.size(); ++i) {
      if (llama_vocab_is_eog(vocab, llama_token(file.tokens[i]))) break;
      char piece[256];
      const int n =
          llama_token_to_piece(vocab, llama_token(file.tokens[i]), piece, sizeof piece, 0, false);
      if (n > 0) text.append(piece, size_t(n));
    }
    text = sanitize_utf8(text);
    std::FILE *f = std::fopen(text_out.c_str(), "wb");
    if (!f || std::fwrite(text.data(), 1, text.size(), f) != text.size() || std::fclose(f) != 0)
      return std::fprintf(stderr, "peer_logits: cannot write %s\n", text_out.c_str()), 1;
  }
  llama_free(ctx);
  llama_model_free(model);
  if (!out.empty() && !file.write(out))
    return std::fprintf(stderr, "peer_logits: cannot write %s\n", out.c_str()), 1;
  return 0;
}
