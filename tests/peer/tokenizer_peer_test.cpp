// offgraph's tokenizer against llama.cpp's (tools/peer/peer_tokenize.cpp, libllama of the pinned
// tree) on the same vocabulary files: mixed-script text with runs of spaces, tabs and newlines,
// the vocabularies' own special and user-defined token texts, U+2581 typed by hand, and invalid
// UTF-8. Every text, in each of llama.cpp's three modes, must give identical ids.
#include "text/tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace offgraph::text {
namespace {

const std::string kSep = "\n__ggml_vocab_test__\n";

std::string read_file(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Pieces a prompt is made of, from many scripts and the whitespace shapes pre-tokenizers split on.
const std::vector<std::string> kPieces = {"Hello",
                                          " world",
                                          "  two spaces",
                                          "\t",
                                          "\n",
                                          "\n\n",
                                          "\n\n\n\n",
                                          "\r\n",
                                          " \n ",
                                          "   ",
                                          "don't",
                                          "I'LL",
                                          "3.14159",
                                          "12345678",
                                          "Ça-va-sur-Mer",
                                          "naïve café",
                                          "Ελληνικά",
                                          "русский",
                                          "العربية",
                                          "עברית",
                                          "हिन्दी",
                                          "ไทย",
                                          "日本語のテキスト",
                                          "中文字符",
                                          "한국어",
                                          "🎉🚀",
                                          "👨‍👩‍👧",
                                          "e\xCC\x81",
                                          "\xE2\x96\x81",
                                          "\xE2\x96\x81\xE2\x96\x81x",
                                          "if (x < y) { a[i] *= 2; }",
                                          "<|turn>",
                                          "<|tool_response>",
                                          "<turn|>",
                                          "<|tool_call>",
                                          "<tool_call|>",
                                          "<|\"|>",
                                          "<eos>",
                                          "<bos>",
                                          "<|begin_of_text|>",
                                          "<|im_start|>",
                                          "<|endoftext|>",
                                          "\xFF",
                                          "\xC3",
                                          "\xE2\x82",
                                          "\xED\xA0\x80",
                                          "\x01\x7F",
                                          "\xC2\xA0nbsp",
                                          "\xE3\x80\x80ideographic",
                                          "ﬁ ligature",
                                          "𝔘𝔫𝔦𝔠𝔬𝔡𝔢"};

std::vector<std::string> texts() {
  std::vector<std::string> out = {
      read_file(std::string(OFFGRAPH_TOKENIZER_TEST_DATA) + "/mixed_sample.txt"),
      "",
      " ",
      "\n",
      "\n\n\n",
      " \n\n \n",
      "▁"};
  std::mt19937 rng(20261205);
  for (int i = 0; i < 400; ++i) {
    std::string s;
    const int n = std::uniform_int_distribution<int>(1, 24)(rng);
    for (int k = 0; k < n; ++k)
      s += kPieces[std::uniform_int_distribution<size_t>(0, kPieces.size() - 1)(rng)];
    out.push_back(s);
  }
  return out;
}

std::vector<std::vector<int32_t>> read_ids(const std::string &path) {
  std::vector<std::vector<int32_t>> all;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    std::istringstream ids(line);
    all.emplace_back();
    for (int32_t id; ids >> id;) all.back().push_back(id);
  }
  return all;
}

struct Mode {
  const char *flags;
  bool add_special, parse_special;
};

class TokenizerPeer : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerPeer, SameIdsAsLlamaCpp) {
  const std::string vocab =
      std::string(OFFGRAPH_LLAMA_TREE) + "/models/ggml-vocab-" + GetParam() + ".gguf";
  ASSERT_TRUE(std::filesystem::exists(vocab)) << vocab;
  auto tok = Tokenizer::from_gguf(vocab);
  ASSERT_TRUE(tok.ok()) << tok.message();
  const auto all = texts();
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("offgraph-tokenizer-peer-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string inp = dir + "/texts.inp";
  {
    std::ofstream f(inp, std::ios::binary);
    for (size_t i = 0; i < all.size(); ++i) f << (i ? kSep : "") << all[i];
  }
  for (const Mode &m : {Mode{"", false, false}, Mode{"--parse-special", false, true},
                        Mode{"--add-special --parse-special", true, true}}) {
    const std::string out = dir + "/ids.out";
    const std::string cmd =
        std::string(OFFGRAPH_PEER_TOKENIZE) + " " + vocab + " " + inp + " " + out + " " + m.flags;
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    const auto expected = read_ids(out);
    ASSERT_EQ(expected.size(), all.size()) << cmd;
    size_t differ = 0;
    for (size_t i = 0; i < all.size(); ++i) {
      const bool bos = m.add_special && (*tok)->add_bos_default();
      if ((*tok)->encode(all[i], bos, m.parse_special) != expected[i] && ++differ <= 3)
        ADD_FAILURE() << m.flags << " text " << i << ": '" << all[i] << "'";
    }
    EXPECT_EQ(differ, 0u) << "of " << all.size() << " texts, mode '" << m.flags << "'";
  }
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Vocabs, TokenizerPeer,
                         ::testing::Values("gemma-4", "llama-bpe", "qwen2", "gpt-2"),
                         [](const auto &p) {
                           std::string n = p.param;
                           for (char &c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

} // namespace
} // namespace offgraph::text
