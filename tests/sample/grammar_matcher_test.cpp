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

// string ::= '"' ([a-z ] | "\\n"){0,6} '"'
Element string_rule(GrammarBuilder &b) {
  ByteSet chars;
  chars.set_range('a', 'z');
  chars.set(' ');
  const Element str_char = b.choice("char", {{b.bytes(chars)}, b.literal("\\n")});
  return b.rule("string", {{b.byte('"'), *b.repeat("chars", {str_char}, 0, 6), b.byte('"')}});
}

// value ::= object | array | string | number | "true" | "false" | "null", with recursion.
Grammar json_like(int32_t sep) {
  GrammarBuilder b;
  const uint32_t value = b.declare("value");
  ByteSet digit;
  digit.set_range('0', '9');
  const Element d = b.bytes(digit);
  const Element digits = *b.repeat("digits", {d}, 1, kUnbounded);
  const Element frac = b.optional("frac", {b.byte('.'), digits});
  const Element number = b.rule("number", {{b.optional("sign", {b.byte('-')}), digits, frac}});
  const Element str = string_rule(b);
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

// Grammars that use the same string rule where different bytes may follow it (FOLLOW sets
// narrower than, disjoint from and equal to json_like's).
std::vector<Grammar> grammars_sharing_a_string_rule(int32_t sep) {
  std::vector<Grammar> out{json_like(sep)};
  auto finish = [&out](GrammarBuilder &b, Sequence root) {
    const Element r = b.rule("root", {std::move(root)});
    auto g = std::move(b).finish(r.value);
    EXPECT_TRUE(g.ok()) << g.message();
    out.push_back(std::move(g).value());
  };
  { // "[" string ("," string)* "]"
    GrammarBuilder b;
    const Element s = string_rule(b);
    finish(b, {b.byte('['), s, *b.repeat("rest", {b.byte(','), s}, 0, kUnbounded), b.byte(']')});
  }
  { // string " " string, then optionally the special separator and "x"
    GrammarBuilder b;
    const Element s = string_rule(b);
    finish(b, {s, b.byte(' '), s, b.optional("tail", {GrammarBuilder::special(sep), b.byte('x')})});
  }
  out.push_back(json_like(sep)); // the same as the first: every table shared
  return out;
}

// Walks two compiled forms of one grammar side by side for up to `steps` tokens, each a random
// pick of the allowed ones: their masks must be equal at every step. Counts the steps compared.
void walk_together(const std::shared_ptr<const CompiledGrammar> &x,
                   const std::shared_ptr<const CompiledGrammar> &y, size_t n_vocab,
                   std::mt19937 &rng, int steps, size_t &compared) {
  GrammarMatcher a(x), b(y);
  std::vector<uint64_t> bits_a, bits_b;
  for (int step = 0; step < steps && !a.finished(); ++step) {
    ASSERT_TRUE(a.fill_mask(bits_a).ok());
    ASSERT_TRUE(b.fill_mask(bits_b).ok());
    ASSERT_EQ(bits_a, bits_b) << "step " << step;
    ++compared;
    std::vector<int32_t> allowed;
    for (size_t t = 0; t < n_vocab; ++t)
      if ((bits_a[t >> 6] >> (t & 63)) & 1) allowed.push_back(int32_t(t));
    ASSERT_FALSE(allowed.empty());
    const int32_t pick = allowed[rng() % allowed.size()];
    ASSERT_TRUE(a.accept_token(pick));
    ASSERT_TRUE(b.accept_token(pick));
  }
}

TEST(GrammarMatcher, TablesSharedThroughTheVocabularyGiveTheMasksOfFreshOnes) {
  std::mt19937 rng(23);
  size_t shared = 0, refined = 0, compared = 0;
  for (int trial = 0; trial < 6; ++trial) {
    auto texts = random_vocabulary(rng, 300 + size_t(trial) * 60);
    auto vocab = std::make_shared<GrammarVocabulary>(texts); // shared by every grammar below
    for (Grammar &grammar : grammars_sharing_a_string_rule(sep_token(*texts))) {
      auto warm = compile_grammar(grammar, vocab, {end_token(*texts)});
      auto fresh =
          compile_grammar(grammar, std::make_shared<GrammarVocabulary>(texts), {end_token(*texts)});
      ASSERT_TRUE(warm.ok() && fresh.ok());
      for (int walk = 0; walk < 3; ++walk) {
        SCOPED_TRACE("trial " + std::to_string(trial));
        walk_together(*warm, *fresh, texts->bytes.size(), rng, 40, compared);
        if (HasFatalFailure()) return;
      }
      const GrammarCompileStats stats = compile_stats(**warm);
      shared += stats.shared_tables;
      refined += stats.refined_tables;
    }
  }
  EXPECT_GT(compared, 500u);
  EXPECT_GT(shared, 0u);  // the same rules met again: tables taken as they are
  EXPECT_GT(refined, 0u); // a narrower FOLLOW: tables sorted again from a wider one
}

// The shared tables' budget (GrammarVocabulary::set_shared_table_budget, serve's --grammar-mib):
// under a budget of one byte only the most recent table key stays, far fewer bytes than without
// one, and the masks are still those of a fresh vocabulary.
TEST(GrammarMatcher, ASmallSharedTableBudgetKeepsLessAndTheSameMasks) {
  std::mt19937 rng(24);
  auto texts = random_vocabulary(rng, 400);
  size_t held[2] = {0, 0};
  for (const size_t budget : {size_t(1), size_t(1) << 30}) {
    auto vocab = std::make_shared<GrammarVocabulary>(texts);
    vocab->set_shared_table_budget(budget);
    EXPECT_EQ(vocab->shared_table_budget(), budget);
    for (Grammar &grammar : grammars_sharing_a_string_rule(sep_token(*texts))) {
      auto warm = compile_grammar(grammar, vocab, {end_token(*texts)});
      auto fresh =
          compile_grammar(grammar, std::make_shared<GrammarVocabulary>(texts), {end_token(*texts)});
      ASSERT_TRUE(warm.ok() && fresh.ok());
      SCOPED_TRACE("budget " + std::to_string(budget));
      size_t compared = 0;
      walk_together(*warm, *fresh, texts->bytes.size(), rng, 30, compared);
      if (HasFatalFailure()) return;
    }
    held[budget == 1 ? 0 : 1] = vocab->shared_table_bytes();
  }
  EXPECT_GT(held[1], 0u);
  EXPECT_LT(held[0], held[1]);
}

// A walk of ordinary tokens stops at a special token, so what follows one is no part of a table's
// key: free text that ends at a separator token has one table whatever comes after it.
TEST(GrammarMatcher, TextEndingAtASpecialTokenSharesItsTableAcrossGrammars) {
  std::mt19937 rng(5);
  auto texts = random_vocabulary(rng, 600);
  auto vocab = std::make_shared<GrammarVocabulary>(texts);
  const int32_t sep = sep_token(*texts);
  // root ::= text <|sep|> tail, text ::= [^{] text | ""
  auto grammar = [&](std::string_view tail) {
    GrammarBuilder b;
    ByteSet any;
    any.set_range(0, 255);
    any.bits['{' >> 6] &= ~(uint64_t(1) << ('{' & 63));
    const uint32_t text = b.declare("text");
    b.define(text, {{}, {b.bytes(any), GrammarBuilder::ref(text)}});
    Sequence root = {GrammarBuilder::ref(text), GrammarBuilder::special(sep)};
    const Sequence t = b.literal(tail);
    root.insert(root.end(), t.begin(), t.end());
    const Element r = b.rule("root", {root});
    auto g = std::move(b).finish(r.value);
    EXPECT_TRUE(g.ok());
    return std::move(g).value();
  };
  auto first_mask = [&](std::string_view tail, std::shared_ptr<const GrammarVocabulary> v) {
    auto c = compile_grammar(grammar(tail), std::move(v), {end_token(*texts)});
    EXPECT_TRUE(c.ok());
    GrammarMatcher m(*c);
    std::vector<uint64_t> bits;
    EXPECT_TRUE(m.fill_mask(bits).ok());
    return std::make_pair(bits, compile_stats(**c));
  };
  const auto [bits_a, a] = first_mask("ab", vocab);
  const auto [bits_b, b] = first_mask("xyz\n", vocab);
  const auto [bits_fresh, fresh] = first_mask("xyz\n", std::make_shared<GrammarVocabulary>(texts));
  EXPECT_GT(a.trie_nodes_walked, 0u);
  EXPECT_EQ(b.trie_nodes_walked, 0u);
  EXPECT_EQ(b.shared_tables, b.computed_tables);
  EXPECT_EQ(bits_b, bits_fresh);
  EXPECT_EQ(fresh.trie_nodes_walked, a.trie_nodes_walked);
}

// FIRST and FOLLOW of a chain at the rule limit, declared so that a sweep in order learns one
// link per pass: compiled (a worklist), and the sentence and its FOLLOW-decided tokens right.
TEST(GrammarMatcher, ChainsAtTheRuleLimitCompile) {
  Grammar chain;
  const size_t n = kMaxGrammarRules - 2;
  chain.byte_sets.resize(2);
  chain.byte_sets[0].set('x');
  chain.byte_sets[1].set('y');
  chain.rules.resize(n + 1);
  for (size_t r = 0; r < n; ++r) {
    chain.rules[r].name = "c" + std::to_string(r);
    chain.rules[r].alternatives = {{Element{Element::Kind::kRule, uint32_t(r + 1)}}};
  }
  // the last ::= "x" | "", and root ::= c0 "y"
  chain.rules[n - 1].alternatives = {{Element{Element::Kind::kBytes, 0}}, {}};
  chain.rules[n].name = "root";
  chain.rules[n].alternatives = {
      {Element{Element::Kind::kRule, 0}, Element{Element::Kind::kBytes, 1}}};
  chain.root = uint32_t(n);
  auto texts = std::make_shared<TokenTexts>();
  texts->bytes = {"x", "y", "xy", "yx", "z"};
  texts->special.assign(texts->bytes.size(), 0);
  auto compiled = compile_grammar(chain, std::make_shared<GrammarVocabulary>(texts), {4});
  ASSERT_TRUE(compiled.ok()) << compiled.message();
  GrammarMatcher m(*compiled);
  std::vector<uint64_t> bits;
  ASSERT_TRUE(m.fill_mask(bits).ok());
  EXPECT_EQ(bits[0], 0b00111u); // x, y, xy; not yx (nothing follows y), not z
  ASSERT_TRUE(m.accept_token(0));
  ASSERT_TRUE(m.fill_mask(bits).ok());
  EXPECT_EQ(bits[0], 0b00010u);
}

// A way through the grammar that can never be finished (an empty character class, a special
// token the vocabulary lacks) is cut at compile time, so that no state allows nothing; a grammar
// with no other way is refused.
TEST(GrammarMatcher, DeadEndsAreCutAtCompileTime) {
  auto texts = std::make_shared<TokenTexts>();
  texts->bytes = {"a", "b", "ab", "c", "<|end|>"};
  texts->special = {0, 0, 0, 0, 1};
  auto vocab = std::make_shared<GrammarVocabulary>(texts);
  GrammarBuilder b;
  const Element nothing = b.rule("nothing", {{b.bytes(ByteSet{})}});
  const Element missing = b.rule("missing", {{GrammarBuilder::special(3)}}); // "c" is ordinary
  const Element root = b.rule("root", {{b.byte('a'), nothing},
                                       {b.byte('a'), missing},
                                       {b.byte('b')},
                                       {b.byte('c'), nothing, b.byte('c')}});
  auto g = std::move(b).finish(root.value);
  ASSERT_TRUE(g.ok());
  auto compiled = compile_grammar(*g, vocab, {4});
  ASSERT_TRUE(compiled.ok()) << compiled.message();
  GrammarMatcher m(*compiled);
  std::vector<uint64_t> bits;
  ASSERT_TRUE(m.fill_mask(bits).ok());
  EXPECT_EQ(bits[0], 0b00010u); // only "b": "a" and "c" lead nowhere
  EXPECT_FALSE(GrammarMatcher(*compiled).accept_bytes("a"));

  GrammarBuilder d;
  const Element dead = d.rule("dead", {{d.byte('a'), d.bytes(ByteSet{})}});
  auto none = std::move(d).finish(dead.value);
  ASSERT_TRUE(none.ok());
  auto refused = compile_grammar(*none, vocab, {4});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("'dead' matches nothing"), std::string::npos)
      << refused.message();
}

