// The Muse Glimmer text setup of the template and request targets: the Llama 3 vocabulary from
// the pinned tree with reserved control tokens renamed to Muse Glimmer's markers (so the
// template's markers are control tokens, as in the real model), and the real chat template.
#pragma once

#include "fuzz_util.h"

#include "text/template/chat_template.h"
#include "text/tokenizer/tokenizer.h"

#include "gguf.h"

#include <iterator>
#include <memory>
#include <string>
#include <vector>

namespace offgraph::fuzz {

inline std::unique_ptr<text::Tokenizer> muse_tokenizer() {
  const std::string path = llama_tree() + "/models/ggml-vocab-llama-bpe.gguf";
  gguf_init_params params{/*no_alloc=*/true, /*ctx=*/nullptr};
  gguf_context *ctx = gguf_init_from_file(path.c_str(), params);
  FUZZ_CHECK(ctx, "cannot read %s (set OFFGRAPH_LLAMA_TREE)", path.c_str());
  const int64_t key = gguf_find_key(ctx, "tokenizer.ggml.tokens");
  std::vector<std::string> tokens(gguf_get_arr_n(ctx, key));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = gguf_get_arr_str(ctx, key, i);
  const char *markers[] = {"<|start|>", "<|message|>", "<|eot|>",
                           "<|eom|>",   "<|patch|>",   "<|video|>"};
  size_t next = 0;
  for (auto &t : tokens)
    if (next < std::size(markers) && t.rfind("<|reserved_special_token_", 0) == 0)
      t = markers[next++];
  FUZZ_CHECK(next == std::size(markers), "not enough reserved tokens to rename");
  std::vector<const char *> ptrs;
  for (const auto &t : tokens) ptrs.push_back(t.c_str());
  gguf_set_arr_str(ctx, "tokenizer.ggml.tokens", ptrs.data(), ptrs.size());
  auto tok = text::Tokenizer::from_gguf(ctx);
  gguf_free(ctx);
  FUZZ_CHECK(tok.ok(), "%s", tok.message().c_str());
  return std::move(tok).value();
}

inline text::Template muse_template() {
  const std::string path =
      std::string(OFFGRAPH_FUZZ_DIR) + "/../tests/text/template/fixtures/muse-glimmer.jinja";
  auto t = text::Template::parse(read_file(path));
  FUZZ_CHECK(t.ok(), "%s: %s", path.c_str(), t.message().c_str());
  return std::move(t).value();
}

} // namespace offgraph::fuzz
