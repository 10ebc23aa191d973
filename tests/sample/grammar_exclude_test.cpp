// exclude_substrings against its definition, checked by the Earley recognizer: a string is a
// sentence of the result exactly when it is one of the grammar and holds no forbidden string.
// Random grammars over a small alphabet (so that forbidden strings occur often), random strings
// and sentences drawn from the grammar; overlapping forbidden strings, where a naive automaton
// without failure links misses one inside another.
#include "sample/gbnf.h"
#include "sample/grammar_exclude.h"
#include "sample/grammar_matcher.h"

#include <gtest/gtest.h>

#include <random>

namespace offgraph::sample {
namespace {

constexpr char kAlphabet[] = {'<', '|', 'a', '/', 'b'};

bool holds_any(std::string_view s, const std::vector<std::string> &forbidden) {
  for (const std::string &f : forbidden)
    if (s.find(f) != std::string_view::npos) return true;
  return false;
}

bool accepts(const Grammar &g, std::string_view s) {
  auto r = grammar_accepts(g, s);
  EXPECT_TRUE(r.ok()) << r.message();
  return r.ok() && *r;
}

// Rules refer only to later rules (no left recursion), plus one unbounded repetition so that
// sentences can be long.
Grammar random_grammar(std::mt19937 &rng) {
  GrammarBuilder b;
  constexpr int kRules = 5;
  std::vector<uint32_t> ids;
  for (int r = 0; r < kRules; ++r) ids.push_back(b.declare("r" + std::to_string(r)));
  for (int r = kRules - 1; r >= 0; --r) {
    std::vector<Sequence> alternatives;
    const int n_alt = 1 + int(rng() % 3);
    for (int a = 0; a < n_alt; ++a) {
      Sequence seq;
      const int len = int(rng() % 4);
      for (int i = 0; i < len; ++i) {
        const int pick = int(rng() % 4);
        if (pick == 0 && r + 1 < kRules) {
          seq.push_back(GrammarBuilder::ref(ids[size_t(r + 1 + int(rng() % (kRules - r - 1)))]));
        } else if (pick == 1) {
          ByteSet set;
          for (char c : kAlphabet)
            if (rng() % 2) set.set(uint8_t(c));
          if (set.empty()) set.set('a');
          seq.push_back(b.bytes(set));
        } else {
          seq.push_back(b.byte(uint8_t(kAlphabet[rng() % 5])));
        }
      }
      if (a == 0 && r == kRules - 1 && seq.empty()) seq.push_back(b.byte('b'));
      alternatives.push_back(std::move(seq));
    }
    if (r == 1) { // a star over the next rule's language (never empty: no left recursion)
      auto star = b.repeat("star", {GrammarBuilder::ref(ids[2]), b.byte('a')}, 0, kUnbounded);
      alternatives.push_back({*star, b.byte('|')});
    }
    b.define(ids[size_t(r)], std::move(alternatives));
  }
  auto g = std::move(b).finish(ids[0]);
  EXPECT_TRUE(g.ok()) << g.message();
  return std::move(g).value();
}

// A random derivation from rule r, bounded in depth (a dead end gives up: nullopt).
std::optional<std::string> derive(const Grammar &g, uint32_t r, std::mt19937 &rng, int depth) {
  if (depth > 12) return std::nullopt;
  const auto &alts = g.rules[r].alternatives;
  const Sequence &seq = alts[rng() % alts.size()];
  std::string out;
  for (const Element &e : seq) {
    if (e.kind == Element::Kind::kRule) {
      auto part = derive(g, e.value, rng, depth + 1);
      if (!part) return std::nullopt;
      out += *part;
      continue;
    }
    std::vector<uint8_t> options;
    for (int c = 0; c < 256; ++c)
      if (g.byte_sets[e.value].test(uint8_t(c))) options.push_back(uint8_t(c));
    out.push_back(char(options[rng() % options.size()]));
  }
  return out;
}

void check_against_definition(const std::vector<std::string> &forbidden, uint32_t seed) {
  std::mt19937 rng(seed);
  int sentences = 0, kept = 0;
  for (int trial = 0; trial < 100; ++trial) {
    const Grammar g = random_grammar(rng);
    auto filtered = exclude_substrings(g, forbidden);
    if (!filtered.ok()) {
      // Only when nothing survives: then no drawn sentence may be free of the strings.
      EXPECT_NE(filtered.message().find("matches nothing"), std::string::npos)
          << filtered.message();
      for (int i = 0; i < 50; ++i) {
        if (auto s = derive(g, g.root, rng, 0)) {
          EXPECT_TRUE(holds_any(*s, forbidden)) << *s;
        }
      }
      continue;
    }
    for (int i = 0; i < 120; ++i) {
      std::string s;
      if (i % 2 == 0) {
        auto d = derive(g, g.root, rng, 0);
        if (!d) continue;
        s = *d;
      } else {
        const int len = int(rng() % 8);
        for (int k = 0; k < len; ++k) s.push_back(kAlphabet[rng() % 5]);
      }
      const bool in_g = accepts(g, s);
      const bool want = in_g && !holds_any(s, forbidden);
      EXPECT_EQ(accepts(*filtered, s), want) << "'" << s << "' trial " << trial;
      sentences += in_g;
      kept += want;
    }
  }
  // The draws must exercise both sides, or the comparison proves nothing.
  EXPECT_GT(kept, 100);
  EXPECT_GT(sentences - kept, 40) << kept << " kept of " << sentences;
}

TEST(ExcludeSubstrings, KeepsExactlyTheSentencesWithoutTheStrings) {
  check_against_definition({"<|"}, 1);
  check_against_definition({"<|", "</a", "<a/"}, 2);
}

TEST(ExcludeSubstrings, FindsAStringInsideAnother) {
  // "ab" inside "<ab/": read on the way to the longer string, the automaton must see it through
  // its failure links.
  check_against_definition({"<ab/", "ab", "b|b"}, 3);
  check_against_definition({"a|b<", "|b"}, 5);
  check_against_definition({"aaa", "a<a"}, 4);
}

TEST(ExcludeSubstrings, ASpecialTokenBreaksTheText) {
  GrammarBuilder b;
  const Element root = b.rule(
      "root", {{b.byte('<'), GrammarBuilder::special(7), b.byte('|')}, {b.byte('<'), b.byte('|')}});
  const Grammar g = *std::move(b).finish(root.value);
  auto f = exclude_substrings(g, std::vector<std::string>{"<|"});
  ASSERT_TRUE(f.ok()) << f.message();
  const std::vector<int32_t> with_special = {'<', 256 + 7, '|'};
  EXPECT_TRUE(*grammar_accepts_symbols(*f, with_special));
  EXPECT_FALSE(accepts(*f, "<|"));
}

TEST(ExcludeSubstrings, RefusesWhatItCannotDo) {
  GrammarBuilder b;
  const Element root = b.rule("root", {b.literal("x<|y")});
  const Grammar g = *std::move(b).finish(root.value);
  auto none = exclude_substrings(g, std::vector<std::string>{"<|"});
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.message().find("matches nothing"), std::string::npos) << none.message();
  EXPECT_FALSE(exclude_substrings(g, std::vector<std::string>{}).ok());
  EXPECT_FALSE(exclude_substrings(g, std::vector<std::string>{""}).ok());
  EXPECT_FALSE(exclude_substrings(g, std::vector<std::string>{std::string(64, 'a')}).ok());
}

} // namespace
} // namespace offgraph::sample