// More parses at once than the matcher walks: an error, at the start or in a table, never a mask
// that silently lost some.
TEST(GrammarMatcher, TooAmbiguousIsAnErrorNotATruncation) {
  auto texts = std::make_shared<TokenTexts>();
  texts->bytes = {"x", "y", "yx", "z"};
  texts->special = {0, 0, 0, 0};
  auto vocab = std::make_shared<GrammarVocabulary>(texts);
  // many ::= "x" r0 | "x" r1 | ..., each r_i ::= "z": more stacks after "x" than kMaxStacks.
  auto grammar = [](bool behind_y) {
    GrammarBuilder b;
    std::vector<Sequence> alts;
    for (size_t i = 0; i < GrammarMatcher::kMaxStacks + 10; ++i)
      alts.push_back({b.byte('x'), b.rule("r" + std::to_string(i), {{b.byte('z')}})});
    const Element many = b.rule("many", std::move(alts));
    const Element root = b.rule("root", {behind_y ? Sequence{b.byte('y'), many} : Sequence{many}});
    return std::move(b).finish(root.value).value();
  };
  std::vector<uint64_t> bits;
  auto at_start = compile_grammar(grammar(false), vocab, {3});
  ASSERT_TRUE(at_start.ok());
  const Status s = GrammarMatcher(*at_start).fill_mask(bits);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("too ambiguous"), std::string::npos) << s.message();
  // Behind "y" the start is one stack, but the table's walk of "yx" meets them all.
  auto in_table = compile_grammar(grammar(true), vocab, {3});
  ASSERT_TRUE(in_table.ok());
  GrammarMatcher m(*in_table);
  EXPECT_FALSE(m.fill_mask(bits).ok());
}

