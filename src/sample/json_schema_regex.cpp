// `pattern`: a subset of ECMA-262 regular expressions, parsed to RegexNode.
//
// JSON Schema validators differ in their regex engines: ECMA-262 with or without the u flag (by
// UTF-16 code unit or by code point), or Python's re (Unicode \d \w \s, '.' matching '\r'). The
// sets here hold only what all of them match: everything stays within the BMP (so code units
// and code points agree), \d \w \s mean their ASCII (and common whitespace) members, and their
// complements, like negated classes, leave out everything any engine might count in the class.
// So every class is computed twice, as a lower set (matched by every engine) and an upper set
// (possibly matched by some), and negation swaps them. Whatever does not parse the same way in
// all of them is refused: backreferences, lookaround, \b, named groups, flags, a '{' that is not
// a quantifier, anchors except at the ends of a top-level alternative.
#include "sample/json_schema_internal.h"

#include <algorithm>

namespace offgraph::sample::json_schema_detail {

Ranges normalized(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (const auto &[lo, hi] : r) {
    if (lo > hi) continue;
    if (!out.empty() && lo <= out.back().second + 1)
      out.back().second = std::max(out.back().second, hi);
    else
      out.emplace_back(lo, hi);
  }
  return out;
}

Ranges unite(const Ranges &a, const Ranges &b) {
  Ranges r = a;
  r.insert(r.end(), b.begin(), b.end());
  return normalized(std::move(r));
}

Ranges subtract(const Ranges &a, const Ranges &b) {
  Ranges out;
  const Ranges bn = normalized(b);
  for (auto [lo, hi] : normalized(a)) {
    for (const auto &[blo, bhi] : bn) {
      if (bhi < lo || blo > hi) continue;
      if (blo > lo) out.emplace_back(lo, blo - 1);
      if (bhi >= hi) {
        lo = hi + 1;
        break;
      }
      lo = bhi + 1;
    }
    if (lo <= hi) out.emplace_back(lo, hi);
  }
  return normalized(std::move(out));
}

bool contains(const Ranges &r, uint32_t c) {
  return std::any_of(r.begin(), r.end(),
                     [c](const auto &p) { return c >= p.first && c <= p.second; });
}

const Ranges &bmp() {
  static const Ranges r = {{0, 0xD7FF}, {0xE000, 0xFFFF}};
  return r;
}

namespace {

constexpr uint32_t kMaxGroupDepth = 100;

uint32_t add_lengths(uint32_t a, uint32_t b) {
  return a == kUnbounded || b == kUnbounded || uint64_t(a) + b >= kUnbounded ? kUnbounded : a + b;
}
uint32_t times(uint32_t a, uint32_t n) {
  if (a == 0 || n == 0) return 0;
  if (a == kUnbounded || n == kUnbounded || uint64_t(a) * n >= kUnbounded) return kUnbounded;
  return a * n;
}

// The fewest and the most code points `n` matches (kUnbounded: no limit).
struct Lengths {
  uint32_t min, max;
};
Lengths lengths(const RegexNode &n) {
  switch (n.kind) {
  case RegexNode::Kind::kEmpty:
    return {0, 0};
  case RegexNode::Kind::kSet:
    return {1, 1};
  case RegexNode::Kind::kConcat: {
    Lengths s{0, 0};
    for (const RegexNode &i : n.items) {
      const Lengths l = lengths(i);
      s = {add_lengths(s.min, l.min), add_lengths(s.max, l.max)};
    }
    return s;
  }
  case RegexNode::Kind::kAlt: {
    Lengths m{kUnbounded, 0};
    for (const RegexNode &i : n.items) {
      const Lengths l = lengths(i);
      m = {std::min(m.min, l.min), std::max(m.max, l.max)};
    }
    return m;
  }
  case RegexNode::Kind::kRepeat: {
    const Lengths l = lengths(n.items[0]);
    return {times(l.min, n.min), times(l.max, n.max)};
  }
  }
  return {0, 0};
}

void collect(const RegexNode &n, Ranges &out) {
  if (n.kind == RegexNode::Kind::kSet) out = unite(out, n.set);
  for (const RegexNode &i : n.items) collect(i, out);
}

bool nullable(const RegexNode &n) {
  switch (n.kind) {
  case RegexNode::Kind::kEmpty:
    return true;
  case RegexNode::Kind::kSet:
    return false;
  case RegexNode::Kind::kConcat:
    return std::all_of(n.items.begin(), n.items.end(),
                       [](const RegexNode &i) { return nullable(i); });
  case RegexNode::Kind::kAlt:
    return std::any_of(n.items.begin(), n.items.end(),
                       [](const RegexNode &i) { return nullable(i); });
  case RegexNode::Kind::kRepeat:
    return n.min == 0 || nullable(n.items[0]);
  }
  return true;
}

RegexNode make(RegexNode::Kind kind, std::vector<RegexNode> items) {
  if (items.empty() && kind != RegexNode::Kind::kAlt) return {};
  if (items.size() == 1 && kind != RegexNode::Kind::kRepeat) return std::move(items[0]);
  RegexNode n;
  n.kind = kind;
  n.items = std::move(items);
  return n;
}

size_t node_count(const RegexNode &n) {
  size_t c = 1;
  for (const RegexNode &i : n.items) c += node_count(i);
  return c;
}

// What rewriting nullable repetitions may build, in nodes, for one pattern: X less the empty
// string copies X's tail once per item, so that nested ones could grow without bound.
constexpr size_t kMaxRewrittenNodes = 100000;

// The node's language without the empty string; nullopt when nothing is left, or when `budget`
// (nodes that may still be built) runs out, which sets `too_big`.
std::optional<RegexNode> without_empty(const RegexNode &n, size_t &budget, bool &too_big) {
  using K = RegexNode::Kind;
  const size_t size = node_count(n);
  if (size > budget) {
    too_big = true;
    return std::nullopt;
  }
  budget -= size;
  if (!nullable(n)) return n;
  switch (n.kind) {
  case K::kEmpty:
  case K::kSet:
    return std::nullopt;
  case K::kAlt: {
    std::vector<RegexNode> items;
    for (const RegexNode &i : n.items)
      if (auto s = without_empty(i, budget, too_big)) items.push_back(std::move(*s));
    if (items.empty() || too_big) return std::nullopt;
    return make(K::kAlt, std::move(items));
  }
  case K::kConcat: { // every item is nullable: some item is the first to write anything
    std::vector<RegexNode> alternatives;
    for (size_t i = 0; i < n.items.size(); ++i) {
      auto first = without_empty(n.items[i], budget, too_big);
      if (too_big) return std::nullopt;
      if (!first) continue;
      std::vector<RegexNode> seq = {std::move(*first)};
      for (size_t k = i + 1; k < n.items.size(); ++k) {
        const size_t c = node_count(n.items[k]);
        if (c > budget) {
          too_big = true;
          return std::nullopt;
        }
        budget -= c;
        seq.push_back(n.items[k]);
      }
      alternatives.push_back(make(K::kConcat, std::move(seq)));
    }
    if (alternatives.empty()) return std::nullopt;
    return make(K::kAlt, std::move(alternatives));
  }
  case K::kRepeat: {
    auto item = without_empty(n.items[0], budget, too_big);
    if (!item || n.max == 0) return std::nullopt;
    RegexNode r;
    r.kind = K::kRepeat;
    r.min = 1;
    r.max = n.max;
    r.items = {std::move(*item)};
    return r;
  }
  }
  return std::nullopt;
}

// X{m,n} with a nullable X is X'{0,n} with X' = X less the empty string, which keeps the
// grammar's repetition free of left recursion. nullopt: past the budget.
std::optional<RegexNode> repetition(RegexNode item, uint32_t min, uint32_t max, size_t &budget) {
  if (max == 0) return RegexNode{};
  if (nullable(item)) {
    bool too_big = false;
    auto stripped = without_empty(item, budget, too_big);
    if (too_big) return std::nullopt;
    if (!stripped) return RegexNode{};
    item = std::move(*stripped);
    min = 0;
  }
  if (min == 1 && max == 1) return item;
  RegexNode r;
  r.kind = RegexNode::Kind::kRepeat;
  r.min = min;
  r.max = max;
  r.items = {std::move(item)};
  return r;
}

// The node with every part that can match nothing (an empty class) taken out; nullopt when
// the node itself can match nothing.
std::optional<RegexNode> prune(const RegexNode &n) {
  using K = RegexNode::Kind;
  switch (n.kind) {
  case K::kEmpty:
    return n;
  case K::kSet:
    if (n.set.empty()) return std::nullopt;
    return n;
  case K::kConcat: {
    std::vector<RegexNode> items;
    for (const RegexNode &i : n.items) {
      auto p = prune(i);
      if (!p) return std::nullopt;
      items.push_back(std::move(*p));
    }
    return make(K::kConcat, std::move(items));
  }
  case K::kAlt: {
    std::vector<RegexNode> items;
    for (const RegexNode &i : n.items)
      if (auto p = prune(i)) items.push_back(std::move(*p));
    if (items.empty()) return std::nullopt;
    return make(K::kAlt, std::move(items));
  }
  case K::kRepeat: {
    auto item = prune(n.items[0]);
    if (!item) {
      if (n.min == 0) return RegexNode{};
      return std::nullopt;
    }
    RegexNode r = n;
    r.items = {std::move(*item)};
    return r;
  }
  }
  return std::nullopt;
}

RegexNode set_node(Ranges r) {
  RegexNode n;
  n.kind = RegexNode::Kind::kSet;
  n.set = normalized(std::move(r));
  return n;
}

// A class member: the code points all engines match (lower), and those any may (upper).
struct ClassItem {
  Ranges lower, upper;
  bool single = false; // one literal code point, which may start or end a range
  uint32_t c = 0;
};

ClassItem literal_item(uint32_t c) { return {{{c, c}}, {{c, c}}, true, c}; }

// Every scalar value: Python's re (parse_pattern's python mode) reads code points past the BMP.
const Ranges &all_scalars() {
  static const Ranges r = {{0, 0xD7FF}, {0xE000, 0x10FFFF}};
  return r;
}

ClassItem class_escape(char letter, bool python) {
  static const Ranges digit = {{'0', '9'}};
  static const Ranges word = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
  static const Ranges space = {{9, 13},          {32, 32},         {0xA0, 0xA0},
                               {0x1680, 0x1680}, {0x2000, 0x200A}, {0x2028, 0x2029},
                               {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}};
  const Ranges non_ascii = {{0x80, python ? 0x10FFFFu : 0xFFFFu}};
  const Ranges &universe = python ? all_scalars() : bmp();
  // Python's re counts Unicode digits and letters in \d and \w, and \x1c-\x1f, \x85 in \s;
  // ECMA-262 counts U+FEFF in \s, and engines on old Unicode versions U+180E.
  static const Ranges space_upper =
      unite(space, {{0x1C, 0x1F}, {0x85, 0x85}, {0x180E, 0x180E}, {0xFEFF, 0xFEFF}});
  ClassItem item;
  switch (letter) {
  case 'd':
  case 'D':
    item = {digit, unite(digit, non_ascii)};
    break;
  case 'w':
  case 'W':
    item = {word, unite(word, non_ascii)};
    break;
  default:
    item = {space, space_upper};
    break;
  }
  if (letter >= 'A' && letter <= 'Z')
    item = {subtract(universe, item.upper), subtract(universe, item.lower)};
  return item;
}

class Parser {
public:
  Parser(std::u32string text, std::string where, bool python)
      : s_(std::move(text)), where_(std::move(where)), python_(python) {}

