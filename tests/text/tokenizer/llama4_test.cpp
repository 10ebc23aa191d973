// The Llama 4 (GPT-4o style) pre-tokenizer against llama.cpp itself. The pinned tree has no llama4
// vocabulary, so the Llama 3 one is loaded with `tokenizer.ggml.pre` set to "llama4", exactly as
// the reference ids in data/ were made:
//   setpre ggml-vocab-llama-bpe.gguf vocab-llama4.gguf llama4   (gguf_set_val_str + write, meta
//   only) llama-tokenize -m vocab-llama4.gguf -f mixed_sample.txt --ids --no-escape --no-bos
//     --no-parse-special --log-disable > mixed_sample.llama4.ids
//   (the same without --no-bos --no-parse-special, for mixed_sample.llama4.special.ids)
#include "test_support.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

namespace offgraph::text {
namespace {

std::string read_file(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Parses llama-tokenize's `--ids` output: "[1, 2, 3]".
std::vector<int32_t> read_ids(const std::string &path) {
  std::string text = read_file(path);
  for (char &c : text) {
    if (c == '[' || c == ']' || c == ',') c = ' ';
  }
  std::istringstream in(text);
  std::vector<int32_t> ids;
  for (int32_t id; in >> id;) ids.push_back(id);
  return ids;
}

std::unique_ptr<Tokenizer> llama4_tokenizer() {
  const std::string path = testing::vocab_path("llama-bpe");
  if (path.empty()) return nullptr;
  gguf_init_params params{};
  params.no_alloc = true;
  gguf_context *ctx = gguf_init_from_file(path.c_str(), params);
  EXPECT_NE(ctx, nullptr);
  if (!ctx) return nullptr;
  gguf_set_val_str(ctx, "tokenizer.ggml.pre", "llama4");
  auto tok = Tokenizer::from_gguf(ctx);
  gguf_free(ctx);
  EXPECT_TRUE(tok.ok()) << tok.message();
  return tok.ok() ? std::move(tok).value() : nullptr;
}

const std::string kData = std::string(OFFGRAPH_TOKENIZER_TEST_DATA) + "/";

TEST(Llama4, MatchesLlamaCppOnMixedText) {
  auto tok = llama4_tokenizer();
  if (!tok) GTEST_SKIP() << "llama.cpp tree not found (set OFFGRAPH_LLAMA_TREE)";
  EXPECT_EQ(tok->pre_tokenizer_name(), "llama4");
  const std::string text = read_file(kData + "mixed_sample.txt");
  ASSERT_FALSE(text.empty());
  const auto expected = read_ids(kData + "mixed_sample.llama4.ids");
  ASSERT_FALSE(expected.empty());
  EXPECT_EQ(tok->encode(text, false, false), expected);
}

TEST(Llama4, MatchesLlamaCppWithSpecialTokens) {
  auto tok = llama4_tokenizer();
  if (!tok) GTEST_SKIP() << "llama.cpp tree not found (set OFFGRAPH_LLAMA_TREE)";
  const std::string text = read_file(kData + "mixed_sample.txt");
  const auto expected = read_ids(kData + "mixed_sample.llama4.special.ids");
  ASSERT_FALSE(expected.empty());
  EXPECT_EQ(tok->encode(text, tok->add_bos_default(), true), expected);
}

} // namespace
} // namespace offgraph::text