// Each parse alone reads "x" into two (its mask is made parse by parse), all of them together read
// it into more than kMaxStacks: accepting "x" is refused as too ambiguous, and the mask from then
// on is that error, not a mask whose tokens are refused.
TEST(GrammarMatcher, TooAmbiguousToReadATokenIsAnError) {
  auto texts = std::make_shared<TokenTexts>();
  texts->bytes = {"x", "y", "z"};
  texts->special = {0, 0, 0};
  auto vocab = std::make_shared<GrammarVocabulary>(texts);
  GrammarBuilder b;
  std::vector<Sequence> alts;
  const size_t parses = GrammarMatcher::kMaxStacks * 3 / 4; // <= kMaxStacks at the start
  for (size_t i = 0; i < parses; ++i) {
    const std::string n = std::to_string(i);
    const Element two = b.rule("b" + n, {{b.byte('y')}, {b.byte('y'), b.byte('y')}});
    alts.push_back({b.rule("a" + n, {{b.byte('x'), two}})});
  }
  const Element root = b.rule("root", std::move(alts));
  auto compiled = compile_grammar(std::move(b).finish(root.value).value(), vocab, {2});
  ASSERT_TRUE(compiled.ok()) << compiled.message();
  GrammarMatcher m(*compiled);
  std::vector<uint64_t> bits;
  ASSERT_TRUE(m.fill_mask(bits).ok());
  EXPECT_TRUE(bits[0] & 1); // "x" is allowed
  EXPECT_FALSE(m.too_ambiguous());
  EXPECT_FALSE(m.accept_token(0));
  EXPECT_TRUE(m.too_ambiguous());
  const Status s = m.fill_mask(bits);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("too ambiguous"), std::string::npos) << s.message();
  // A copy keeps the verdict.
  GrammarMatcher copy(m);
  EXPECT_FALSE(copy.fill_mask(bits).ok());
}

