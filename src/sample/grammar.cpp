#include "sample/grammar.h"

#include <algorithm>
#include <map>
#include <set>
#include <unordered_set>

namespace offgraph::sample {

namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr uint32_t kSurrogateLo = 0xD800, kSurrogateHi = 0xDFFF;

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

// Sorted, merged, surrogate-free.
Ranges normalize(Ranges ranges) {
  Ranges cut;
  for (auto [lo, hi] : ranges) {
    if (lo < kSurrogateLo && hi >= kSurrogateLo) {
      cut.push_back({lo, kSurrogateLo - 1});
      if (hi > kSurrogateHi) cut.push_back({kSurrogateHi + 1, hi});
    } else if (lo >= kSurrogateLo && lo <= kSurrogateHi) {
      if (hi > kSurrogateHi) cut.push_back({kSurrogateHi + 1, hi});
    } else {
      cut.push_back({lo, hi});
    }
  }
  std::sort(cut.begin(), cut.end());
  Ranges merged;
  for (auto r : cut) {
    if (!merged.empty() && r.first <= merged.back().second + 1)
      merged.back().second = std::max(merged.back().second, r.second);
    else
      merged.push_back(r);
  }
  return merged;
}

Ranges complement(const Ranges &sorted) {
  Ranges out;
  uint32_t next = 0;
  for (auto [lo, hi] : sorted) {
    if (lo > next) out.push_back({next, lo - 1});
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
  return normalize(out);
}

size_t utf8_length(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

std::array<uint8_t, 4> utf8_bytes(uint32_t cp) {
  std::array<uint8_t, 4> b{};
  switch (utf8_length(cp)) {
  case 1:
    b[0] = uint8_t(cp);
    break;
  case 2:
    b[0] = uint8_t(0xC0 | (cp >> 6));
    b[1] = uint8_t(0x80 | (cp & 0x3F));
    break;
  case 3:
    b[0] = uint8_t(0xE0 | (cp >> 12));
    b[1] = uint8_t(0x80 | ((cp >> 6) & 0x3F));
    b[2] = uint8_t(0x80 | (cp & 0x3F));
    break;
  default:
    b[0] = uint8_t(0xF0 | (cp >> 18));
    b[1] = uint8_t(0x80 | ((cp >> 12) & 0x3F));
    b[2] = uint8_t(0x80 | ((cp >> 6) & 0x3F));
    b[3] = uint8_t(0x80 | (cp & 0x3F));
  }
  return b;
}

// A byte-range product: the UTF-8 encodings of a code point range, when every byte position
// ranges independently.
using ByteRanges = std::vector<std::pair<uint8_t, uint8_t>>;

// Splits [lo, hi] (one encoded length) until each piece is a product of byte ranges: a piece
// whose low end is not at the start of a continuation block, or whose high end is not at its
// end, is cut there.
void utf8_products(uint32_t lo, uint32_t hi, std::vector<ByteRanges> &out) {
  const size_t n = utf8_length(lo);
  for (size_t i = 1; i < n; ++i) {
    const uint32_t mask = (uint32_t(1) << (6 * i)) - 1;
    if ((lo & ~mask) != (hi & ~mask)) {
      if ((lo & mask) != 0) {
        utf8_products(lo, lo | mask, out);
        utf8_products((lo | mask) + 1, hi, out);
        return;
      }
      if ((hi & mask) != mask) {
        utf8_products(lo, (hi & ~mask) - 1, out);
        utf8_products(hi & ~mask, hi, out);
        return;
      }
    }
  }
  const auto a = utf8_bytes(lo), b = utf8_bytes(hi);
  ByteRanges r;
  for (size_t k = 0; k < n; ++k) r.push_back({a[k], b[k]});
  out.push_back(std::move(r));
}

std::vector<ByteRanges> utf8_sequences(const Ranges &ranges) {
  std::vector<ByteRanges> out;
  constexpr uint32_t kLengthEnds[] = {0x7F, 0x7FF, 0xFFFF, kMaxCodePoint};
  for (auto [lo, hi] : ranges) {
    uint32_t from = lo;
    for (uint32_t end : kLengthEnds) {
      if (from > hi) break;
      if (from > end) continue;
      const uint32_t to = std::min(hi, end);
      utf8_products(from, to, out);
      from = to + 1;
    }
  }
  return out;
}

std::string byte_text(uint8_t b) {
  static const char *hex = "0123456789ABCDEF";
  if (b >= 0x20 && b < 0x7F && b != '"' && b != '\\' && b != ']' && b != '[' && b != '-' &&
      b != '^')
    return std::string(1, char(b));
  return std::string("\\x") + hex[b >> 4] + hex[b & 15];
}

std::string set_text(const ByteSet &s) {
  std::string out = "[";
  for (unsigned b = 0; b < 256;) {
    if (!s.test(uint8_t(b))) {
      ++b;
      continue;
    }
    unsigned e = b;
    while (e + 1 < 256 && s.test(uint8_t(e + 1))) ++e;
    out += byte_text(uint8_t(b));
    if (e > b) out += "-" + byte_text(uint8_t(e));
    b = e + 1;
  }
  return out + "]";
}

// The single byte a set holds, or -1.
int single_byte(const ByteSet &s) {
  int found = -1;
  for (unsigned w = 0; w < 4; ++w) {
    const uint64_t bits = s.bits[w];
    if (!bits) continue;
    if ((bits & (bits - 1)) || found >= 0) return -1;
    found = int(w * 64 + unsigned(__builtin_ctzll(bits)));
  }
  return found;
}

} // namespace

Derivable derivable(const Grammar &g, const std::function<bool(const Element &)> &terminal_ok) {
  const size_t n = g.rules.size();
  Derivable out;
  out.rules.assign(n, false);
  out.alternatives.resize(n);
  constexpr uint32_t kNever = 0xFFFFFFFFu;
  std::vector<uint32_t> waiting;                    // per alternative: references not yet derivable
  std::vector<std::pair<uint32_t, uint32_t>> where; // per alternative: (rule, index in the rule)
  std::vector<std::vector<uint32_t>> occurs(n);     // rule -> alternatives it occurs in
  std::vector<uint32_t> found;
  auto mark = [&](uint32_t r) {
    if (!out.rules[r]) {
      out.rules[r] = true;
      found.push_back(r);
    }
  };
  for (uint32_t r = 0; r < n; ++r) {
    out.alternatives[r].assign(g.rules[r].alternatives.size(), false);
    for (uint32_t i = 0; i < g.rules[r].alternatives.size(); ++i) {
      const Sequence &alt = g.rules[r].alternatives[i];
      const uint32_t a = uint32_t(waiting.size());
      where.push_back({r, i});
      uint32_t refs = 0;
      bool never = false;
      for (const Element &e : alt) {
        if (e.kind != Element::Kind::kRule)
          never |= !terminal_ok(e);
        else if (e.value < n) {
          occurs[e.value].push_back(a);
          ++refs;
        }
      }
      waiting.push_back(never ? kNever : refs);
      if (!never && refs == 0) {
        out.alternatives[r][i] = true;
        mark(r);
      }
    }
  }
  while (!found.empty()) {
    const uint32_t x = found.back();
    found.pop_back();
    for (uint32_t a : occurs[x]) {
      if (waiting[a] == kNever || --waiting[a] != 0) continue;
      out.alternatives[where[a].first][where[a].second] = true;
      mark(where[a].first);
    }
  }
  return out;
}

std::vector<bool> nullable_rules(const Grammar &g) {
  return derivable(g, [](const Element &) { return false; }).rules;
}

namespace {

// Unites `from` into `into`; true if `into` grew.
bool unite(ByteSet &into, const ByteSet &from) {
  bool grew = false;
  for (size_t w = 0; w < into.bits.size(); ++w) {
    const uint64_t x = into.bits[w] | from.bits[w];
    grew |= x != into.bits[w];
    into.bits[w] = x;
  }
  return grew;
}

// Grows sets[r] by sets[x] along every edge x -> r until nothing changes: a worklist, so that a
// set is queued again only when it gains a byte (at most 256 times).
void propagate(std::vector<ByteSet> &sets, const std::vector<std::vector<uint32_t>> &edges) {
  std::vector<uint32_t> work;
  std::vector<bool> queued(sets.size(), true);
  for (uint32_t r = 0; r < sets.size(); ++r) work.push_back(r);
  while (!work.empty()) {
    const uint32_t x = work.back();
    work.pop_back();
    queued[x] = false;
    for (uint32_t r : edges[x])
      if (unite(sets[r], sets[x]) && !queued[r]) {
        queued[r] = true;
        work.push_back(r);
      }
  }
}

} // namespace

std::vector<ByteSet> follow_sets(const Grammar &g) {
  const size_t n = g.rules.size();
  const std::vector<bool> nullable = nullable_rules(g);
  // FIRST(r) >= FIRST(x) for each x that a prefix of nullable rules leads to.
  std::vector<ByteSet> first(n);
  std::vector<std::vector<uint32_t>> first_edges(n);
  for (uint32_t r = 0; r < n; ++r)
    for (const Sequence &alt : g.rules[r].alternatives)
      for (const Element &e : alt) {
        if (e.kind == Element::Kind::kBytes) unite(first[r], g.byte_sets[e.value]);
        if (e.kind != Element::Kind::kRule) break;
        first_edges[e.value].push_back(r);
        if (!nullable[e.value]) break;
      }
  propagate(first, first_edges);
  // FOLLOW(x) >= FIRST(what comes after x), and >= FOLLOW(r) when that can be empty.
  std::vector<ByteSet> follow(n);
  std::vector<std::vector<uint32_t>> follow_edges(n);
  for (uint32_t r = 0; r < n; ++r)
    for (const Sequence &alt : g.rules[r].alternatives) {
      ByteSet tail; // FIRST of the elements after position i
      bool tail_empty = true;
      for (size_t i = alt.size(); i-- > 0;) {
        const Element &e = alt[i];
        if (e.kind == Element::Kind::kBytes) {
          tail = g.byte_sets[e.value];
          tail_empty = false;
        } else if (e.kind == Element::Kind::kSpecial) {
          tail = ByteSet{};
          tail_empty = false;
        } else {
          unite(follow[e.value], tail);
          if (tail_empty) follow_edges[r].push_back(e.value);
          if (!nullable[e.value]) {
            tail = first[e.value];
            tail_empty = false;
          } else {
            unite(tail, first[e.value]);
          }
        }
      }
    }
  propagate(follow, follow_edges);
  return follow;
}

uint32_t GrammarBuilder::declare(std::string name) {
  grammar_.rules.push_back({std::move(name), {}});
  defined_.push_back(false);
  return uint32_t(grammar_.rules.size() - 1);
}

void GrammarBuilder::define(uint32_t rule, std::vector<Sequence> alternatives) {
  grammar_.rules[rule].alternatives = std::move(alternatives);
  defined_[rule] = true;
}

Element GrammarBuilder::rule(std::string name, std::vector<Sequence> alternatives) {
  const uint32_t r = declare(std::move(name));
  define(r, std::move(alternatives));
  return ref(r);
}

Element GrammarBuilder::bytes(const ByteSet &set) {
  auto &sets = grammar_.byte_sets;
  // Linear: grammars hold few distinct sets, and identical ones are the common case.
  for (size_t i = 0; i < sets.size(); ++i)
    if (sets[i] == set) return {Element::Kind::kBytes, uint32_t(i)};
  sets.push_back(set);
  return {Element::Kind::kBytes, uint32_t(sets.size() - 1)};
}

Element GrammarBuilder::byte(uint8_t b) {
  ByteSet s;
  s.set(b);
  return bytes(s);
}

Sequence GrammarBuilder::literal(std::string_view text) {
  Sequence s;
  for (char c : text) s.push_back(byte(uint8_t(c)));
  return s;
}

Result<Element> GrammarBuilder::code_points(std::vector<std::pair<uint32_t, uint32_t>> ranges,
                                            bool negated) {
  for (auto [lo, hi] : ranges) {
    if (lo > hi)
      return Status::error("a character range runs backwards (U+" + std::to_string(lo) + " to U+" +
                           std::to_string(hi) + ")");
    if (hi > kMaxCodePoint)
      return Status::error("a character range goes past U+10FFFF (" + std::to_string(hi) + ")");
  }
  Ranges set = normalize(std::move(ranges));
  if (negated) set = complement(set);
  // One-byte code points share one set; longer ones are byte-range products.
  ByteSet ascii;
  std::vector<Sequence> alternatives;
  for (const ByteRanges &seq : utf8_sequences(set)) {
    if (seq.size() == 1) {
      ascii.set_range(seq[0].first, seq[0].second);
      continue;
    }
    Sequence s;
    for (auto [lo, hi] : seq) {
      ByteSet b;
      b.set_range(lo, hi);
      s.push_back(bytes(b));
    }
    alternatives.push_back(std::move(s));
  }
  if (!ascii.empty()) alternatives.insert(alternatives.begin(), Sequence{bytes(ascii)});
  if (alternatives.size() == 1 && alternatives[0].size() == 1) return alternatives[0][0];
  // An empty set (a class of surrogates only, say) matches nothing: a rule with an empty byte set.
  if (alternatives.empty()) return bytes(ByteSet{});
  std::string name = "char";
  return choice(std::move(name), std::move(alternatives));
}

Element GrammarBuilder::any_code_point() {
  auto e = code_points({{0, kMaxCodePoint}}, false);
  return *e;
}

Element GrammarBuilder::choice(std::string name, std::vector<Sequence> alternatives) {
  return rule(std::move(name), std::move(alternatives));
}

Element GrammarBuilder::optional(std::string name, Sequence item) {
  return choice(std::move(name), {std::move(item), {}});
}

Result<Element> GrammarBuilder::repeat(std::string name, Sequence item, uint32_t min,
                                       uint32_t max) {
  if (max != kUnbounded && min > max)
    return Status::error("a repetition's minimum " + std::to_string(min) +
                         " is above its maximum " + std::to_string(max));
  if (min > kMaxRepeatBound || (max != kUnbounded && max > kMaxRepeatBound))
    return Status::error("a repetition bound past " + std::to_string(kMaxRepeatBound));
  // Copies refer to one rule, so that a long item is stored once.
  Element one = item.size() == 1 ? item[0] : rule(name + "-item", {std::move(item)});
  Sequence body(min, one);
  if (max == kUnbounded) {
    const uint32_t star = declare(name + "-star");
    define(star, {{one, ref(star)}, {}});
    body.push_back(ref(star));
  } else if (max > min) {
    // tail_k ::= one tail_(k-1) | "" : at most k more.
    Element tail = optional(name + "-tail", {one});
    for (uint32_t k = 1; k < max - min; ++k) tail = optional(name + "-tail", {one, tail});
    body.push_back(tail);
  }
  if (body.size() == 1) return body[0];
  return rule(std::move(name), {std::move(body)});
}

Element GrammarBuilder::embed(const Grammar &other) {
  const uint32_t base = uint32_t(grammar_.rules.size());
  for (const Rule &r : other.rules) declare(r.name);
  for (uint32_t i = 0; i < other.rules.size(); ++i) {
    std::vector<Sequence> alternatives = other.rules[i].alternatives;
    for (Sequence &alt : alternatives)
      for (Element &e : alt) {
        if (e.kind == Element::Kind::kRule) e.value += base;
        if (e.kind == Element::Kind::kBytes) e = bytes(other.byte_sets[e.value]);
      }
    define(base + i, std::move(alternatives));
  }
  return ref(base + other.root);
}

Result<Grammar> GrammarBuilder::finish(uint32_t root) && {
  for (size_t r = 0; r < defined_.size(); ++r)
    if (!defined_[r])
      return Status::error("rule '" + grammar_.rules[r].name + "' is used but never defined");
  grammar_.root = root;
  if (Status s = validate_grammar(grammar_); !s.ok()) return s;
  return std::move(grammar_);
}

Status validate_grammar(const Grammar &g) {
  if (g.rules.empty()) return Status::error("the grammar has no rules");
  if (g.rules.size() > kMaxGrammarRules)
    return Status::error("the grammar has " + std::to_string(g.rules.size()) +
                         " rules; the limit is " + std::to_string(kMaxGrammarRules));
  if (g.root >= g.rules.size()) return Status::error("the grammar's root rule does not exist");
  size_t elements = 0;
  for (const Rule &rule : g.rules) {
    if (rule.alternatives.empty())
      return Status::error("rule '" + rule.name + "' has no alternatives");
    for (const Sequence &alt : rule.alternatives) {
      elements += alt.size() + 1;
      for (const Element &e : alt) {
        if (e.kind == Element::Kind::kRule && e.value >= g.rules.size())
          return Status::error("rule '" + rule.name + "' refers to a rule that does not exist");
        if (e.kind == Element::Kind::kBytes && e.value >= g.byte_sets.size())
          return Status::error("rule '" + rule.name + "' refers to a byte set that does not exist");
      }
    }
  }
  if (elements > kMaxGrammarElements)
    return Status::error("the grammar has " + std::to_string(elements) +
                         " elements; the limit is " + std::to_string(kMaxGrammarElements));
  // Left recursion (a rule reaching itself before reading anything) would make a matcher's
  // expansion loop; found as a cycle of the "may start with" graph.
  const std::vector<bool> nullable = nullable_rules(g);
  const size_t n = g.rules.size();
  std::vector<std::vector<uint32_t>> starts(n);
  for (size_t r = 0; r < n; ++r) {
    for (const Sequence &alt : g.rules[r].alternatives)
      for (const Element &e : alt) {
        if (e.kind != Element::Kind::kRule) break;
        starts[r].push_back(e.value);
        if (!nullable[e.value]) break;
      }
    std::sort(starts[r].begin(), starts[r].end());
    starts[r].erase(std::unique(starts[r].begin(), starts[r].end()), starts[r].end());
  }
  // Iterative DFS: grammars from requests may be deep.
  std::vector<uint8_t> color(n, 0); // 0 new, 1 on the path, 2 done
  std::vector<uint32_t> parent(n, 0);
  for (size_t s = 0; s < n; ++s) {
    if (color[s]) continue;
    std::vector<std::pair<uint32_t, size_t>> stack{{uint32_t(s), 0}};
    color[s] = 1;
    while (!stack.empty()) {
      auto &[r, next] = stack.back();
      if (next == starts[r].size()) {
        color[r] = 2;
        stack.pop_back();
        continue;
      }
      const uint32_t c = starts[r][next++];
      if (color[c] == 1) {
        std::string path = g.rules[c].name;
        for (auto it = stack.rbegin(); it != stack.rend() && it->first != c; ++it)
          path = g.rules[it->first].name + " -> " + path;
        return Status::error("rule '" + g.rules[c].name + "' is left-recursive (" +
                             g.rules[c].name + " -> " + path + ")");
      }
      if (color[c] == 0) {
        color[c] = 1;
        parent[c] = r;
        stack.push_back({c, 0});
      }
    }
  }
  return ok_status();
}

std::string Grammar::to_text() const {
  std::map<std::string, int> seen;
  std::vector<std::string> names;
  for (const Rule &r : rules) {
    const int k = seen[r.name]++;
    names.push_back(k == 0 ? r.name : r.name + "-" + std::to_string(k));
  }
  std::string out;
  auto print = [&](uint32_t r) {
    out += names[r] + " ::=";
    bool first = true;
    for (const Sequence &alt : rules[r].alternatives) {
      out += first ? " " : " | ";
      first = false;
      if (alt.empty()) out += "\"\"";
      std::string pending; // consecutive single bytes, as one literal
      auto flush = [&] {
        if (!pending.empty()) out += "\"" + pending + "\" ";
        pending.clear();
      };
      for (const Element &e : alt) {
        if (e.kind == Element::Kind::kBytes) {
          const int b = single_byte(byte_sets[e.value]);
          if (b >= 0) {
            pending += byte_text(uint8_t(b));
            continue;
          }
          flush();
          out += set_text(byte_sets[e.value]) + " ";
        } else if (e.kind == Element::Kind::kSpecial) {
          flush();
          out += "<[" + std::to_string(e.value) + "]> ";
        } else {
          flush();
          out += names[e.value] + " ";
        }
      }
      flush();
      if (!alt.empty() && out.back() == ' ') out.pop_back();
    }
    out += "\n";
  };
  print(root);
  for (uint32_t r = 0; r < rules.size(); ++r)
    if (r != root) print(r);
  return out;
}

// Earley recognition, written apart from the matcher so that each can check the other.
Result<bool> grammar_accepts_symbols(const Grammar &g, std::span<const int32_t> symbols) {
  if (Status s = validate_grammar(g); !s.ok()) return s;
  const std::vector<bool> nullable = nullable_rules(g);
  struct Item {
    uint32_t rule, alt, dot, origin;
    auto operator<=>(const Item &) const = default;
  };
  const size_t n = symbols.size();
  std::vector<std::vector<Item>> sets(n + 1);
  std::vector<std::set<Item>> seen(n + 1);
  auto add = [&](size_t k, Item it) {
    if (seen[k].insert(it).second) sets[k].push_back(it);
  };
  for (uint32_t a = 0; a < g.rules[g.root].alternatives.size(); ++a) add(0, {g.root, a, 0, 0});
  for (size_t k = 0; k <= n; ++k) {
    for (size_t i = 0; i < sets[k].size(); ++i) {
      const Item it = sets[k][i];
      const Sequence &alt = g.rules[it.rule].alternatives[it.alt];
      if (it.dot == alt.size()) { // complete: advance whoever waited for this rule
        for (size_t j = 0; j < sets[it.origin].size(); ++j) {
          const Item w = sets[it.origin][j];
          const Sequence &wa = g.rules[w.rule].alternatives[w.alt];
          if (w.dot < wa.size() && wa[w.dot].kind == Element::Kind::kRule &&
              wa[w.dot].value == it.rule)
            add(k, {w.rule, w.alt, w.dot + 1, w.origin});
        }
        continue;
      }
      const Element &e = alt[it.dot];
      if (e.kind == Element::Kind::kRule) {
        for (uint32_t a = 0; a < g.rules[e.value].alternatives.size(); ++a)
          add(k, {e.value, a, 0, uint32_t(k)});
        // Aycock and Horspool: a nullable rule may be stepped over at once.
        if (nullable[e.value]) add(k, {it.rule, it.alt, it.dot + 1, it.origin});
      } else if (k < n) {
        const int32_t s = symbols[k];
        const bool match = e.kind == Element::Kind::kBytes
                               ? s >= 0 && s < 256 && g.byte_sets[e.value].test(uint8_t(s))
                               : s >= 256 && uint32_t(s - 256) == e.value;
        if (match) add(k + 1, {it.rule, it.alt, it.dot + 1, it.origin});
      }
    }
  }
  for (const Item &it : sets[n])
    if (it.rule == g.root && it.origin == 0 &&
        it.dot == g.rules[it.rule].alternatives[it.alt].size())
      return true;
  return false;
}

Result<bool> grammar_accepts(const Grammar &g, std::string_view text) {
  std::vector<int32_t> symbols;
  symbols.reserve(text.size());
  for (char c : text) symbols.push_back(int32_t(uint8_t(c)));
  return grammar_accepts_symbols(g, symbols);
}

} // namespace offgraph::sample
