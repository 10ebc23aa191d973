// Shared by the tokenizer tests: where llama.cpp's vocabulary files are, and a tiny synthetic
// byte-level BPE vocabulary built in memory (so the core tests need no files).
#pragma once

#include "text/tokenizer/tokenizer.h"

#include "gguf.h"

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace offgraph::text::testing {

// The pinned llama.cpp tree: $OFFGRAPH_LLAMA_TREE, else the path the build was configured with.
inline std::string llama_tree() {
  if (const char *env = std::getenv("OFFGRAPH_LLAMA_TREE"); env && *env) return env;
#ifdef OFFGRAPH_LLAMA_TREE
  return OFFGRAPH_LLAMA_TREE;
#else
  return "";
#endif
}

inline std::string vocab_path(const std::string &name) {
  const std::string tree = llama_tree();
  if (tree.empty()) return "";
  const std::string path = tree + "/models/ggml-vocab-" + name + ".gguf";
  return std::filesystem::exists(path) ? path : "";
}

// GPT-2's byte-to-code-point mapping, written out independently of the library's copy.
inline std::string mapped_byte(unsigned b) {
  unsigned cp = b;
  if (!((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)) {
    unsigned shift = 256;
    for (unsigned x = 0; x < b; ++x) {
      if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE)) ++shift;
    }
    cp = shift;
  }
  std::string s;
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else {
    s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return s;
}

struct SyntheticVocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<std::string> merges;
  std::string model = "gpt2";
  std::string pre = "llama-bpe";
};

// 256 byte tokens, then merged tokens for "he", "ll", "hell", "hello", Ġ+"w", then specials.
inline SyntheticVocab small_vocab() {
  SyntheticVocab v;
  for (unsigned b = 0; b < 256; ++b) {
    v.tokens.push_back(mapped_byte(b));
    v.types.push_back(1);
  }
  const std::string space = mapped_byte(' ');
  for (const auto &[l, r] : std::vector<std::pair<std::string, std::string>>{
           {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {space, "w"}}) {
    v.merges.push_back(l + " " + r);
    v.tokens.push_back(l + r);
    v.types.push_back(1);
  }
  for (const char *s : {"<|begin_of_text|>", "<|end_of_text|>", "<|eot|>", "<|eom|>", "<|eo"}) {
    v.tokens.push_back(s);
    v.types.push_back(3);
  }
  return v;
}

inline Result<std::unique_ptr<Tokenizer>> build(const SyntheticVocab &v) {
  gguf_context *ctx = gguf_init_empty();
  gguf_set_val_str(ctx, "tokenizer.ggml.model", v.model.c_str());
  gguf_set_val_str(ctx, "tokenizer.ggml.pre", v.pre.c_str());
  std::vector<const char *> toks, merges;
  for (const auto &t : v.tokens) toks.push_back(t.c_str());
  for (const auto &m : v.merges) merges.push_back(m.c_str());
  gguf_set_arr_str(ctx, "tokenizer.ggml.tokens", toks.data(), toks.size());
  gguf_set_arr_str(ctx, "tokenizer.ggml.merges", merges.data(), merges.size());
  gguf_set_arr_data(ctx, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, v.types.data(),
                    v.types.size());
  gguf_set_val_u32(ctx, "tokenizer.ggml.bos_token_id", 261);
  gguf_set_val_u32(ctx, "tokenizer.ggml.eos_token_id", 262);
  gguf_set_val_u32(ctx, "tokenizer.ggml.eot_token_id", 263);
  gguf_set_val_bool(ctx, "tokenizer.ggml.add_bos_token", true);
  auto tok = Tokenizer::from_gguf(ctx);
  gguf_free(ctx);
  return tok;
}

} // namespace offgraph::text::testing