  Result<Pattern> parse() {
    Pattern p;
    while (true) {
      Pattern::Branch branch;
      if (peek() == '^') {
        branch.anchored_start = true;
        ++i_;
      }
      auto node = alternative(0, &branch);
      if (!node) return node.status();
      branch.node = std::move(*node);
      p.branches.push_back(std::move(branch));
      if (at_end()) break;
      if (peek() != '|') return malformed("an unmatched ')'");
      ++i_;
    }
    return p;
  }

private:
  Status fail(const std::string &what) const {
    return Status::error(where_ + ": " + what + " is not supported (at character " +
                         std::to_string(i_ + 1) + ")");
  }
  Status malformed(const std::string &what) const {
    return Status::error(where_ + ": the pattern has " + what + " (at character " +
                         std::to_string(i_ + 1) + ")");
  }
  bool at_end() const { return i_ >= s_.size(); }
  uint32_t peek(size_t k = 0) const { return i_ + k < s_.size() ? s_[i_ + k] : 0xFFFFFFFFu; }
  static bool is_digit(uint32_t c) { return c >= '0' && c <= '9'; }

  Result<RegexNode> disjunction(uint32_t depth) {
    std::vector<RegexNode> alternatives;
    while (true) {
      auto a = alternative(depth, nullptr);
      if (!a) return a;
      alternatives.push_back(std::move(*a));
      if (peek() != '|') break;
      ++i_;
    }
    return make(RegexNode::Kind::kAlt, std::move(alternatives));
  }

