#include "test_support.h"

#include "text/tokenizer/unicode.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <sstream>

namespace offgraph::text {
namespace {

using testing::build;
using testing::small_vocab;
using testing::vocab_path;

std::unique_ptr<Tokenizer> small_tokenizer() {
  auto tok = build(small_vocab());
  EXPECT_TRUE(tok.ok()) << tok.message();
  return std::move(tok).value();
}

TEST(Tokenizer, MergesByRankAndReportsIds) {
  auto tok = small_tokenizer();
  EXPECT_EQ(tok->n_vocab(), 266);
  EXPECT_EQ(tok->bos(), 261);
  EXPECT_EQ(tok->eos(), 262);
  EXPECT_EQ(tok->eot(), 263);
  EXPECT_TRUE(tok->add_bos_default());
  EXPECT_EQ(tok->encode("hello", false, false), (std::vector<int32_t>{259}));
  EXPECT_EQ(tok->encode("hello world", true, false),
            (std::vector<int32_t>{261, 259, 260, 'o', 'r', 'l', 'd'}));
  EXPECT_EQ(tok->token_piece(260), " w");
  EXPECT_EQ(tok->find_token(" w"), 260);
  EXPECT_FALSE(tok->find_token("xyz").has_value());
  EXPECT_EQ(tok->token_piece(-1), "");
  EXPECT_EQ(tok->token_piece(100000), "");
}

TEST(Tokenizer, EndOfGenerationIsEotAndEosNeverEom) {
  auto tok = small_tokenizer();
  EXPECT_EQ(tok->end_of_generation_ids(), (std::vector<int32_t>{263, 262}));
  EXPECT_TRUE(tok->is_control(264));
  EXPECT_FALSE(tok->is_control(259));
}

TEST(Tokenizer, SpecialTokensOnlyWhenParsingSpecial) {
  auto tok = small_tokenizer();
  const std::string text = "hello<|eot|><|eom|>x<|eo";
  const auto plain = tok->encode(text, false, false);
  for (const int32_t id : plain) EXPECT_FALSE(tok->is_control(id)) << id;
  EXPECT_EQ(tok->decode(plain), text);
  // Longest special first: "<|eot|>" wins over its prefix "<|eo", which still matches alone.
  EXPECT_EQ(tok->encode(text, false, true), (std::vector<int32_t>{259, 263, 264, 'x', 265}));
}

TEST(Tokenizer, InvalidUtf8BecomesReplacementCharacters) {
  auto tok = small_tokenizer();
  // Each byte that starts no sequence is one U+FFFD; a truncated sequence is one per byte.
  EXPECT_EQ(tok->decode(tok->encode("a\xFF"
                                    "b",
                                    false, false)),
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(tok->decode(tok->encode("\xE2\x82", false, false)), "\xEF\xBF\xBD\xEF\xBF\xBD");
  // Overlong forms are decoded leniently (as llama.cpp does), so C0 80 is U+0000.
  EXPECT_EQ(tok->decode(tok->encode("\xC0\x80", false, false)), std::string(1, '\0'));
  EXPECT_EQ(tok->decode(tok->encode("", false, false)), "");
}

TEST(Tokenizer, RandomBytesGiveTheDocumentedText) {
  auto tok = small_tokenizer();
  std::mt19937 rng(99);
  for (int i = 0; i < 2000; ++i) {
    std::string bytes(static_cast<size_t>(i % 32), '\0');
    for (char &c : bytes) c = static_cast<char>(std::uniform_int_distribution<int>(0, 255)(rng));
    EXPECT_EQ(tok->decode(tok->encode(bytes, false, true)), decode_lenient(bytes).utf8);
  }
}

TEST(Tokenizer, LoadErrorsAreClear) {
  auto v = small_vocab();
  v.pre = "mystery-pre";
  auto bad_pre = build(v);
  ASSERT_FALSE(bad_pre.ok());
  EXPECT_NE(bad_pre.message().find("mystery-pre"), std::string::npos) << bad_pre.message();
  EXPECT_NE(bad_pre.message().find("llama4"), std::string::npos) << bad_pre.message();
  v = small_vocab();
  v.model = "llama";
  auto bad_model = build(v);
  ASSERT_FALSE(bad_model.ok());
  EXPECT_NE(bad_model.message().find("'llama'"), std::string::npos) << bad_model.message();
  auto missing = Tokenizer::from_gguf("/nonexistent/file.gguf");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("/nonexistent/file.gguf"), std::string::npos);
}

// --- llama.cpp's own test vectors (models/ggml-vocab-*.gguf.inp/.out) ---

struct VectorCase {
  std::string input;
  std::vector<int32_t> expected;
};

std::vector<VectorCase> read_vectors(const std::string &gguf) {
  std::ifstream inp(gguf + ".inp", std::ios::binary), out(gguf + ".out", std::ios::binary);
  std::stringstream raw;
  raw << inp.rdbuf();
  const std::string all = raw.str();
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> inputs;
  for (size_t pos = 0; pos < all.size();) {
    const size_t next = all.find(sep, pos);
    if (next == std::string::npos) {
      inputs.push_back(all.substr(pos));
      break;
    }
    inputs.push_back(all.substr(pos, next - pos));
    pos = next + sep.size();
  }
  std::vector<VectorCase> cases;
  std::string line;
  for (size_t i = 0; std::getline(out, line); ++i) {
    VectorCase c;
    c.input = i < inputs.size() ? inputs[i] : std::string();
    std::istringstream ids(line);
    for (int32_t id; ids >> id;) c.expected.push_back(id);
    cases.push_back(std::move(c));
  }
  EXPECT_EQ(cases.size(), inputs.size()) << gguf;
  return cases;
}

std::string param_name(const ::testing::TestParamInfo<std::string> &p) {
  std::string n = p.param;
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
}

class LlamaVectors : public ::testing::TestWithParam<std::string> {};

TEST_P(LlamaVectors, MatchLlamaCpp) {
  const std::string path = vocab_path(GetParam());
  if (path.empty()) GTEST_SKIP() << "llama.cpp tree not found (set OFFGRAPH_LLAMA_TREE)";
  auto tok = Tokenizer::from_gguf(path);
  ASSERT_TRUE(tok.ok()) << tok.message();
  const auto cases = read_vectors(path);
  ASSERT_FALSE(cases.empty());
  size_t failures = 0;
  for (const auto &c : cases) {
    // test-tokenizer-0 tokenizes with add_special = false, parse_special = false.
    const auto got = (*tok)->encode(c.input, false, false);
    if (got != c.expected) {
      ++failures;
      ADD_FAILURE() << "input: '" << c.input << "'";
    }
  }
  EXPECT_EQ(failures, 0u) << "of " << cases.size() << " cases";
}

INSTANTIATE_TEST_SUITE_P(Vocabs, LlamaVectors,
                         ::testing::Values("llama-bpe", "gpt-2", "qwen2", "gemma-4"), param_name);

// --- properties over a real vocabulary ---

std::string random_text(std::mt19937 &rng, size_t n_chars) {
  // Weighted toward what prompts contain, with every plane represented.
  static const std::vector<std::pair<uint32_t, uint32_t>> ranges = {
      {0x20, 0x7E},       {0x09, 0x0D},       {0xA0, 0x24F},    {0x300, 0x36F},   {0x370, 0x3FF},
      {0x400, 0x4FF},     {0x590, 0x6FF},     {0x900, 0x97F},   {0xE00, 0xE7F},   {0x2000, 0x206F},
      {0x3000, 0x30FF},   {0x4E00, 0x9FFF},   {0xAC00, 0xD7A3}, {0xE000, 0xF8FF}, {0xFF00, 0xFFFD},
      {0x1F300, 0x1FAFF}, {0x10000, 0x10FFFF}};
  std::string s;
  for (size_t i = 0; i < n_chars; ++i) {
    const auto &r = ranges[std::uniform_int_distribution<size_t>(0, ranges.size() - 1)(rng)];
    const uint32_t cp = std::uniform_int_distribution<uint32_t>(r.first, r.second)(rng);
    append_utf8(s, cp);
  }
  return s;
}

class RealVocab : public ::testing::TestWithParam<std::string> {};

TEST_P(RealVocab, RoundTripsRandomUnicode) {
  const std::string path = vocab_path(GetParam());
  if (path.empty()) GTEST_SKIP() << "llama.cpp tree not found (set OFFGRAPH_LLAMA_TREE)";
  auto tok = Tokenizer::from_gguf(path);
  ASSERT_TRUE(tok.ok()) << tok.message();
  std::mt19937 rng(1234);
  for (int i = 0; i < 300; ++i) {
    const std::string s = random_text(rng, 1 + i % 40);
    ASSERT_TRUE(is_valid_utf8(s));
    EXPECT_EQ((*tok)->decode((*tok)->encode(s, false, false)), s) << "seed case " << i;
  }
}

TEST_P(RealVocab, PlainTextNeverYieldsControlTokens) {
  const std::string path = vocab_path(GetParam());
  if (path.empty()) GTEST_SKIP() << "llama.cpp tree not found (set OFFGRAPH_LLAMA_TREE)";
  auto tok = Tokenizer::from_gguf(path);
  ASSERT_TRUE(tok.ok()) << tok.message();
  const Tokenizer &t = **tok;
  int n_control = 0;
  for (int32_t id = 0; id < t.n_vocab(); ++id) {
    if (!t.is_control(id) || t.token_piece(id).empty()) continue;
    ++n_control;
    const std::string text = "say " + t.token_piece(id) + " now";
    for (const int32_t got : t.encode(text, false, false)) ASSERT_FALSE(t.is_control(got)) << text;
    const auto special = t.encode(text, false, true);
    EXPECT_NE(std::find(special.begin(), special.end(), id), special.end()) << text;
  }
  EXPECT_GT(n_control, 0);
}

INSTANTIATE_TEST_SUITE_P(Vocabs, RealVocab,
                         ::testing::Values("llama-bpe", "gpt-2", "qwen2", "gemma-4"), param_name);

} // namespace
} // namespace offgraph::text
