// The tokenizer and detokenizer on arbitrary text and ids, with real vocabularies from the pinned
// llama.cpp tree, one per pre-tokenizer (GPT-2, Llama 3, Qwen 2, Llama 4 / GPT-4o).
// Properties: every id is in the vocabulary; without special tokens, text never becomes a control
// token; encode then decode gives the text back (valid UTF-8; invalid bytes come back as U+FFFD),
// with and without special tokens; the streaming detokenizer's output is valid UTF-8 and does not
// depend on how the bytes were split into tokens.
#include "fuzz_util.h"

#include "text/tokenizer/tokenizer.h"
#include "text/tokenizer/unicode.h"

#include "ggml.h"
#include "gguf.h"

#include <memory>
#include <vector>

using namespace offgraph;
using text::Tokenizer;

namespace {

std::vector<std::unique_ptr<Tokenizer>> &tokenizers() {
  static std::vector<std::unique_ptr<Tokenizer>> all;
  return all;
}

std::unique_ptr<Tokenizer> load(const std::string &vocab, const char *pre = nullptr) {
  const std::string path = fuzz::llama_tree() + "/models/ggml-vocab-" + vocab + ".gguf";
  gguf_init_params params{/*no_alloc=*/true, /*ctx=*/nullptr};
  gguf_context *ctx = gguf_init_from_file(path.c_str(), params);
  FUZZ_CHECK(ctx, "cannot read %s (set OFFGRAPH_LLAMA_TREE to the pinned llama.cpp tree)",
             path.c_str());
  if (pre) gguf_set_val_str(ctx, "tokenizer.ggml.pre", pre);
  auto tok = Tokenizer::from_gguf(ctx);
  gguf_free(ctx);
  FUZZ_CHECK(tok.ok(), "%s: %s", path.c_str(), tok.message().c_str());
  return std::move(tok).value();
}

void check_ids(const Tokenizer &tok, const std::vector<int32_t> &ids) {
  for (int32_t id : ids) FUZZ_CHECK(id >= 0 && id < tok.n_vocab(), "id %d out of range", int(id));
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
  ggml_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
  tokenizers().push_back(load("gpt-2"));
  tokenizers().push_back(load("llama-bpe"));
  tokenizers().push_back(load("qwen2"));
  tokenizers().push_back(load("llama-bpe", "llama4"));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz::Input in(data, size);
  const uint8_t mode = in.byte();
  const Tokenizer &tok = *tokenizers()[mode % tokenizers().size()];
  const bool add_bos = mode & 0x04, parse_special = mode & 0x08;

  if (!(mode & 0x10)) {
    // Text in.
    const std::string textin = in.rest();
    const auto ids = tok.encode(textin, add_bos, parse_special);
    check_ids(tok, ids);
    const size_t skip = add_bos && tok.bos() >= 0 ? 1 : 0;
    if (!parse_special)
      for (size_t i = skip; i < ids.size(); ++i)
        FUZZ_CHECK(!tok.is_control(ids[i]), "text became control token %d", int(ids[i]));
    if (skip) FUZZ_CHECK(!ids.empty() && ids[0] == tok.bos(), "BOS missing");
    const std::string back =
        tok.decode(std::vector<int32_t>(ids.begin() + std::ptrdiff_t(skip), ids.end()));
    if (text::is_valid_utf8(textin)) {
      FUZZ_CHECK(back == textin, "decode(encode(x)) != x (%zu bytes in, %zu out)", textin.size(),
                 back.size());
    } else if (!parse_special) {
      const std::string repaired = text::decode_lenient(textin).utf8;
      FUZZ_CHECK(back == repaired, "decode(encode(x)) is not x with U+FFFD for invalid bytes");
    }
    // Detokenized text of the same ids, token by token, equals the one-shot repair.
    text::Detokenizer stream(tok, /*render_control=*/true);
    std::string streamed;
    for (size_t i = skip; i < ids.size(); ++i) streamed += stream.feed(ids[i]);
    streamed += stream.flush();
    text::Detokenizer whole(tok, true);
    const std::string at_once = whole.feed_bytes(back) + whole.flush();
    FUZZ_CHECK(streamed == at_once, "streamed detokenization differs from one-shot");
    if (text::is_valid_utf8(back)) FUZZ_CHECK(streamed == back, "valid text was altered");
    return 0;
  }

  // Ids in: arbitrary, negative and out of range included; control tokens skipped or rendered.
  const bool render_control = mode & 0x20;
  text::Detokenizer stream(tok, render_control);
  std::string streamed, raw;
  while (in.left() >= 2) {
    const uint32_t v = in.left() >= 4 ? in.u32() : in.byte();
    const int32_t id = int32_t(v % uint32_t(tok.n_vocab() + 16)) - 8;
    const std::string piece = stream.feed(id);
    FUZZ_CHECK(text::is_valid_utf8(piece), "detokenizer emitted invalid UTF-8");
    streamed += piece;
    if (render_control || !tok.is_control(id)) raw += tok.token_piece(id);
  }
  const std::string tail = stream.flush();
  FUZZ_CHECK(text::is_valid_utf8(tail), "flush emitted invalid UTF-8");
  streamed += tail;
  text::Detokenizer whole(tok, render_control);
  const std::string at_once = whole.feed_bytes(raw) + whole.flush();
  FUZZ_CHECK(streamed == at_once, "detokenizer output depends on how bytes were split");
  return 0;
}