  // Terms up to '|', ')' or the end. At the top level (`branch` set) a '$' may end it.
  Result<RegexNode> alternative(uint32_t depth, Pattern::Branch *branch) {
    std::vector<RegexNode> terms;
    while (!at_end() && peek() != '|' && peek() != ')') {
      if (peek() == '$') {
        if (branch && (i_ + 1 == s_.size() || s_[i_ + 1] == '|')) {
          branch->anchored_end = true;
          ++i_;
          break;
        }
        return fail("an anchor ('$') inside the pattern");
      }
      if (peek() == '^') return fail("an anchor ('^') inside the pattern");
      auto atom = this->atom(depth);
      if (!atom) return atom;
      auto term = quantified(std::move(*atom));
      if (!term) return term;
      terms.push_back(std::move(*term));
    }
    return make(RegexNode::Kind::kConcat, std::move(terms));
  }

  // A quantifier at i_: {min, max} and its length, or nullopt.
  std::optional<std::pair<std::pair<uint64_t, uint64_t>, size_t>> quantifier_at() const {
    const uint32_t c = peek();
    if (c == '*') return {{{0, kUnbounded}, 1}};
    if (c == '+') return {{{1, kUnbounded}, 1}};
    if (c == '?') return {{{0, 1}, 1}};
    if (c != '{') return std::nullopt;
    size_t k = 1;
    auto number = [&]() -> std::optional<uint64_t> {
      uint64_t v = 0;
      size_t start = k;
      while (is_digit(peek(k)) && k - start < 12) v = v * 10 + (peek(k++) - '0');
      if (k == start || is_digit(peek(k))) return std::nullopt;
      return v;
    };
    auto min = number();
    if (!min) return std::nullopt;
    uint64_t max = *min;
    if (peek(k) == ',') {
      ++k;
      if (peek(k) == '}')
        max = kUnbounded;
      else if (auto m = number())
        max = *m;
      else
        return std::nullopt;
    }
    if (peek(k) != '}') return std::nullopt;
    return {{{*min, max}, k + 1}};
  }

