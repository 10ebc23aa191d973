// The grammar builder against direct definitions: code point classes against membership and the
// UTF-8 encoder, repetition against counting, validation against hand-made grammars.
#include "base/utf8.h"
#include "sample/grammar.h"

#include <gtest/gtest.h>

#include <random>

namespace offgraph::sample {
namespace {

Grammar one_element(GrammarBuilder b, Element e) {
  const Element root = b.rule("root", {{e}});
  auto g = std::move(b).finish(root.value);
  EXPECT_TRUE(g.ok()) << g.message();
  return std::move(g).value();
}

bool accepts(const Grammar &g, std::string_view text) {
  auto r = grammar_accepts(g, text);
  EXPECT_TRUE(r.ok()) << r.message();
  return r.ok() && *r;
}

std::string utf8(uint32_t cp) {
  std::string s;
  append_utf8(s, cp);
  return s;
}

TEST(Grammar, CodePointClassesMatchMembershipAsUtf8) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    std::vector<std::pair<uint32_t, uint32_t>> ranges;
    const int k = 1 + int(rng() % 4);
    for (int i = 0; i < k; ++i) {
      // Ranges around the encoding boundaries, where splitting goes wrong.
      const uint32_t edges[] = {0x7F, 0x800, 0xFFFF, 0xD800, 0x10000, 0x10FFFF, 0x41, 0x3000};
      const uint32_t edge = edges[rng() % 8];
      const uint32_t lo = edge - std::min<uint32_t>(edge, rng() % 100);
      const uint32_t hi = std::min<uint32_t>(0x10FFFF, lo + rng() % 70000);
      ranges.push_back({lo, hi});
    }
    const bool negated = rng() % 2;
    GrammarBuilder b;
    auto e = b.code_points(ranges, negated);
    ASSERT_TRUE(e.ok()) << e.message();
    const Grammar g = one_element(std::move(b), *e);
    auto member = [&](uint32_t cp) {
      if (cp >= 0xD800 && cp <= 0xDFFF) return false;
      bool in = false;
      for (auto [lo, hi] : ranges) in = in || (cp >= lo && cp <= hi);
      return in != negated;
    };
    for (int i = 0; i < 300; ++i) {
      uint32_t cp = rng() % 0x110000;
      if (i % 3 == 0) cp = ranges[size_t(i) % ranges.size()].first + (rng() % 3) - 1;
      if (cp > 0x10FFFF) continue;
      EXPECT_EQ(accepts(g, utf8(cp)), member(cp)) << std::hex << cp << " trial " << trial;
    }
  }
}

TEST(Grammar, AnyCodePointRefusesInvalidUtf8) {
  GrammarBuilder b;
  const Element any = b.any_code_point();
  const Grammar g = one_element(std::move(b), any);
  EXPECT_TRUE(accepts(g, "a"));
  EXPECT_TRUE(accepts(g, "\xC3\xA9"));
  EXPECT_TRUE(accepts(g, "\xF0\x9F\x98\x80"));
  EXPECT_TRUE(accepts(g, "\xEF\xBF\xBF"));
  EXPECT_FALSE(accepts(g, "\xC0\x80"));         // overlong NUL
  EXPECT_FALSE(accepts(g, "\xE0\x80\xAF"));     // overlong '/'
  EXPECT_FALSE(accepts(g, "\xED\xA0\x80"));     // a surrogate
  EXPECT_FALSE(accepts(g, "\xF4\x90\x80\x80")); // past U+10FFFF
  EXPECT_FALSE(accepts(g, "\x80"));
  EXPECT_FALSE(accepts(g, "ab"));
  EXPECT_FALSE(accepts(g, ""));
}

TEST(Grammar, RepetitionCountsExactly) {
  for (auto [min, max] : std::vector<std::pair<uint32_t, uint32_t>>{
           {0, kUnbounded}, {1, kUnbounded}, {3, kUnbounded}, {0, 1}, {2, 5}, {4, 4}, {0, 0}}) {
    GrammarBuilder b;
    Sequence item = b.literal("ab");
    auto e = b.repeat("r", item, min, max);
    ASSERT_TRUE(e.ok()) << e.message();
    const Grammar g = one_element(std::move(b), *e);
    for (uint32_t n = 0; n < 9; ++n) {
      std::string text;
      for (uint32_t i = 0; i < n; ++i) text += "ab";
      EXPECT_EQ(accepts(g, text), n >= min && (max == kUnbounded || n <= max))
          << min << ".." << max << " n=" << n;
      EXPECT_FALSE(accepts(g, text + "a"));
    }
  }
  GrammarBuilder b;
  EXPECT_FALSE(b.repeat("r", b.literal("a"), 3, 2).ok());
  EXPECT_FALSE(b.repeat("r", b.literal("a"), 0, kMaxRepeatBound + 1).ok());
}

