#include "test_support.h"

#include "text/tokenizer/unicode.h"

#include <gtest/gtest.h>

#include <random>

namespace offgraph::text {
namespace {

std::unique_ptr<Tokenizer> small_tokenizer() {
  auto tok = testing::build(testing::small_vocab());
  EXPECT_TRUE(tok.ok()) << tok.message();
  return std::move(tok).value();
}

TEST(Detokenizer, HoldsSplitCharactersUntilComplete) {
  auto tok = small_tokenizer();
  Detokenizer d(*tok);
  // "€" is E2 82 AC: one byte token each.
  EXPECT_EQ(d.feed(0xE2), "");
  EXPECT_EQ(d.feed(0x82), "");
  EXPECT_EQ(d.feed(0xAC), "\xE2\x82\xAC");
  EXPECT_EQ(d.feed(259), "hello");
  EXPECT_EQ(d.flush(), "");
}

TEST(Detokenizer, ReplacesInvalidBytes) {
  auto tok = small_tokenizer();
  Detokenizer d(*tok);
  EXPECT_EQ(d.feed(0xFF), "\xEF\xBF\xBD");
  EXPECT_EQ(d.feed(0xE2), "");
  EXPECT_EQ(d.feed('a'), "\xEF\xBF\xBD"
                         "a"); // the sequence was cut short
  EXPECT_EQ(d.feed(0xF0), "");
  EXPECT_EQ(d.feed(0x9F), "");
  EXPECT_EQ(d.flush(), "\xEF\xBF\xBD"); // an unfinished character at the end is one U+FFFD
  EXPECT_EQ(d.feed_bytes("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"); // surrogate
}

// A character cut short by the next token's lead byte is one U+FFFD (its maximal valid prefix),
// as Python's decode(errors="replace") and browsers give; seen with llama-bpe tokens " \xED\x8B"
// followed by "\xD0\x94..." in a random model's output.
TEST(Detokenizer, OneReplacementPerMaximalSubpart) {
  auto tok = small_tokenizer();
  Detokenizer d(*tok);
  EXPECT_EQ(d.feed_bytes(" \xED\x8B"), " ");
  EXPECT_EQ(d.feed_bytes("\xD0\x94"), "\xEF\xBF\xBD\xD0\x94");
  EXPECT_EQ(d.feed_bytes("\xF0\x9F\x98"), "");
  EXPECT_EQ(d.feed_bytes("x"), "\xEF\xBF\xBDx");
  EXPECT_EQ(d.feed_bytes("\xE0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD"); // E0 80 is never a prefix
  EXPECT_EQ(d.flush(), "");
}

TEST(Detokenizer, SkipsControlTokensUnlessAsked) {
  auto tok = small_tokenizer();
  Detokenizer plain(*tok);
  EXPECT_EQ(plain.feed(263), "");
  Detokenizer rendered(*tok, true);
  EXPECT_EQ(rendered.feed(263), "<|eot|>");
}

TEST(Detokenizer, RandomTokenStreamsStayValidUtf8) {
  auto tok = small_tokenizer();
  std::mt19937 rng(7);
  for (int round = 0; round < 200; ++round) {
    Detokenizer d(*tok);
    std::string all;
    for (int i = 0; i < 50; ++i) {
      const std::string part =
          d.feed(std::uniform_int_distribution<int32_t>(0, tok->n_vocab() - 1)(rng));
      ASSERT_TRUE(is_valid_utf8(part));
      all += part;
    }
    const std::string rest = d.flush();
    ASSERT_TRUE(is_valid_utf8(rest));
    ASSERT_TRUE(is_valid_utf8(all + rest));
  }
}

TEST(Detokenizer, StreamsRealTokensOfMultibyteTextExactly) {
  const std::string path = testing::vocab_path("llama-bpe");
  if (path.empty()) GTEST_SKIP() << "llama.cpp tree not found (set OFFGRAPH_LLAMA_TREE)";
  auto tok = Tokenizer::from_gguf(path);
  ASSERT_TRUE(tok.ok()) << tok.message();
  const std::string text = "Grüße, 世界! 😀🎉 naïve café — ∑x² 𝔘𝔫𝔦𝔠𝔬𝔡𝔢";
  Detokenizer d(**tok);
  std::string all;
  for (const int32_t id : (*tok)->encode(text, false, false)) {
    const std::string part = d.feed(id);
    ASSERT_TRUE(is_valid_utf8(part)) << id;
    all += part;
  }
  all += d.flush();
  EXPECT_EQ(all, text);
}

} // namespace
} // namespace offgraph::text
