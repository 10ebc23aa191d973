// Bounded repetitions' tables, derived from one counting walk per item (grammar_counted.cpp),
// against the matcher's own uncached walk: for random grammars of repetitions of every kind (byte
// set items, rule items, ambiguous items whose counts have gaps, nested repetitions, minimums,
// stars, repetitions side by side whose ends overlap), every token of a random vocabulary is
// tried on a copy of the matcher at each step and must be allowed exactly when the mask says so.
#include "sample/grammar_matcher.h"
#include "sample/json_schema.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <random>

namespace offgraph::sample {
namespace {

std::shared_ptr<const TokenTexts> repetition_vocabulary(std::mt19937 &rng, size_t n) {
  auto t = std::make_shared<TokenTexts>();
  const std::string alphabet = "abcdxyz\"(),";
  for (char c : alphabet) t->bytes.push_back(std::string(1, c));
  while (t->bytes.size() < n) {
    std::string s;
    const size_t len = 1 + rng() % (rng() % 4 ? 6 : 14); // some past a walk's cap of 8
    // Mostly letters, so that tokens span many iterations.
    for (size_t i = 0; i < len; ++i)
      s += rng() % 4 ? alphabet[rng() % 7] : alphabet[rng() % alphabet.size()];
    t->bytes.push_back(s);
  }
  t->bytes.push_back("<|end|>");
  t->special.assign(t->bytes.size(), 0);
  t->special.back() = 1;
  return t;
}

// item{m,n}: the item a byte set, a choice of literals, an ambiguous choice, or a nested
// repetition followed by a byte.
Element random_repetition(GrammarBuilder &b, std::mt19937 &rng, int depth) {
  Sequence item;
  switch (rng() % 4) {
  case 0: {
    ByteSet s;
    s.set_range('a', uint8_t('a' + rng() % 3));
    item = {b.bytes(s)};
    break;
  }
  case 1:
    item = {b.choice("lit", {b.literal("x"), b.literal("yz")})};
    break;
  case 2: // "ab" is one iteration or two; "xyz" one or three (a gap in the counts between)
    item = rng() % 2
               ? Sequence{b.choice("ambiguous", {b.literal("a"), b.literal("ab"), b.literal("b")})}
               : Sequence{b.choice(
                     "gapped", {b.literal("xyz"), b.literal("x"), b.literal("y"), b.literal("z")})};
    break;
  default:
    item = depth < 2 ? Sequence{random_repetition(b, rng, depth + 1), b.byte('c')}
                     : Sequence{b.byte('d')};
  }
  const uint32_t m = rng() % 4;
  const uint32_t n = rng() % 5 == 0 ? kUnbounded : m + rng() % 12;
  auto r = b.repeat("rep", item, m, n);
  EXPECT_TRUE(r.ok());
  return *r;
}

// Repetitions in the places a table's frames can hold them: quoted (the quote below), side by side
// (one's end overlaps the next one's start), at the end of the sentence (rooted), nested in rules
// whose ends read letters the repetition's items also start with, and inside a list (deep, with
// unknown frames below).
Grammar random_repetition_grammar(std::mt19937 &rng) {
  GrammarBuilder b;
  Sequence body;
  const int pieces = 1 + int(rng() % 3);
  ByteSet letters; // what may follow a repetition: overlapping its items' first bytes
  letters.set_range('a', 'd');
  for (int i = 0; i < pieces; ++i) {
    switch (rng() % 3) {
    case 0:
      body.push_back(b.byte('"'));
      body.push_back(random_repetition(b, rng, 0));
      body.push_back(b.byte('"'));
      break;
    case 1:
      body.push_back(random_repetition(b, rng, 0));
      break;
    default: // nested in rules that end on a letter: frames below the repetition read on
      body.push_back(b.rule(
          "deep",
          {{b.byte('('), b.rule("deeper", {{random_repetition(b, rng, 0), b.bytes(letters)}}),
            b.bytes(letters)}}));
      body.push_back(*b.repeat("rest", {b.bytes(letters)}, 0, kUnbounded));
    }
  }
  if (rng() % 2) {
    const Element inner = b.rule("inner", {std::move(body)});
    body = {b.byte('('), inner,
            *b.repeat("more", {b.byte(','), inner}, 0, rng() % 2 ? kUnbounded : 2), b.byte(')')};
  }
  const Element root = b.rule("root", {std::move(body)});
  auto g = std::move(b).finish(root.value);
  EXPECT_TRUE(g.ok()) << g.message();
  return std::move(g).value();
}

// The tokens the matcher takes, each tried on a copy; its mask must say the same of each.
std::vector<int32_t> allowed_checking_mask(const GrammarMatcher &m, const TokenTexts &texts,
                                           const std::string &where) {
  GrammarMatcher probe = m;
  std::vector<uint64_t> bits;
  EXPECT_TRUE(probe.fill_mask(bits).ok()) << where;
  std::vector<int32_t> allowed;
  for (size_t t = 0; t < texts.bytes.size(); ++t) {
    GrammarMatcher copy = m;
    const bool ok = copy.accept_token(int32_t(t));
    EXPECT_EQ(bool((bits[t >> 6] >> (t & 63)) & 1), ok)
        << "token " << t << " '" << texts.bytes[t] << "' " << where;
    if (ok) allowed.push_back(int32_t(t));
  }
  return allowed;
}

// Walks `grammar` for up to `steps` random allowed tokens, checking every mask against trying
// each token; counts the masks checked.
void check_masks(const std::shared_ptr<const CompiledGrammar> &grammar, const TokenTexts &texts,
                 std::mt19937 &rng, int steps, size_t &checked) {
  GrammarMatcher m(grammar);
  for (int step = 0; step < steps && !m.finished(); ++step) {
    const std::vector<int32_t> allowed =
        allowed_checking_mask(m, texts, "at step " + std::to_string(step));
    if (::testing::Test::HasFailure()) return;
    ++checked;
    ASSERT_FALSE(allowed.empty()) << "step " << step;
    // Prefer going on to ending, so that the counts run down.
    int32_t pick = allowed[rng() % allowed.size()];
    if (texts.special[size_t(pick)] && allowed.size() > 1) pick = allowed[0];
    ASSERT_TRUE(m.accept_token(pick));
  }
}

TEST(CountedTables, MasksEqualTheUncachedWalkForRandomRepetitions) {
  std::mt19937 rng(2026);
  size_t checked = 0, counted = 0, walks = 0;
  for (int trial = 0; trial < 60; ++trial) {
    auto texts = repetition_vocabulary(rng, 160 + size_t(trial) * 4);
    auto vocab = std::make_shared<GrammarVocabulary>(texts);
    const Grammar grammar = random_repetition_grammar(rng);
    auto compiled = compile_grammar(grammar, vocab, {int32_t(texts->bytes.size() - 1)});
    ASSERT_TRUE(compiled.ok()) << compiled.message();
    SCOPED_TRACE("trial " + std::to_string(trial) + ": " + grammar.to_text());
    for (int walk = 0; walk < 3; ++walk) check_masks(*compiled, *texts, rng, 40, checked);
    const GrammarCompileStats stats = compile_stats(**compiled);
    counted += stats.counted_tables;
    walks += stats.counting_walks;
  }
  EXPECT_GT(checked, 2000u);
  EXPECT_GT(counted, 1000u); // the derived tables were exercised, at many counts per walk
  EXPECT_GT(counted, walks);
}

// A string with maxLength walks the vocabulary no more than a string without one (once per
// context, whatever the count), and a grammar with a lower bound on the same item, or the same,
// walks it not at all after one with a higher bound, or none.
TEST(CountedTables, OneWalkServesEveryCountAndEveryGrammar) {
  std::mt19937 rng(7);
  auto texts = repetition_vocabulary(rng, 400);
  auto compile = [&](const char *schema, std::shared_ptr<const GrammarVocabulary> vocab) {
    auto g = json_schema_grammar(nlohmann::ordered_json::parse(schema));
    EXPECT_TRUE(g.ok()) << g.message();
    auto c = compile_grammar(std::move(g).value(), vocab, {int32_t(texts->bytes.size() - 1)});
    EXPECT_TRUE(c.ok()) << c.message();
    return *c;
  };
  auto walk_string = [&](const std::shared_ptr<const CompiledGrammar> &g, size_t letters) {
    GrammarMatcher m(g);
    std::vector<uint64_t> bits;
    ASSERT_TRUE(m.accept_bytes("\""));
    for (size_t i = 0; i < letters; ++i) {
      ASSERT_TRUE(m.fill_mask(bits).ok());
      ASSERT_TRUE(m.accept_bytes(i % 2 ? "a" : "\xC3\xA9")) << i; // also a two-byte code point
    }
    ASSERT_TRUE(m.fill_mask(bits).ok());
    ASSERT_TRUE(m.accept_bytes("\""));
    EXPECT_TRUE(m.can_end());
  };
  auto bounded =
      compile(R"({"type": "string", "maxLength": 30})", std::make_shared<GrammarVocabulary>(texts));
  walk_string(bounded, 30);
  const size_t walks = compile_stats(*bounded).counting_walks;
  EXPECT_GT(walks, 0u);
  EXPECT_GE(compile_stats(*bounded).counted_tables, 30u); // a table per count, none walked

  // As a server warms up: an unbounded string first, whose walks serve every bound after it.
  auto vocab = std::make_shared<GrammarVocabulary>(texts);
  auto unbounded = compile(R"({"type": "string"})", vocab);
  walk_string(unbounded, 30);
  EXPECT_EQ(compile_stats(*unbounded).counting_walks, walks);
  auto second = compile(R"({"type": "string", "maxLength": 30})", vocab);
  walk_string(second, 30);
  auto third = compile(R"({"type": "string", "minLength": 3, "maxLength": 12})", vocab);
  walk_string(third, 12);
  EXPECT_EQ(compile_stats(*second).counting_walks, 0u);
  EXPECT_EQ(compile_stats(*third).counting_walks, 0u);
  EXPECT_GE(compile_stats(*third).counted_tables, 12u);
  // A bound walks capped (paths past 16 iterations are not followed) and serves lower bounds.
  auto vocab2 = std::make_shared<GrammarVocabulary>(texts);
  auto fourth = compile(R"({"type": "string", "maxLength": 16})", vocab2);
  walk_string(fourth, 16);
  auto fifth = compile(R"({"type": "string", "maxLength": 9})", vocab2);
  walk_string(fifth, 9);
  EXPECT_EQ(compile_stats(*fourth).counting_walks, walks);
  EXPECT_EQ(compile_stats(*fifth).counting_walks, 0u);
}

std::shared_ptr<const TokenTexts> listed_vocabulary(std::vector<std::string> tokens) {
  auto t = std::make_shared<TokenTexts>();
  t->bytes = std::move(tokens);
  t->bytes.push_back("<|end|>");
  t->special.assign(t->bytes.size(), 0);
  t->special.back() = 1;
  return t;
}

std::shared_ptr<const CompiledGrammar> compiled(const Grammar &g,
                                                std::shared_ptr<const GrammarVocabulary> v) {
  auto c = compile_grammar(g, v, {int32_t(v->size() - 1)});
  EXPECT_TRUE(c.ok()) << c.message();
  return *c;
}

// A real star (K ::= Q K | "") has a counting rule's code; a context holding one in a frame that
// is no repetition's place must not share the counting walk of a context that counts it.
TEST(CountedTables, ARealStarDoesNotShareACountingWalk) {
  auto a = [] { // U ::= RA "y" K2 ; RA ::= Q Q ; Q ::= "x" "z" ; K2 ::= "y" K2 | ""
    GrammarBuilder b;
    const Element q = b.rule("Q", {{b.byte('x'), b.byte('z')}});
    const Element ra = b.rule("RA", {{q, q}});
    const uint32_t k2 = b.declare("K2");
    b.define(k2, {{b.byte('y'), GrammarBuilder::ref(k2)}, {}});
    const Element u = b.rule("U", {{ra, b.byte('y'), GrammarBuilder::ref(k2)}});
    return *std::move(b).finish(u.value);
  }();
  auto b_grammar =
      [] { // RB ::= V "yyy" ; V ::= W K ; W ::= "w" "z" ; K ::= QB K | "" ; QB ::= "xz"
        GrammarBuilder b;
        const Element w = b.rule("W", {{b.byte('w'), b.byte('z')}});
        const Element qb = b.rule("QB", {{b.byte('x'), b.byte('z')}});
        const uint32_t k = b.declare("K");
        b.define(k, {{qb, GrammarBuilder::ref(k)}, {}});
        const Element v = b.rule("V", {{w, GrammarBuilder::ref(k)}});
        const Element rb = b.rule("RB", {{v, b.byte('y'), b.byte('y'), b.byte('y')}});
        return *std::move(b).finish(rb.value);
      }();
  auto texts = listed_vocabulary({"w", "x", "y", "z", "zy", "zyy", "zxz", "zxzy", "yy"});
  for (int order = 0; order < 2; ++order) {
    auto vocab = std::make_shared<GrammarVocabulary>(texts);
    for (int k = 0; k < 2; ++k) {
      const bool first_a = (k == 0) == (order == 0);
      GrammarMatcher m(compiled(first_a ? a : b_grammar, vocab));
      ASSERT_TRUE(m.accept_bytes(first_a ? "x" : "w"));
      allowed_checking_mask(
          m, *texts, std::string(first_a ? "A" : "B") + " in order " + std::to_string(order));
    }
  }
}

// A walk whose code is too long to share is this grammar's own, keyed also by what may follow:
// the same repetition place reached from two rules followed by different bytes.
TEST(CountedTables, UnsharedWalksKeepTheirFollowSets) {
  GrammarBuilder b;
  const Element big = b.rule("Big", {Sequence(300, b.byte('q')), {}}); // a key past 8 KiB
  const Element d = b.rule("D", {{b.byte('d'), b.byte('e')}});
  const Element a = b.rule("A", {{d, b.byte('k'), big}});
  const Element r1 = b.rule("R1", {{a, b.byte('x'), b.byte('x')}});
  const Element r2 = b.rule("R2", {{a, b.byte('x'), b.byte('x')}});
  const Element root = b.rule("root", {{b.byte('('), r1, b.byte('a'), b.byte(')')},
                                       {b.byte('['), r2, b.byte('b'), b.byte(']')}});
  const Grammar g = *std::move(b).finish(root.value);
  auto texts = listed_vocabulary({"e", "ek", "ekx", "ekxx", "ekxxa", "ekxxb", "ekxxx", "a", "b"});
  for (int order = 0; order < 2; ++order) {
    auto c = compiled(g, std::make_shared<GrammarVocabulary>(texts));
    for (const char *prefix : {order ? "[d" : "(d", order ? "(d" : "[d"}) {
      GrammarMatcher m(c);
      ASSERT_TRUE(m.accept_bytes(prefix));
      allowed_checking_mask(m, *texts, std::string("after ") + prefix);
    }
  }
}

// An item of one or three bytes ("xyz" | "x" | "y" | "z"): a token's exits can skip counts (one
// "xyz" or three letters), so it is sorted on the real stack where the counts fall in the gap.
TEST(CountedTables, CountsWithGapsAreExact) {
  std::mt19937 rng(5);
  std::vector<std::string> tokens{"x",    "y",      "z",       "w",     "xxyzw",
                                  "xyzw", "xxyzxw", "xyzxyzw", "xxxyzw"};
  const std::string letters = "xyzw";
  while (tokens.size() < 400) {
    std::string s;
    for (size_t i = 0, n = 1 + rng() % 8; i < n; ++i) s += letters[rng() % 4];
    tokens.push_back(s);
  }
  auto texts = listed_vocabulary(tokens);
  size_t checked = 0, counted = 0;
  for (uint32_t m = 0; m <= 4; ++m)
    for (uint32_t n : {m, m + 1, m + 2, m + 5, kUnbounded}) {
      if (n == 0) continue;
      GrammarBuilder b;
      const Element x =
          b.choice("X", {b.literal("xyz"), b.literal("x"), b.literal("y"), b.literal("z")});
      const Element root = b.rule("root", {{*b.repeat("rep", {x}, m, n), b.byte('w')}});
      auto c =
          compiled(*std::move(b).finish(root.value), std::make_shared<GrammarVocabulary>(texts));
      for (int walk = 0; walk < 20; ++walk) {
        GrammarMatcher g(c);
        for (int step = 0; step < 12 && !g.finished(); ++step) {
          const std::vector<int32_t> allowed = allowed_checking_mask(
              g, *texts,
              "{" + std::to_string(m) + "," + std::to_string(n) + "} step " + std::to_string(step));
          if (HasFailure()) return;
          ++checked;
          if (allowed.empty()) break;
          // Mostly short tokens, so that the counts run down slowly.
          int32_t pick = allowed[rng() % allowed.size()];
          for (int tries = 0; tries < 3 && texts->bytes[size_t(pick)].size() > 2; ++tries)
            pick = allowed[rng() % allowed.size()];
          ASSERT_TRUE(g.accept_token(pick));
        }
      }
      counted += compile_stats(*c).counted_tables;
    }
  EXPECT_GT(checked, 1000u);
  EXPECT_GT(counted, 50u);
}

// Walks are capped at a power of two from 8 (counting_cap): tokens of runs as long as the cap and
// past it, at every count of bounds around it.
TEST(CountedTables, CappedWalksAreExactAtTheCap) {
  std::vector<std::string> tokens{"\"", "b"};
  for (size_t k = 1; k <= 20; ++k) {
    tokens.push_back(std::string(k, 'a'));
    tokens.push_back(std::string(k, 'a') + "\""); // ends the repetition after k
  }
  auto texts = listed_vocabulary(tokens);
  size_t checked = 0;
  for (uint32_t n : {7u, 8u, 9u, 15u, 16u, 17u}) {
    for (uint32_t m : {0u, n}) {
      GrammarBuilder b;
      const Element root =
          b.rule("root", {{b.byte('"'), *b.repeat("as", {b.byte('a')}, m, n), b.byte('"')}});
      auto c =
          compiled(*std::move(b).finish(root.value), std::make_shared<GrammarVocabulary>(texts));
      GrammarMatcher g(c);
      ASSERT_TRUE(g.accept_bytes("\""));
      for (uint32_t i = 0; i <= n; ++i) {
        allowed_checking_mask(g, *texts,
                              "{" + std::to_string(m) + "," + std::to_string(n) + "} after " +
                                  std::to_string(i));
        if (HasFailure()) return;
        ++checked;
        if (i < n) {
          ASSERT_TRUE(g.accept_bytes("a"));
        }
      }
    }
  }
  EXPECT_EQ(checked, 2u * (8 + 9 + 10 + 16 + 17 + 18));
}

// Past kMaxRepeatBound the JSON Schema compiler splits a bound into blocks of 10,000 copies, so
// that a string's start is inside a block whose end no token can reach: those places are walked
// without the paths that leave the repetition, and the masks stay exact.
TEST(CountedTables, BlocksNoTokenCanFinishAreExact) {
  std::mt19937 rng(9);
  auto texts = repetition_vocabulary(rng, 300);
  auto vocab = std::make_shared<GrammarVocabulary>(texts);
  for (const char *schema : {R"({"type": "string", "maxLength": 25000})",
                             R"({"type": "string", "minLength": 10005, "maxLength": 30000})"}) {
    auto g = json_schema_grammar(nlohmann::ordered_json::parse(schema));
    ASSERT_TRUE(g.ok()) << g.message();
    auto c = compiled(*g, vocab);
    GrammarMatcher m(c);
    ASSERT_TRUE(m.accept_bytes("\""));
    for (int step = 0; step < 12; ++step) {
      allowed_checking_mask(m, *texts, std::string(schema) + " step " + std::to_string(step));
      if (HasFailure()) return;
      ASSERT_TRUE(m.accept_bytes(step % 3 ? "ab" : "x"));
    }
    EXPECT_GT(compile_stats(*c).counted_tables, 0u);
  }
}

// A token some of whose paths leave the frames early, at one count, while others leave where
// the walk stops, at another (the second review's case): both counts must make it uncertain.
TEST(CountedTables, PathsLeavingWhereTheWalkStopsKeepTheirCounts) {
  GrammarBuilder b;
  ByteSet abc, cd, ad;
  abc.set_range('a', 'c');
  cd.set_range('c', 'd');
  ad.set_range('a', 'd');
  const Element r = *b.repeat("R", {b.bytes(abc)}, 3, 3);
  const Element q = b.rule("Q", {{b.byte('['), r, b.bytes(abc)}});
  const Element p = b.rule("P", {{b.byte('('), q, b.bytes(cd)}});
  const Element rest = *b.repeat("rest", {b.bytes(ad)}, 0, kUnbounded);
  const Element root = b.rule("root", {{b.byte('<'), p, rest, b.byte('>')}});
  auto texts = listed_vocabulary(
      {"a", "b", "c", "d", ">", "aacada", "aacadd", "aacad>", "aaac", "aaacd", "aaacdab>", "abab"});
  GrammarMatcher m(
      compiled(*std::move(b).finish(root.value), std::make_shared<GrammarVocabulary>(texts)));
  ASSERT_TRUE(m.accept_bytes("<(["));
  const std::vector<int32_t> allowed = allowed_checking_mask(m, *texts, "after <([");
  EXPECT_NE(std::find(allowed.begin(), allowed.end(), 5), allowed.end()); // "aacada"
}

// Paths out of a repetition are dropped only where its minimum is past the longest token: at the
// longest token itself the exit after it is still a path.
TEST(CountedTables, ExitsAreKeptUpToTheLongestToken) {
  auto texts = listed_vocabulary({"\"", "a", "aa", "aaa", "aaaaaa"}); // the longest: 6 bytes
  for (uint32_t n : {5u, 6u, 7u}) {
    GrammarBuilder b;
    const Element root =
        b.rule("root", {{b.byte('"'), *b.repeat("as", {b.byte('a')}, n, n), b.byte('"')}});
    GrammarMatcher m(
        compiled(*std::move(b).finish(root.value), std::make_shared<GrammarVocabulary>(texts)));
    ASSERT_TRUE(m.accept_bytes("\""));
    allowed_checking_mask(m, *texts, "{" + std::to_string(n) + "}");
  }
}

} // namespace
} // namespace offgraph::sample