TEST(Grammar, LeftRecursionIsRefusedEvenThroughEmptyRules) {
  {
    GrammarBuilder b;
    const uint32_t a = b.declare("a");
    b.define(a, {{GrammarBuilder::ref(a), b.byte('x')}, {b.byte('y')}});
    auto g = std::move(b).finish(a);
    ASSERT_FALSE(g.ok());
    EXPECT_NE(g.message().find("'a' is left-recursive"), std::string::npos) << g.message();
  }
  {
    GrammarBuilder b;
    const Element empty = b.rule("empty", {{}});
    const uint32_t a = b.declare("a");
    const Element c = b.rule("c", {{empty, GrammarBuilder::ref(a)}});
    b.define(a, {{c, b.byte('x')}, {b.byte('y')}});
    auto g = std::move(b).finish(a);
    ASSERT_FALSE(g.ok());
    EXPECT_NE(g.message().find("left-recursive"), std::string::npos) << g.message();
  }
  {
    // Right recursion is fine.
    GrammarBuilder b;
    const uint32_t a = b.declare("a");
    b.define(a, {{b.byte('x'), GrammarBuilder::ref(a)}, {}});
    auto g = std::move(b).finish(a);
    ASSERT_TRUE(g.ok()) << g.message();
    EXPECT_TRUE(accepts(*g, "xxx"));
    EXPECT_TRUE(accepts(*g, ""));
    EXPECT_FALSE(accepts(*g, "xy"));
  }
}

// nullable_rules against the naive fixpoint (sweep every rule until nothing changes) on random
// grammars, and on the chain that made the sweep quadratic.
TEST(Grammar, NullableRulesAreTheNaiveFixpoint) {
  auto naive = [](const Grammar &g) {
    std::vector<bool> nullable(g.rules.size(), false);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < g.rules.size(); ++r)
        for (const Sequence &alt : g.rules[r].alternatives) {
          bool all = !nullable[r];
          for (const Element &e : alt)
            all = all && e.kind == Element::Kind::kRule && nullable[e.value];
          if (all) nullable[r] = changed = true;
        }
    }
    return nullable;
  };
  std::mt19937 rng(3);
  size_t nullable_seen = 0, total = 0;
  for (int trial = 0; trial < 300; ++trial) {
    Grammar g;
    g.byte_sets.push_back(ByteSet{});
    g.byte_sets[0].set('a');
    const size_t n = 1 + rng() % 12;
    g.rules.resize(n);
    for (size_t r = 0; r < n; ++r) {
      g.rules[r].name = "r" + std::to_string(r);
      const size_t alts = 1 + rng() % 3;
      for (size_t a = 0; a < alts; ++a) {
        Sequence s;
        const size_t len = rng() % 4;
        for (size_t i = 0; i < len; ++i)
          s.push_back(rng() % 5 == 0 ? Element{Element::Kind::kBytes, 0}
                                     : Element{Element::Kind::kRule, uint32_t(rng() % n)});
        g.rules[r].alternatives.push_back(std::move(s));
      }
    }
    const std::vector<bool> got = nullable_rules(g), want = naive(g);
    ASSERT_EQ(got, want) << g.to_text();
    for (bool b : got) nullable_seen += b;
    total += n;
  }
  EXPECT_GT(nullable_seen, total / 5);
  EXPECT_LT(nullable_seen, total);
  // r0 ::= r1, r1 ::= r2, ..., the last ::= "": every rule is nullable. One request can send
  // this at the rule limit; a sweep in declaration order would need a pass per rule.
  Grammar chain;
  const size_t n = kMaxGrammarRules - 1;
  chain.rules.resize(n);
  for (size_t r = 0; r < n; ++r) {
    chain.rules[r].name = "c" + std::to_string(r);
    if (r + 1 < n)
      chain.rules[r].alternatives = {{Element{Element::Kind::kRule, uint32_t(r + 1)}}};
    else
      chain.rules[r].alternatives = {{}};
  }
  const std::vector<bool> all = nullable_rules(chain);
  EXPECT_EQ(std::count(all.begin(), all.end(), true), ptrdiff_t(n));
  EXPECT_TRUE(validate_grammar(chain).ok());
}

