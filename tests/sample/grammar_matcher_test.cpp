// The matcher against two references: its masks against trying every token one by one, and the
// sentences it lets through against the Earley recognizer (grammar_accepts), over random
// vocabularies and walks.
#include "sample/grammar_matcher.h"

#include <gtest/gtest.h>

#include <random>

namespace offgraph::sample {
namespace {

// A random vocabulary: every single byte the grammars use, pieces of the grammars' own
// sentences (so that long tokens match across rule ends), random junk, multi-byte UTF-8, and
// two special tokens.
std::shared_ptr<const TokenTexts> random_vocabulary(std::mt19937 &rng, size_t n) {
  auto t = std::make_shared<TokenTexts>();
  const std::string alphabet = "{}[]\":,0123456789-.eE+ \ntrufalsn\\xyzab";
  for (char c : alphabet) t->bytes.push_back(std::string(1, c));
  const std::vector<std::string> pieces = {"{\"",   "\":",   "\",", "\"}",      "},",   "true",
                                           "false", "null",  "12",  "3.",       "e+",   "\n  ",
                                           ", \"",  "\"a\"", "[1",  "],",       "ab",   "\"x",
                                           "\\n",   "\\\"",  "é",   "\xE2\x82", "\xAC", "\"}]"};
  for (const auto &p : pieces) t->bytes.push_back(p);
  while (t->bytes.size() < n) {
    std::string s;
    const size_t len = 1 + rng() % 5;
    for (size_t i = 0; i < len; ++i) s += alphabet[rng() % alphabet.size()];
    t->bytes.push_back(s);
  }
  t->bytes.push_back(""); // writes nothing: never allowed
  t->bytes.push_back("<|end|>");
  t->bytes.push_back("<|sep|>");
  t->special.assign(t->bytes.size(), 0);
  t->special[t->bytes.size() - 1] = t->special[t->bytes.size() - 2] = 1;
  return t;
}

int32_t end_token(const TokenTexts &t) { return int32_t(t.bytes.size() - 2); }
int32_t sep_token(const TokenTexts &t) { return int32_t(t.bytes.size() - 1); }

// value ::= object | array | string | number | "true" | "false" | "null", with recursion.
Grammar json_like(int32_t sep) {
  GrammarBuilder b;
  const uint32_t value = b.declare("value");
  ByteSet digit, chars;
  digit.set_range('0', '9');
  chars.set_range('a', 'z');
  chars.set(' ');
  const Element d = b.bytes(digit);
  const Element digits = *b.repeat("digits", {d}, 1, kUnbounded);
  const Element frac = b.optional("frac", {b.byte('.'), digits});
  const Element number = b.rule("number", {{b.optional("sign", {b.byte('-')}), digits, frac}});
  const Element str_char = b.choice("char", {{b.bytes(chars)}, b.literal("\\n")});
  const Element str =
      b.rule("string", {{b.byte('"'), *b.repeat("chars", {str_char}, 0, 6), b.byte('"')}});
  const Element ws = b.optional("ws", {b.byte(' ')});
  const Element member = b.rule("member", {{str, b.byte(':'), ws, GrammarBuilder::ref(value)}});
  const Element members = *b.repeat("more", {b.byte(','), ws, member}, 0, kUnbounded);
  const Element object =
      b.rule("object", {{b.byte('{'), b.optional("body", {member, members}), b.byte('}')}});
  const Element array = b.rule(
      "array",
      {{b.byte('['),
        b.optional("items", {GrammarBuilder::ref(value),
                             *b.repeat("rest", {b.byte(','), GrammarBuilder::ref(value)}, 0, 3)}),
        b.byte(']')}});
  b.define(value, {{object},
                   {array},
                   {str},
                   {number},
                   b.literal("true"),
                   b.literal("false"),
                   b.literal("null")});
  // root: a value, optionally a special separator and a second value.
  const Element root = b.rule("root", {{GrammarBuilder::ref(value)},
                                       {GrammarBuilder::ref(value), GrammarBuilder::special(sep),
                                        GrammarBuilder::ref(value)}});
  auto g = std::move(b).finish(root.value);
  EXPECT_TRUE(g.ok()) << g.message();
  return std::move(g).value();
}

std::vector<int32_t> symbols_of(const TokenTexts &t, const std::vector<int32_t> &tokens) {
  std::vector<int32_t> out;
  for (int32_t id : tokens) {
    if (t.special[size_t(id)]) {
      out.push_back(256 + id);
      continue;
    }
    for (char c : t.bytes[size_t(id)]) out.push_back(int32_t(uint8_t(c)));
  }
  return out;
}

TEST(GrammarMatcher, MasksEqualTryingEveryTokenAndSentencesAreTheGrammars) {
  std::mt19937 rng(11);
  size_t steps = 0, complete = 0, uncertain_seen = 0;
  for (int trial = 0; trial < 12; ++trial) {
    auto texts = random_vocabulary(rng, 300 + size_t(trial) * 40);
    auto vocab = std::make_shared<GrammarVocabulary>(texts);
    auto compiled = compile_grammar(json_like(sep_token(*texts)), vocab, {end_token(*texts)});
    ASSERT_TRUE(compiled.ok()) << compiled.message();
    GrammarMatcher m(*compiled);
    std::vector<int32_t> history;
    std::vector<uint64_t> bits;
    for (int step = 0; step < 60 && !m.finished(); ++step) {
      ASSERT_TRUE(m.fill_mask(bits).ok());
      std::vector<int32_t> allowed;
      for (size_t t = 0; t < texts->bytes.size(); ++t) {
        GrammarMatcher copy = m;
        const bool ok = copy.accept_token(int32_t(t));
        const bool bit = (bits[t >> 6] >> (t & 63)) & 1;
        ASSERT_EQ(bit, ok) << "token " << t << " '" << texts->bytes[t] << "' at step " << step
                           << " of trial " << trial;
        if (ok) allowed.push_back(int32_t(t));
      }
      // The same mask again comes from the cache and must not differ.
      std::vector<uint64_t> again;
      ASSERT_TRUE(m.fill_mask(again).ok());
      ASSERT_EQ(again, bits);
      ASSERT_FALSE(allowed.empty()) << "no token allowed at step " << step;
      // Prefer ending late, so that walks go deep.
      int32_t pick = allowed[rng() % allowed.size()];
      if (pick == end_token(*texts) && allowed.size() > 1 && step < 40)
        pick = allowed[(rng() % (allowed.size() - 1)) + (allowed[0] == pick ? 1 : 0)];
      const bool was_complete = m.can_end();
      ASSERT_TRUE(m.accept_token(pick));
      ++steps;
      if (pick == end_token(*texts) && !m.finished()) continue; // the grammar's own use
      if (m.finished()) {
        ASSERT_TRUE(was_complete);
        break;
      }
      history.push_back(pick);
      const std::vector<int32_t> symbols = symbols_of(*texts, history);
      auto ref = grammar_accepts_symbols(
          compiled.value() ? json_like(sep_token(*texts)) : Grammar{}, symbols);
      ASSERT_TRUE(ref.ok());
      EXPECT_EQ(m.can_end(), *ref) << "after " << history.size() << " tokens";
      complete += *ref;
    }
    const GrammarCompileStats stats = compile_stats(**compiled);
    uncertain_seen += stats.uncertain;
    EXPECT_GT(stats.computed_tables, 0u);
  }
  EXPECT_GT(steps, 300u);
  EXPECT_GT(complete, 10u);
  EXPECT_GT(uncertain_seen, 0u); // the walks exercised the run-time check
}

TEST(GrammarMatcher, RefusedInputLeavesTheStateAsItWas) {
  auto texts = std::make_shared<TokenTexts>();
  texts->bytes = {"{", "}", "\"a\"", ":", "1", "x"};
  texts->special.assign(texts->bytes.size(), 0);
  auto vocab = std::make_shared<GrammarVocabulary>(texts);
  auto compiled = compile_grammar(json_like(0), vocab, {});
  ASSERT_TRUE(compiled.ok()) << compiled.message();
  GrammarMatcher m(*compiled);
  EXPECT_TRUE(m.accept_bytes("{\"a\":"));
  EXPECT_FALSE(m.accept_bytes("1x"));
  EXPECT_FALSE(m.accept_token(5));
  EXPECT_TRUE(m.accept_token(4));
  EXPECT_FALSE(m.can_end());
  EXPECT_TRUE(m.accept_token(1));
  EXPECT_TRUE(m.can_end());
  EXPECT_FALSE(m.accept_token(1));
}

TEST(GrammarMatcher, LongOutputsStayCorrectAcrossCompaction) {
  // A right-recursive string keeps one stack whatever its length; nesting grows one: 50,000
  // brackets deep interns more nodes than the compaction threshold, most of them live.
  GrammarBuilder b;
  const uint32_t nest = b.declare("nest");
  b.define(nest, {{b.byte('['), GrammarBuilder::ref(nest), b.byte(']')}, {}});
  ByteSet lower;
  lower.set_range('a', 'z');
  const Element chars = *b.repeat("chars", {b.bytes(lower)}, 0, kUnbounded);
  const Element root =
      b.rule("root", {{b.byte('"'), chars, b.byte('"'), GrammarBuilder::ref(nest)}});
  auto grammar = std::move(b).finish(root.value);
  ASSERT_TRUE(grammar.ok()) << grammar.message();
  auto texts = std::make_shared<TokenTexts>();
  texts->bytes = {"\"", "ab", "c\"", "\"d", "E", "[", "]", "[[", "]]"};
  texts->special.assign(texts->bytes.size(), 0);
  auto compiled = compile_grammar(*grammar, std::make_shared<GrammarVocabulary>(texts), {});
  ASSERT_TRUE(compiled.ok());
  GrammarMatcher m(*compiled);
  ASSERT_TRUE(m.accept_token(0));
  std::vector<uint64_t> bits;
  for (int i = 0; i < 50000; ++i) ASSERT_TRUE(m.accept_token(1));
  ASSERT_TRUE(m.fill_mask(bits).ok());
  EXPECT_EQ(bits[0], uint64_t(0b00111)); // '"', "ab", 'c"' ; not '"d' nor 'E' nor brackets
  ASSERT_TRUE(m.accept_token(2));
  EXPECT_TRUE(m.can_end());
  const int depth = 140000;
  for (int i = 0; i < depth / 2; ++i) ASSERT_TRUE(m.accept_token(7)) << i; // "[["
  for (int step = 0; step < depth; ++step) {
    if (step % 997 == 0) {
      ASSERT_TRUE(m.fill_mask(bits).ok());
      // Inside: '[' and ']' (and "[[", and "]]" while two or more are open); never a quote.
      EXPECT_EQ(bits[0] & 0b000011111, 0u) << step;
      EXPECT_TRUE((bits[0] >> 6) & 1) << step;
      EXPECT_EQ(bool((bits[0] >> 8) & 1), depth - step >= 2) << step;
    }
    EXPECT_FALSE(m.can_end());
    ASSERT_TRUE(m.accept_token(6)) << step;
  }
  EXPECT_TRUE(m.can_end()); // one nest: nothing may follow
  EXPECT_FALSE(m.accept_token(6));
  EXPECT_FALSE(m.accept_token(5));
  EXPECT_TRUE(m.can_end());
}

} // namespace
} // namespace offgraph::sample