// A bounded repetition has a context per count left, each reaching the rest of the chain: such
// contexts are not shared (their keys would outweigh their tables), so a long one costs the
// vocabulary's cache nothing.
TEST(GrammarMatcher, LongRepetitionsDoNotFillTheSharedCache) {
  auto texts = std::make_shared<TokenTexts>();
  for (char c = 'a'; c <= 'z'; ++c) texts->bytes.push_back(std::string(1, c));
  texts->bytes.push_back("\"");
  texts->bytes.push_back("ab");
  texts->special.assign(texts->bytes.size(), 0);
  auto vocab = std::make_shared<GrammarVocabulary>(texts);
  GrammarBuilder b;
  ByteSet lower;
  lower.set_range('a', 'z');
  auto body = b.repeat("body", {b.bytes(lower)}, 0, kMaxRepeatBound);
  ASSERT_TRUE(body.ok());
  const Element root = b.rule("root", {{b.byte('"'), *body, b.byte('"')}});
  auto compiled = compile_grammar(*std::move(b).finish(root.value), vocab, {});
  ASSERT_TRUE(compiled.ok());
  GrammarMatcher m(*compiled);
  std::vector<uint64_t> bits;
  ASSERT_TRUE(m.accept_bytes("\""));
  for (int i = 0; i < 2000; ++i) {
    ASSERT_TRUE(m.fill_mask(bits).ok());
    ASSERT_EQ(bits[0] & 0x3FFFFFFu, 0x3FFFFFFu) << i; // every letter, at every count
    ASSERT_TRUE(m.accept_token(i % 26));
  }
  EXPECT_LT(vocab->shared_tables(), 100u);
  EXPECT_LT(vocab->shared_table_bytes(), size_t(1) << 20);
  EXPECT_GT(compile_stats(**compiled).computed_tables, 2000u);
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