// follow_sets against the naive fixpoints (FIRST, then FOLLOW, sweeping until nothing changes) on
// random grammars with nullable rules, special tokens and several byte sets.
TEST(Grammar, FollowSetsAreTheNaiveFixpoint) {
  auto naive = [](const Grammar &g) {
    const size_t n = g.rules.size();
    const std::vector<bool> nullable = nullable_rules(g);
    std::vector<ByteSet> first(n), follow(n);
    auto unite = [](ByteSet &a, const ByteSet &b) {
      const ByteSet before = a;
      for (size_t w = 0; w < 4; ++w) a.bits[w] |= b.bits[w];
      return !(a == before);
    };
    auto first_of = [&](const Sequence &alt, size_t i, ByteSet &out) {
      for (; i < alt.size(); ++i) {
        if (alt[i].kind == Element::Kind::kBytes)
          return unite(out, g.byte_sets[alt[i].value]), false;
        if (alt[i].kind == Element::Kind::kSpecial) return false;
        unite(out, first[alt[i].value]);
        if (!nullable[alt[i].value]) return false;
      }
      return true;
    };
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r)
        for (const Sequence &alt : g.rules[r].alternatives) {
          ByteSet f;
          first_of(alt, 0, f);
          changed |= unite(first[r], f);
        }
    }
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r)
        for (const Sequence &alt : g.rules[r].alternatives)
          for (size_t i = 0; i < alt.size(); ++i) {
            if (alt[i].kind != Element::Kind::kRule) continue;
            ByteSet f;
            if (first_of(alt, i + 1, f)) unite(f, follow[r]);
            changed |= unite(follow[alt[i].value], f);
          }
    }
    return follow;
  };
  std::mt19937 rng(9);
  size_t nonempty = 0;
  for (int trial = 0; trial < 300; ++trial) {
    Grammar g;
    for (char c : std::string("abcd")) {
      g.byte_sets.push_back(ByteSet{});
      g.byte_sets.back().set(uint8_t(c));
    }
    const size_t n = 1 + rng() % 10;
    g.rules.resize(n);
    for (size_t r = 0; r < n; ++r) {
      g.rules[r].name = "r" + std::to_string(r);
      for (size_t a = 0, alts = 1 + rng() % 3; a < alts; ++a) {
        Sequence s;
        for (size_t i = 0, len = rng() % 4; i < len; ++i) {
          const unsigned k = rng() % 7;
          s.push_back(k < 3   ? Element{Element::Kind::kBytes, uint32_t(rng() % 4)}
                      : k < 4 ? Element{Element::Kind::kSpecial, 7}
                              : Element{Element::Kind::kRule, uint32_t(rng() % n)});
        }
        g.rules[r].alternatives.push_back(std::move(s));
      }
    }
    const std::vector<ByteSet> got = follow_sets(g), want = naive(g);
    ASSERT_EQ(got.size(), want.size());
    for (size_t r = 0; r < n; ++r) {
      ASSERT_TRUE(got[r] == want[r]) << "rule " << r << " of\n" << g.to_text();
      nonempty += !got[r].empty();
    }
  }
  EXPECT_GT(nonempty, 100u);
}

TEST(Grammar, UndefinedRulesAreNamed) {
  GrammarBuilder b;
  const uint32_t missing = b.declare("value");
  const Element root = b.rule("root", {{GrammarBuilder::ref(missing)}});
  auto g = std::move(b).finish(root.value);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.message().find("'value' is used but never defined"), std::string::npos);
}

TEST(Grammar, SpecialTokensAreNotTheirText) {
  GrammarBuilder b;
  Sequence s = b.literal("a");
  s.push_back(GrammarBuilder::special(7));
  const Element root = b.rule("root", {s});
  auto g = std::move(b).finish(root.value);
  ASSERT_TRUE(g.ok());
  const std::vector<int32_t> good{'a', 256 + 7}, wrong{'a', 256 + 8}, text{'a', '7'};
  EXPECT_TRUE(*grammar_accepts_symbols(*g, good));
  EXPECT_FALSE(*grammar_accepts_symbols(*g, wrong));
  EXPECT_FALSE(*grammar_accepts_symbols(*g, text));
  EXPECT_EQ(g->to_text(), "root ::= \"a\" <[7]>\n");
}

} // namespace
} // namespace offgraph::sample
