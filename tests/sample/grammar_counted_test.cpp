// Bounded repetitions' tables, derived from one counting walk per item (grammar_counted.cpp),
// against the matcher's own uncached walk: for random grammars of repetitions of every kind (byte
// set items, rule items, ambiguous items whose counts have gaps, nested repetitions, minimums,
// stars, repetitions side by side whose ends overlap), every token of a random vocabulary is
// tried on a copy of the matcher at each step and must be allowed exactly when the mask says so.
#include "sample/grammar_matcher.h"
#include "sample/json_schema.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <random>

namespace offgraph::sample {
namespace {

std::shared_ptr<const TokenTexts> repetition_vocabulary(std::mt19937 &rng, size_t n) {
  auto t = std::make_shared<TokenTexts>();
  const std::string alphabet = "abcdxyz\"(),";
  for (char c : alphabet) t->bytes.push_back(std::string(1, c));
  while (t->bytes.size() < n) {
    std::string s;
    const size_t len = 1 + rng() % 6;
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
// (one's end overlaps the next one's start), at the end of the sentence (rooted), and inside a
// list (deep, with unknown frames below).
Grammar random_repetition_grammar(std::mt19937 &rng) {
  GrammarBuilder b;
  Sequence body;
  const int pieces = 1 + int(rng() % 3);
  for (int i = 0; i < pieces; ++i) {
    if (rng() % 2) {
      body.push_back(b.byte('"'));
      body.push_back(random_repetition(b, rng, 0));
      body.push_back(b.byte('"'));
    } else {
      body.push_back(random_repetition(b, rng, 0));
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

// Walks `grammar` for up to `steps` random allowed tokens, checking every mask against trying
// each token; counts the masks checked.
void check_masks(const std::shared_ptr<const CompiledGrammar> &grammar, const TokenTexts &texts,
                 std::mt19937 &rng, int steps, size_t &checked) {
  GrammarMatcher m(grammar);
  std::vector<uint64_t> bits;
  for (int step = 0; step < steps && !m.finished(); ++step) {
    ASSERT_TRUE(m.fill_mask(bits).ok());
    std::vector<int32_t> allowed;
    for (size_t t = 0; t < texts.bytes.size(); ++t) {
      GrammarMatcher copy = m;
      const bool ok = copy.accept_token(int32_t(t));
      ASSERT_EQ(bool((bits[t >> 6] >> (t & 63)) & 1), ok)
          << "token " << t << " '" << texts.bytes[t] << "' at step " << step;
      if (ok) allowed.push_back(int32_t(t));
    }
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
// context, whatever the count), and a second grammar with other bounds on the same item, or none,
// walks it not at all.
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
  auto unbounded = compile(R"({"type": "string"})", std::make_shared<GrammarVocabulary>(texts));
  walk_string(unbounded, 30);
  const size_t walks = compile_stats(*unbounded).counting_walks;
  EXPECT_GT(walks, 0u);

  auto vocab = std::make_shared<GrammarVocabulary>(texts);
  auto first = compile(R"({"type": "string", "maxLength": 30})", vocab);
  walk_string(first, 30);
  EXPECT_EQ(compile_stats(*first).counting_walks, walks);
  EXPECT_GE(compile_stats(*first).counted_tables, 30u); // a table per count, none walked
  auto second = compile(R"({"type": "string", "minLength": 3, "maxLength": 12})", vocab);
  walk_string(second, 12);
  auto third = compile(R"({"type": "string"})", vocab);
  walk_string(third, 12);
  EXPECT_EQ(compile_stats(*second).counting_walks, 0u);
  EXPECT_EQ(compile_stats(*third).counting_walks, 0u);
  EXPECT_GE(compile_stats(*second).counted_tables, 12u);
}

} // namespace
} // namespace offgraph::sample
