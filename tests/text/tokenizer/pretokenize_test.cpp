#include "text/tokenizer/pretokenize.h"
#include "text/tokenizer/unicode.h"

#include <gtest/gtest.h>

#include <random>
#include <regex>

namespace offgraph::text {
namespace {

std::vector<std::string> split(PreTokenizer kind, const std::string &text) {
  const DecodedText d = decode_lenient(text);
  std::vector<size_t> ends;
  split_words(kind, d.cps, 0, d.cps.size(), ends);
  std::vector<std::string> words;
  size_t begin = 0;
  for (const size_t end : ends) {
    words.push_back(d.utf8.substr(d.offsets[begin], d.offsets[end] - d.offsets[begin]));
    begin = end;
  }
  return words;
}

using Words = std::vector<std::string>;

TEST(PreTokenize, UnknownNameListsSupported) {
  auto r = pre_tokenizer_from_name("nope");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("'nope'"), std::string::npos);
  for (const char *name : {"llama4", "llama-bpe", "gpt-2", "qwen2"}) {
    EXPECT_NE(r.message().find(name), std::string::npos) << name;
    EXPECT_TRUE(pre_tokenizer_from_name(name).ok()) << name;
  }
}

TEST(PreTokenize, Gpt4oCases) {
  const auto k = PreTokenizer::kGpt4o;
  EXPECT_EQ(split(k, "Hello World"), (Words{"Hello", " World"}));
  EXPECT_EQ(split(k, "HTTPServer don't"), (Words{"HTTPServer", " don't"}));
  EXPECT_EQ(split(k, "HELLO, WORLD!"), (Words{"HELLO", ",", " WORLD", "!"}));
  EXPECT_EQ(split(k, "camelCaseWord"), (Words{"camel", "Case", "Word"}));
  EXPECT_EQ(split(k, "12345 abc"), (Words{"123", "45", " abc"}));
  EXPECT_EQ(split(k, "a/b//\n\nc"), (Words{"a", "/b", "//\n\n", "c"}));
  EXPECT_EQ(split(k, "x   \n  y"), (Words{"x", "   \n", " ", " y"}));
  EXPECT_EQ(split(k, "end  "), (Words{"end", "  "}));
  // llama.cpp's rewrite: a non-ASCII letter is both "upper" and "lower"; marks are not letters.
  // So "ÉCOLE" splits after "É" (the first alternative backtracks to it), where the original
  // regex would keep one word: llama.cpp's behaviour, kept for identical ids.
  EXPECT_EQ(split(k, "ÉCOLE"), (Words{"É", "COLE"}));
  EXPECT_EQ(split(k, "ABÉCD"), (Words{"ABÉ", "CD"}));
  EXPECT_EQ(split(k, "e\xCC\x81t\xC3\xA9"), (Words{"e", "\xCC\x81t\xC3\xA9"}));
  EXPECT_EQ(split(k, "中文字符 😀😀"), (Words{"中文字符", " 😀😀"}));
}

TEST(PreTokenize, Llama3AndQwen2Digits) {
  EXPECT_EQ(split(PreTokenizer::kLlama3, "x 1234567"), (Words{"x", " ", "123", "456", "7"}));
  EXPECT_EQ(split(PreTokenizer::kQwen2, "x 123"), (Words{"x", " ", "1", "2", "3"}));
  EXPECT_EQ(split(PreTokenizer::kGpt2, "x 123 it's"), (Words{"x", " 123", " it", "'s"}));
}

// llama.cpp splits GPT-4o text with std::regex over a "collapsed" string: ASCII kept, non-ASCII
// whitespace as \v, letters as 0xD2, numbers as 0xD1, everything else as 0xD0. Reproduce that
// here, independently of the hand-written matcher, and compare on random text.
std::vector<size_t> reference_gpt4o_ends(const std::vector<uint32_t> &cps) {
  std::string collapsed;
  for (const uint32_t cp : cps) {
    if (cp < 0x80) {
      collapsed.push_back(static_cast<char>(cp));
    } else if (is_whitespace(cp)) {
      collapsed.push_back('\x0B');
    } else if (codepoint_class(cp) == CodepointClass::kLetter) {
      collapsed.push_back('\xD2');
    } else if (codepoint_class(cp) == CodepointClass::kNumber) {
      collapsed.push_back('\xD1');
    } else {
      collapsed.push_back('\xD0');
    }
  }
  const std::string L = std::string("\xD2") + "A-Za-z", N = std::string("\xD1") + "0-9";
  const std::string C = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?";
  const std::string up = "((?=[" + L + "])([^a-z]))", lo = "((?=[" + L + "])([^A-Z]))";
  const std::string pre = "[^\\r\\n" + L + N + "]?";
  const std::string expr = pre + up + "*" + lo + "+" + C + "|" + pre + up + "+" + lo + "*" + C +
                           "|[" + N + "]{1,3}| ?[^\\s" + L + N +
                           "]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  static const std::regex re(expr, std::regex_constants::optimize | std::regex_constants::nosubs);
  std::vector<size_t> ends;
  size_t last = 0;
  for (auto it = std::sregex_iterator(collapsed.begin(), collapsed.end(), re);
       it != std::sregex_iterator(); ++it) {
    const size_t pos = static_cast<size_t>(it->position());
    if (pos > last) ends.push_back(pos);
    last = pos + static_cast<size_t>(it->length());
    ends.push_back(last);
  }
  if (last < cps.size()) ends.push_back(cps.size());
  return ends;
}

TEST(PreTokenize, Gpt4oMatchesLlamaCppRegexOnRandomText) {
  const std::vector<uint32_t> pool = {'a',
                                      'b',
                                      'Z',
                                      'Q',
                                      's',
                                      't',
                                      'l',
                                      'S',
                                      '\'',
                                      ' ',
                                      ' ',
                                      '\n',
                                      '\r',
                                      '\t',
                                      '\v',
                                      '/',
                                      '.',
                                      '!',
                                      '1',
                                      '7',
                                      '_',
                                      0xE9 /*é*/,
                                      0xC9 /*É*/,
                                      0x301 /*combining acute*/,
                                      0x3A3,
                                      0x3C3,
                                      0x4E2D /*中*/,
                                      0x1F600 /*😀*/,
                                      0x663 /*Arabic 3*/,
                                      0xA0,
                                      0x3000,
                                      0xFFFD,
                                      0x2028,
                                      0x1F};
  std::mt19937 rng(42);
  for (int i = 0; i < 3000; ++i) {
    std::vector<uint32_t> cps(1 + i % 24);
    for (auto &cp : cps) cp = pool[std::uniform_int_distribution<size_t>(0, pool.size() - 1)(rng)];
    std::vector<size_t> ends;
    split_words(PreTokenizer::kGpt4o, cps, 0, cps.size(), ends);
    std::string text;
    for (const uint32_t cp : cps) append_utf8(text, cp);
    ASSERT_EQ(ends, reference_gpt4o_ends(cps)) << "case " << i << ": '" << text << "'";
  }
}

} // namespace
} // namespace offgraph::text