namespace offgraph::sample {
namespace {
// Found by fuzz.grammar (gbnf_list_excluded): the matcher's masks on an excluded grammar must
// allow only tokens it then accepts, however deep the nesting.
TEST(ExcludeSubstrings, MasksOfTheResultAreTheMatchersOwn) {
  auto t = std::make_shared<TokenTexts>();
  for (int b = 0; b < 256; ++b) t->bytes.push_back(std::string(1, char(b)));
  for (const char *p : {"{\"", "\":", "\",",  "\"}", "true", "false", "null", "12", "-0.",
                        "e+",  "\n ", ", \"", "[]",  "{}",   "\\u00", "é",    "ab", "root",
                        "::=", "a\"", "\"a",  "(a",  "b)",   ",(",    "<|"})
    t->bytes.push_back(p);
  t->bytes.push_back("<|end|>");
  t->special.assign(t->bytes.size(), 0);
  t->special.back() = 1;
  auto vocab = std::make_shared<GrammarVocabulary>(t);
  const Grammar g = *parse_gbnf("root ::= item (\",\" item)*\nitem ::= [a-z]+ | \"(\" root \")\"");
  auto f = exclude_substrings(g, std::vector<std::string>{"<|", "ab"});
  ASSERT_TRUE(f.ok()) << f.message();
  const int32_t end = int32_t(t->bytes.size() - 1);
  auto compiled = compile_grammar(*f, vocab, {end});
  ASSERT_TRUE(compiled.ok()) << compiled.message();
  // Deep nesting stays one parse: a guess per end state at each level would multiply the stacks
  // past the matcher's limit (the fuzzer's finding: 3 states, 8 levels).
  {
    GrammarMatcher deep(*compiled);
    std::vector<uint64_t> bits;
    for (int level = 0; level < 40; ++level) {
      ASSERT_TRUE(deep.fill_mask(bits).ok()) << level;
      ASSERT_TRUE((bits['(' >> 6] >> ('(' & 63)) & 1) << level;
      ASSERT_TRUE(deep.accept_bytes("(")) << level;
    }
    ASSERT_TRUE(deep.accept_bytes("ba" + std::string(40, ')')));
    EXPECT_FALSE(GrammarMatcher(deep).accept_bytes(",ab"));
    EXPECT_TRUE(deep.can_end());
  }
  std::mt19937 rng(11);
  for (int walk = 0; walk < 300; ++walk) {
    GrammarMatcher m(*compiled);
    std::string text;
    std::vector<uint64_t> bits;
    for (int step = 0; step < 30 && !m.finished(); ++step) {
      ASSERT_TRUE(m.fill_mask(bits).ok());
      std::vector<int32_t> allowed;
      for (size_t k = 0; k < vocab->size(); ++k)
        if ((bits[k >> 6] >> (k & 63)) & 1) {
          GrammarMatcher probe(m);
          EXPECT_TRUE(probe.accept_token(int32_t(k)))
              << "after '" << text << "' the mask allows '" << t->bytes[k] << "'";
          allowed.push_back(int32_t(k));
        }
      if (allowed.empty()) break;
      const int32_t pick = allowed[rng() % allowed.size()];
      ASSERT_TRUE(m.accept_token(pick));
      if (pick != end) text += t->bytes[size_t(pick)];
    }
    if (::testing::Test::HasFailure()) return;
  }
}
} // namespace
} // namespace offgraph::sample