  Result<RegexNode> quantified(RegexNode atom) {
    auto q = quantifier_at();
    if (!q) return atom;
    auto [bounds, length] = *q;
    auto [min, max] = bounds;
    if (max != kUnbounded && min > max) return malformed("a quantifier with min above max");
    if (min > kMaxRepeatBound || (max != kUnbounded && max > kMaxRepeatBound))
      return fail("a quantifier bound above " + with_commas(kMaxRepeatBound));
    i_ += length;
    if (peek() == '?') ++i_; // lazy: the same strings match
    if (quantifier_at()) return fail("a quantifier after a quantifier");
    auto r = repetition(std::move(atom), uint32_t(min), uint32_t(max), budget_);
    if (!r)
      return fail("a pattern whose nullable repetitions expand past " +
                  with_commas(kMaxRewrittenNodes) + " nodes");
    return std::move(*r);
  }

  Result<RegexNode> atom(uint32_t depth) {
    const uint32_t c = peek();
    if (c == '(') {
      ++i_;
      if (peek() == '?') {
        if (peek(1) == ':') {
          i_ += 2;
        } else if (peek(1) == '=' || peek(1) == '!' ||
                   (peek(1) == '<' && (peek(2) == '=' || peek(2) == '!'))) {
          return fail("lookaround");
        } else if (peek(1) == '<' || peek(1) == 'P') {
          return fail("a named group");
        } else {
          return fail("a group modifier ('(?')");
        }
      }
      if (depth + 1 > kMaxGroupDepth) return fail("groups nested deeper than 100");
      auto inner = disjunction(depth + 1);
      if (!inner) return inner;
      if (peek() != ')') return malformed("an unterminated group");
      ++i_;
      return inner;
    }
    if (c == '[') return char_class();
    if (c == '.') {
      ++i_;
      // ECMA-262's '.' leaves out the line terminators; Python's only '\n'.
      if (python_) return set_node(subtract(all_scalars(), {{'\n', '\n'}}));
      return set_node(subtract(bmp(), {{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}));
    }
    if (c == '*' || c == '+' || c == '?') return malformed("a quantifier with nothing to repeat");
    if (c == '{') {
      if (quantifier_at()) return malformed("a quantifier with nothing to repeat");
      return fail("a '{' that is not a quantifier (escape it)");
    }
    if (c == '}' || c == ']') return fail("an unescaped '" + std::string(1, char(c)) + "'");
    if (c == '\\') {
      auto item = escape(false);
      if (!item) return item.status();
      return set_node(item->lower);
    }
    ++i_;
    return set_node({{c, c}});
  }

  Result<uint32_t> hex(size_t digits) {
    uint32_t v = 0;
    for (size_t k = 0; k < digits; ++k) {
      const uint32_t c = peek();
      int d = c >= '0' && c <= '9'   ? int(c - '0')
              : c >= 'a' && c <= 'f' ? int(c - 'a' + 10)
              : c >= 'A' && c <= 'F' ? int(c - 'A' + 10)
                                     : -1;
      if (d < 0) return malformed("an incomplete hex escape");
      v = v * 16 + uint32_t(d);
      ++i_;
    }
    return v;
  }

  Result<ClassItem> escape(bool in_class) {
    ++i_; // the backslash
    if (at_end()) return malformed("a trailing backslash");
    const uint32_t c = s_[i_++];
    switch (c) {
    case 'd':
    case 'D':
    case 'w':
    case 'W':
    case 's':
    case 'S':
      return class_escape(char(c), python_);
    case 'b':
      if (in_class) return literal_item(8);
      return fail("a word boundary assertion ('\\b')");
    case 'B':
      return fail("a word boundary assertion ('\\B')");
    case 't':
      return literal_item('\t');
    case 'n':
      return literal_item('\n');
    case 'v':
      return literal_item('\v');
    case 'f':
      return literal_item('\f');
    case 'r':
      return literal_item('\r');
    case '0':
      if (is_digit(peek())) return fail("an octal escape");
      return literal_item(0);
    case 'x': {
      auto v = hex(2);
      if (!v) return v.status();
      return literal_item(*v);
    }
    case 'u': {
      if (peek() == '{') return fail("a braced Unicode escape ('\\u{')");
      auto v = hex(4);
      if (!v) return v.status();
      if (*v >= 0xD800 && *v <= 0xDFFF) return fail("a surrogate escape");
      return literal_item(*v);
    }
    case 'c':
      return fail("a control escape ('\\c')");
    case 'k':
      return fail("a named backreference ('\\k')");
    case 'p':
    case 'P':
      return fail("a Unicode property escape ('\\p')");
    default:
      break;
    }
    if (is_digit(c)) return fail("a backreference");
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_')
      return fail("the escape '\\" + std::string(1, char(c)) + "'");
    return literal_item(c);
  }

  Result<ClassItem> class_atom() {
    if (peek() == '\\') return escape(true);
    const uint32_t c = peek();
    ++i_;
    return literal_item(c);
  }

  Result<RegexNode> char_class() {
    ++i_; // '['
    const bool negated = peek() == '^';
    if (negated) ++i_;
    if (peek() == ']') return fail("an empty class ('[]', '[^]')");
    Ranges lower, upper;
    while (true) {
      if (at_end()) return malformed("an unterminated class");
      if (peek() == ']') {
        ++i_;
        break;
      }
      if (peek() == '[') return fail("an unescaped '[' inside a class");
      auto item = class_atom();
      if (!item) return item.status();
      if (peek() == '-' && i_ + 1 < s_.size() && peek(1) != ']') {
        ++i_;
        if (peek() == '[') return fail("an unescaped '[' inside a class");
        auto end = class_atom();
        if (!end) return end.status();
        if (!item->single || !end->single) return fail("a class range with a class escape");
        if (item->c > end->c) return malformed("a class range out of order");
        item = ClassItem{{{item->c, end->c}}, {{item->c, end->c}}, false, 0};
        if (peek() == '-' && peek(1) != ']') return fail("an unescaped '-' after a class range");
      }
      lower = unite(lower, item->lower);
      upper = unite(upper, item->upper);
    }
    return set_node(negated ? subtract(python_ ? all_scalars() : bmp(), upper) : lower);
  }

  std::u32string s_;
  std::string where_;
  bool python_ = false; // Python's re alone, over every code point (parse_pattern)
  size_t i_ = 0;
  size_t budget_ = kMaxRewrittenNodes;
};

} // namespace

uint32_t Pattern::min_length() const {
  uint32_t m = kUnbounded;
  for (const Branch &b : branches) m = std::min(m, lengths(b.node).min);
  return m;
}

uint32_t Pattern::max_length() const {
  uint32_t m = 0;
  for (const Branch &b : branches)
    m = std::max(m, b.anchored_start && b.anchored_end ? lengths(b.node).max : kUnbounded);
  return m;
}

Ranges Pattern::alphabet() const {
  Ranges out;
  for (const Branch &b : branches) {
    if (!b.anchored_start || !b.anchored_end) return {{0, 0x10FFFF}};
    collect(b.node, out);
  }
  return out;
}

Result<Pattern> parse_pattern(std::string_view text, const std::string &where, bool python) {
  auto cps = decode_utf8(text);
  if (!cps) return Status::error(where + " is not valid UTF-8");
  for (uint32_t c : *cps)
    if (c > 0xFFFF && !python)
      return Status::error(where + ": code points above U+FFFF are not supported");
  auto parsed = Parser(std::move(*cps), where, python).parse();
  if (!parsed) return parsed;
  Pattern out;
  for (Pattern::Branch &branch : parsed->branches)
    if (auto node = prune(branch.node)) {
      branch.node = std::move(*node);
      out.branches.push_back(std::move(branch));
    }
  if (out.branches.empty()) return Status::error(where + " matches no string");
  return out;
}

} // namespace offgraph::sample::json_schema_detail
