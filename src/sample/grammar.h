// A context-free grammar over bytes and special tokens: what a constrained answer may write.
// JSON Schema (json_schema.h), GBNF (gbnf.h) and the chat formats' wrappers (text/atem) all
// build one with GrammarBuilder; GrammarMatcher (grammar_matcher.h) walks it against a
// vocabulary. Code points are spelled out as UTF-8 byte sequences here, so that the matcher
// reads bytes, as tokens are written, and a token may end inside a code point.
#pragma once

#include "base/status.h"

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace offgraph::sample {

// A set of byte values.
struct ByteSet {
  std::array<uint64_t, 4> bits{};
  void set(uint8_t b) { bits[b >> 6] |= uint64_t(1) << (b & 63); }
  void set_range(uint8_t lo, uint8_t hi) {
    for (unsigned b = lo; b <= hi; ++b) set(uint8_t(b));
  }
  bool test(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1; }
  bool empty() const { return !(bits[0] | bits[1] | bits[2] | bits[3]); }
  bool operator==(const ByteSet &) const = default;
};

// One symbol of a sequence.
struct Element {
  enum class Kind : uint8_t {
    kBytes,   // one byte from Grammar::byte_sets[value]
    kSpecial, // the special (control) token with id `value`, which no text can spell
    kRule,    // rule number `value`
  };
  Kind kind = Kind::kBytes;
  uint32_t value = 0;
  bool operator==(const Element &) const = default;
};
using Sequence = std::vector<Element>;

struct Rule {
  std::string name;
  std::vector<Sequence> alternatives; // an empty Sequence is the empty string
};

struct Grammar {
  std::vector<Rule> rules;
  std::vector<ByteSet> byte_sets;
  uint32_t root = 0;

  // GBNF-like text, for messages and tests (byte sets as [\xHH-\xHH] ranges).
  std::string to_text() const;
};

inline constexpr uint32_t kUnbounded = 0xFFFFFFFFu;
// Limits on what a grammar may hold: a request cannot make the server compile without bound.
inline constexpr size_t kMaxGrammarRules = 100000;
inline constexpr size_t kMaxGrammarElements = 1000000;
inline constexpr uint32_t kMaxRepeatBound = 10000; // the largest finite {m,n} bound

// Builds a Grammar. Rules are numbered as they are declared; expressions are Sequences and
// Elements, so that helpers compose (a repetition of a choice of literals is one Element).
class GrammarBuilder {
public:
  // A rule to define later: for recursion and forward references.
  uint32_t declare(std::string name);
  void define(uint32_t rule, std::vector<Sequence> alternatives);
  // declare + define; the Element refers to it.
  Element rule(std::string name, std::vector<Sequence> alternatives);
  static Element ref(uint32_t rule) { return {Element::Kind::kRule, rule}; }

  Element bytes(const ByteSet &set); // one byte of the set (identical sets are stored once)
  Element byte(uint8_t b);
  static Element special(int32_t token) { return {Element::Kind::kSpecial, uint32_t(token)}; }
  Sequence literal(std::string_view text); // these bytes in order

  // One code point inside `ranges` (inclusive, any order, may overlap), or with `negated` one
  // valid code point (U+0000-U+10FFFF without surrogates) outside them, as its UTF-8 bytes.
  // Ranges past U+10FFFF or reversed are an error.
  Result<Element> code_points(std::vector<std::pair<uint32_t, uint32_t>> ranges, bool negated);
  Element any_code_point(); // one valid UTF-8 code point

  // An anonymous rule of these alternatives (named `name` in to_text()).
  Element choice(std::string name, std::vector<Sequence> alternatives);
  Element optional(std::string name, Sequence item);
  // `item` repeated min to max times (max kUnbounded: no limit). Right-recursive rules, so that
  // the matcher's stacks stay flat however long the repetition runs. Error: min > max, or a finite
  // bound past kMaxRepeatBound.
  Result<Element> repeat(std::string name, Sequence item, uint32_t min, uint32_t max);

  // Copies another grammar's rules in; the Element is its root. For a grammar that binds one part
  // of a larger one (a GBNF grammar as an answer's content).
  Element embed(const Grammar &other);

  size_t rule_count() const { return grammar_.rules.size(); }
  // Checks and returns the grammar: every rule defined with at least one alternative, every
  // reference in range, no left recursion (also through rules that can match the empty string),
  // within the limits above. Errors name the rule.
  Result<Grammar> finish(uint32_t root) &&;

private:
  Grammar grammar_;
  std::vector<bool> defined_;
};

// Checks a grammar built by other means (GrammarBuilder::finish runs this).
Status validate_grammar(const Grammar &grammar);
// Grammar analyses, each a worklist in time linear in the grammar's size (a request's grammar
// may chain 100,000 rules; sweeping until nothing changes is quadratic on such a chain).
//
// Which rules, and which alternatives, derive some string whose terminals all pass
// `terminal_ok` (an alternative does when each of its elements does).
struct Derivable {
  std::vector<bool> rules;
  std::vector<std::vector<bool>> alternatives; // per rule, per alternative
};
Derivable derivable(const Grammar &grammar,
                    const std::function<bool(const Element &)> &terminal_ok);
// Per rule, whether it can match the empty string: derivable with no terminal.
std::vector<bool> nullable_rules(const Grammar &grammar);
// Per rule, FOLLOW over bytes: what may be read right after the rule ends, anywhere it is used
// (a special token after it adds nothing).
std::vector<ByteSet> follow_sets(const Grammar &grammar);

// Whether `text` (bytes only, no special tokens) is a complete sentence of the grammar: a
// direct interpretation, for tests and references; the matcher is what generation uses.
Result<bool> grammar_accepts(const Grammar &grammar, std::string_view text);
// The same over symbols: 0-255 a byte, 256 + id the special token `id`.
Result<bool> grammar_accepts_symbols(const Grammar &grammar, std::span<const int32_t> symbols);

} // namespace offgraph::sample