namespace offgraph::sample {
namespace {
// A rule right after a nested rule (e ::= "(" e f): the mid states must still share one parse, or
// each level multiplies them (the review's case: stuck at level 12 with one forbidden string).
TEST(ExcludeSubstrings, NestingBeforeARuleStaysOneParse) {
  auto t = std::make_shared<TokenTexts>();
  for (int b = 0; b < 256; ++b) t->bytes.push_back(std::string(1, char(b)));
  t->bytes.push_back("<|end|>");
  t->special.assign(t->bytes.size(), 0);
  t->special.back() = 1;
  auto vocab = std::make_shared<GrammarVocabulary>(t);
  const Grammar g = *parse_gbnf("root ::= e\ne ::= \"(\" e f | \"x\"\nf ::= \"y\" | \"<\"");
  auto f = exclude_substrings(g, std::vector<std::string>{"<|", "</a"});
  ASSERT_TRUE(f.ok()) << f.message();
  auto compiled = compile_grammar(*f, vocab, {int32_t(t->bytes.size() - 1)});
  ASSERT_TRUE(compiled.ok()) << compiled.message();
  GrammarMatcher m(*compiled);
  ASSERT_TRUE(m.accept_bytes(std::string(30, '(') + "x"));
  std::string closing;
  for (int k = 0; k < 30; ++k) closing += k % 2 ? "y" : "<";
  ASSERT_TRUE(GrammarMatcher(m).accept_bytes(closing));
  EXPECT_TRUE(*grammar_accepts(*f, std::string(30, '(') + "x" + closing));
}

// A long chain of rules (what Lark's declaration order makes): built in one pass, and right.
TEST(ExcludeSubstrings, ALongChainOfRules) {
  std::string gbnf = "root ::= r0\n";
  constexpr int kRules = 3000;
  for (int i = 0; i < kRules; ++i)
    gbnf += "r" + std::to_string(i) + " ::= \"<\" r" + std::to_string(i + 1) + "\n";
  gbnf += "r" + std::to_string(kRules) + " ::= \"|\" | \"a\"\n";
  const Grammar g = *parse_gbnf(gbnf);
  auto f = exclude_substrings(g, std::vector<std::string>{"<|"});
  ASSERT_TRUE(f.ok()) << f.message();
  EXPECT_TRUE(*grammar_accepts(*f, std::string(kRules, '<') + "a"));
  EXPECT_FALSE(*grammar_accepts(*f, std::string(kRules, '<') + "|"));
}
} // namespace
} // namespace offgraph::sample
