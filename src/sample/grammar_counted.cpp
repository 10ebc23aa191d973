// Bounded repetitions without a mask table per count. X{m,n} is laid out as m copies of X and a
// tail X (X (...)?)? (GrammarBuilder::repeat): every copy and every tail rule is a different
// stack context, and each would cost a walk of the vocabulary (a string with maxLength 40: 40
// walks of 128K tokens). Here the places of such a repetition are found in the grammar, a counting
// rule C ::= X C | "" is added per item X, and a context at one of those places is walked once
// with C standing in for the repetition, counting for every path how many iterations it has
// entered. A token's fate at a count is then a comparison: a table per count is derived from
// the one walk in microseconds, and the walk is shared (through the vocabulary) by every
// repetition of the same item, bounded or not, in every grammar.
#include "sample/grammar_matcher_internal.h"

#include <algorithm>
#include <map>
#include <unordered_set>

namespace offgraph::sample {

using namespace matcher_detail;

namespace matcher_detail {

namespace {

bool same(const Element &a, const Element &b) { return a.kind == b.kind && a.value == b.value; }

} // namespace

std::vector<RepetitionSpot> add_counting_rules(Grammar &g) {
  const std::vector<bool> nullable = nullable_rules(g);
  const uint32_t n_rules = uint32_t(g.rules.size());
  // An item counts when every iteration reads a byte: then a token's bytes bound its iterations,
  // and a walk's closure enters at most one new iteration per byte.
  auto countable = [&](const Element &x) {
    return x.kind == Element::Kind::kBytes ||
           (x.kind == Element::Kind::kRule && x.value < n_rules && !nullable[x.value]);
  };
  // Tails: t ::= X t' | "" with t' a tail of X (a star when t' is t), or t ::= X | "".
  // count[t]: the iterations t allows (kNoCountLimit for a star), 0 for other rules.
  std::vector<Element> item(n_rules);
  std::vector<uint32_t> next(n_rules, kRoot), count(n_rules, 0);
  std::vector<bool> shaped(n_rules, false), continued(n_rules, false);
  for (uint32_t r = 0; r < n_rules; ++r) {
    const auto &alts = g.rules[r].alternatives;
    if (alts.size() != 2 || !alts[1].empty() || alts[0].empty() || alts[0].size() > 2) continue;
    if (!countable(alts[0][0])) continue;
    if (alts[0].size() == 2 && alts[0][1].kind != Element::Kind::kRule) continue;
    item[r] = alts[0][0];
    next[r] = alts[0].size() == 2 ? alts[0][1].value : kRoot;
    shaped[r] = true;
  }
  std::vector<uint8_t> state(n_rules, 0); // 1: on the chain being followed, 2: settled
  std::vector<uint32_t> chain;
  for (uint32_t r = 0; r < n_rules; ++r) {
    if (!shaped[r] || state[r]) continue;
    chain.clear();
    uint32_t below = 0; // what the chain's last rule continues into allows
    bool broken = false;
    for (uint32_t at = r;;) {
      chain.push_back(at);
      state[at] = 1;
      const uint32_t n = next[at];
      if (n == kRoot) break; // t ::= X | ""
      if (n == at) {         // a star
        below = kNoCountLimit;
        break;
      }
      if (!shaped[n] || !same(item[n], item[at]) || state[n] == 1) { // not a tail of X
        broken = true;
        break;
      }
      if (state[n] == 2) {
        below = count[n];
        broken = below == 0;
        break;
      }
      at = n;
    }
    for (size_t i = chain.size(); i-- > 0;) {
      state[chain[i]] = 2;
      if (broken) continue;
      if (below != kNoCountLimit) ++below;
      count[chain[i]] = below;
    }
  }
  for (uint32_t r = 0; r < n_rules; ++r)
    if (count[r] && next[r] != kRoot && next[r] < n_rules && count[next[r]])
      continued[next[r]] = true;

  // The places: a run of copies of X at the end of an alternative, optionally followed by a
  // reference to a tail of X. At copy i of m, with a tail allowing n more, the repetition may end
  // after m - i to m - i + n iterations, the current one included.
  std::vector<RepetitionSpot> spots;
  std::map<std::pair<uint8_t, uint32_t>, uint32_t> counting; // item -> its counting rule
  std::vector<Rule> added;
  for (uint32_t r = 0; r < n_rules; ++r)
    for (uint32_t a = 0; a < g.rules[r].alternatives.size(); ++a) {
      const Sequence &s = g.rules[r].alternatives[a];
      const size_t n = s.size();
      if (n == 0) continue;
      uint32_t tail = 0;
      size_t end = n;
      if (n >= 2 && s[n - 1].kind == Element::Kind::kRule && s[n - 1].value < n_rules &&
          count[s[n - 1].value] && same(item[s[n - 1].value], s[n - 2])) {
        tail = count[s[n - 1].value];
        end = n - 1;
      }
      const Element x = s[end - 1];
      if (!countable(x)) continue;
      size_t first = end;
      while (first > 0 && same(s[first - 1], x)) --first;
      const size_t m = end - first;
      // A lone copy with nothing after it is a repetition only as the last rule of a tail chain.
      if (tail == 0 && m < 2 && !(count[r] == 1 && continued[r] && a == 0)) continue;
      // A rule item's places are where each copy returns to: none for a copy that ends the
      // alternative (it returns to the rule's caller).
      const bool at_item = x.kind == Element::Kind::kBytes;
      const size_t places = at_item ? m : std::min(m, n - first - 1);
      if (places == 0) continue;
      auto [it, fresh] = counting.try_emplace({uint8_t(x.kind), x.value}, 0);
      if (fresh) {
        it->second = n_rules + uint32_t(added.size());
        added.push_back({"counting-" + std::to_string(added.size()),
                         {{x, {Element::Kind::kRule, it->second}}, {}}});
      }
      for (size_t i = 0; i < places; ++i) {
        const uint64_t lo = m - i;
        const uint64_t hi = tail == kNoCountLimit ? kNoCountLimit : lo + tail;
        spots.push_back({r, a, uint32_t(first + i + (at_item ? 0 : 1)), it->second, at_item,
                         uint32_t(lo), uint32_t(std::min<uint64_t>(hi, kNoCountLimit))});
      }
    }
  for (Rule &rule : added) g.rules.push_back(std::move(rule));
  return spots;
}

namespace {

// A path's count travels with its stack top: (node, tag), tag = iterations entered since the
// context's start << 1 | whether it has left the repetition. Pseudo nodes stand for paths that
// left the known frames, or finished the sentence, on the byte just read.
struct Tagged {
  uint32_t node, tag;
  bool operator==(const Tagged &) const = default;
  bool operator<(const Tagged &o) const { return node != o.node ? node < o.node : tag < o.tag; }
};
constexpr uint32_t kLeftNode = 0xFFFFFFF0u, kDoneNode = 0xFFFFFFF1u;
constexpr uint32_t kExited = 1;
bool pseudo(uint32_t node) { return node >= kLeftNode; }

// The Expander of grammar_matcher_internal.h with counts: entering the counting rule's first
// alternative starts an iteration, and its empty alternative's end leaves the repetition.
class CountingExpander {
public:
  CountingExpander(const CompiledGrammar &g, StackArena &arena, bool no_exit)
      : g_(g), arena_(arena), no_exit_(no_exit) {}

  // The tops of `state` after `byte`; false when more than kMaxStacks (the walk is then given up).
  bool step(std::span<const Tagged> state, uint8_t byte, std::vector<Tagged> &out) {
    work_.clear();
    seen_.clear();
    if (!seen_set_.empty()) seen_set_.clear();
    out.clear();
    for (const Tagged &t : state) {
      if (pseudo(t.node)) continue;
      const StackNode n = arena_.nodes[t.node];
      const Code c = g_.code[n.pos];
      if (c.op == Op::kBytes && g_.grammar.byte_sets[c.value].test(byte))
        push(n.pos + 1, n.parent, t.tag);
    }
    while (!work_.empty()) {
      const Work w = work_.back();
      work_.pop_back();
      const Code c = g_.code[w.pos];
      switch (c.op) {
      case Op::kEnd: {
        const uint32_t tag = g_.counting_rule[g_.rule_of[w.pos]] ? w.tag | kExited : w.tag;
        if (w.parent == kRoot)
          out.push_back({kDoneNode, tag});
        else if (w.parent == kSentinel)
          out.push_back({kLeftNode, tag});
        else
          push(arena_.nodes[w.parent].pos, arena_.nodes[w.parent].parent, tag);
        break;
      }
      case Op::kBytes:
      case Op::kSpecial:
        out.push_back({arena_.intern(w.pos, w.parent), w.tag});
        break;
      case Op::kRule: {
        const uint32_t ret =
            g_.code[w.pos + 1].op == Op::kEnd ? w.parent : arena_.intern(w.pos + 1, w.parent);
        const auto &starts = g_.alternatives[c.value];
        const bool counts = g_.counting_rule[c.value];
        for (size_t k = 0; k < starts.size(); ++k) {
          if (counts && k == 1 && no_exit_) continue; // the repetition cannot end here
          push(starts[k], ret, counts && k == 0 ? w.tag + 2 : w.tag);
        }
        break;
      }
      }
      if (out.size() > GrammarMatcher::kMaxStacks) return false;
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return true;
  }

private:
  struct Work {
    uint32_t pos, parent, tag;
    bool operator==(const Work &) const = default;
  };
  struct WorkHash {
    size_t operator()(const Work &w) const {
      return std::hash<uint64_t>()(node_key(w.pos, w.parent) * 0x9E3779B97F4A7C15ull ^ w.tag);
    }
  };
  // As Expander::push: a linear scan while few, a hash set past that (an ambiguous grammar's
  // closure can hold thousands of paths).
  void push(uint32_t pos, uint32_t parent, uint32_t tag) {
    const Work w{pos, parent, tag};
    if (seen_set_.empty()) {
      if (std::find(seen_.begin(), seen_.end(), w) != seen_.end()) return;
      seen_.push_back(w);
      if (seen_.size() > 32) seen_set_.insert(seen_.begin(), seen_.end());
    } else if (!seen_set_.insert(w).second) {
      return;
    }
    work_.push_back(w);
  }

  const CompiledGrammar &g_;
  StackArena &arena_;
  bool no_exit_;
  std::vector<Work> work_, seen_;
  std::unordered_set<Work, WorkHash> seen_set_;
};

// The states a counting walk passes through, with counts relative to the state's least (a loop
// inside the repetition returns to the same state one iteration on), determinized as met. A
// transition says the next state and by how much its counts' base rose.
class CountingAutomaton {
public:
  // Per state: what a token ending there may do, in iterations (the current one included, so the
  // least is 1), relative to the state's base: go on inside the repetition (`inside`), or have
  // left it at one of `exits` counts.
  struct Info {
    ByteSet live;                              // bytes some top reads
    bool alive = false;                        // some top is a stack
    uint32_t least_live = CountedTable::kNone; // the least iterations of those
    bool left = false;                         // a path left the known frames on the last byte
    uint32_t left_lo = CountedTable::kNone, left_hi = 0; // the counts of those paths
    uint32_t inside = CountedTable::kNone, exit_lo = CountedTable::kNone, exit_hi = 0;
    bool gap = false;
  };

  CountingAutomaton(const CompiledGrammar &g, StackArena &arena, bool no_exit)
      : g_(g), arena_(arena), ex_(g, arena, no_exit) {
    intern({});
  }

  // `tops` sorted, their counts already relative (the least is 0).
  uint32_t intern(const std::vector<Tagged> &tops) {
    std::string key(reinterpret_cast<const char *>(tops.data()), tops.size() * sizeof(Tagged));
    auto [it, fresh] = index_.try_emplace(std::move(key), uint32_t(starts_.size()));
    if (!fresh) return it->second;
    starts_.push_back(uint32_t(pool_.size()));
    pool_.insert(pool_.end(), tops.begin(), tops.end());
    ends_.push_back(uint32_t(pool_.size()));
    Info info;
    std::vector<uint32_t> exits;
    for (const Tagged &t : tops) {
      const uint32_t need = (t.tag >> 1) + 1;
      if (t.tag & kExited)
        exits.push_back(need);
      else
        info.inside = std::min(info.inside, need);
      if (t.node == kLeftNode) {
        info.left = true;
        info.left_lo = std::min(info.left_lo, need);
        info.left_hi = std::max(info.left_hi, need);
      }
      if (pseudo(t.node)) continue;
      info.alive = true;
      info.least_live = std::min(info.least_live, need);
      const Code c = g_.code[arena_.nodes[t.node].pos];
      if (c.op == Op::kBytes)
        for (size_t w = 0; w < info.live.bits.size(); ++w)
          info.live.bits[w] |= g_.grammar.byte_sets[c.value].bits[w];
    }
    if (!exits.empty()) {
      std::sort(exits.begin(), exits.end());
      exits.erase(std::unique(exits.begin(), exits.end()), exits.end());
      info.exit_lo = exits.front();
      info.exit_hi = exits.back();
      info.gap = exits.back() - exits.front() + 1 != exits.size();
    }
    info_.push_back(info);
    if (starts_.size() <= kMaxRows) next_.resize(next_.size() + 256, kUnknown);
    return it->second;
  }

  const Info &info(uint32_t state) const { return info_[state]; }
  bool overflowed() const { return overflowed_; }

  // The state after `byte`, and how much the base of its counts rose.
  std::pair<uint32_t, uint32_t> step(uint32_t state, uint8_t byte) {
    if (state < kMaxRows) {
      const uint32_t known = next_[size_t(state) * 256 + byte];
      if (known != kUnknown) return {known >> 8, known & 0xFF};
    }
    return expand(state, byte);
  }

private:
  [[gnu::noinline]] std::pair<uint32_t, uint32_t> expand(uint32_t state, uint8_t byte) {
    uint32_t next = 0, rise = 0;
    if (info_[state].live.test(byte)) {
      tops_.assign(pool_.begin() + starts_[state], pool_.begin() + ends_[state]);
      if (!ex_.step(tops_, byte, out_)) {
        overflowed_ = true;
        out_.clear();
      }
      if (!out_.empty()) {
        uint32_t base = 0xFFFFFFFFu;
        for (const Tagged &t : out_) base = std::min(base, t.tag >> 1);
        for (Tagged &t : out_) t.tag -= base << 1;
        std::sort(out_.begin(), out_.end());
        next = intern(out_);
        rise = base;
      }
    }
    if (state < kMaxRows && next < (1u << 24) && rise < 256)
      next_[size_t(state) * 256 + byte] = next << 8 | rise;
    return {next, rise};
  }

  static constexpr uint32_t kUnknown = 0xFFFFFFFFu;
  static constexpr size_t kMaxRows = 16384;
  const CompiledGrammar &g_;
  const StackArena &arena_;
  CountingExpander ex_;
  std::unordered_map<std::string, uint32_t> index_;
  std::vector<Info> info_;
  std::vector<Tagged> pool_, tops_, out_;
  std::vector<uint32_t> starts_, ends_, next_;
  bool overflowed_ = false;
};

// walk_trie's side of a counting walk.
class CountingWalk {
public:
  struct Level {
    uint32_t state = 0;
    uint32_t base = 0; // iterations entered before the state's relative counts
    bool escape = false, sentinel = false;
    // The counts of the paths that left the frames and read on (escape), as the walk went.
    uint32_t escape_lo = CountedTable::kNone, escape_hi = 0;
  };

  CountingWalk(const CountingWalk &) = delete;
  CountingWalk &operator=(const CountingWalk &) = delete;
  CountingWalk(const CompiledGrammar &g, std::span<const uint32_t> frames, bool rooted,
               const ByteSet &follow, uint32_t cap, bool no_exit)
      : follow_(follow), cap_(cap), automaton_(g, arena_, no_exit) {
    uint32_t below = rooted ? kRoot : kSentinel;
    for (size_t f = frames.size(); f-- > 1;) below = arena_.intern(frames[f], below);
    const std::vector<Tagged> top{{arena_.intern(frames[0], below), 0}};
    root_.state = automaton_.intern(top);
  }

  const Level &root() const { return root_; }
  Level descend(const Level &up, uint8_t byte) {
    const auto [next, rise] = automaton_.step(up.state, byte);
    Level level{next,         up.base + rise, up.escape, automaton_.info(next).left,
                up.escape_lo, up.escape_hi};
    if (up.sentinel && follow_.test(byte)) widen_escape(level, up);
    return level;
  }
  // `level`'s escape counts joined by the paths that left the frames on `up`'s byte.
  void widen_escape(Level &level, const Level &up) const {
    const CountingAutomaton::Info &left = automaton_.info(up.state);
    level.escape = true;
    level.escape_lo = std::min(level.escape_lo, left.left_lo + up.base);
    level.escape_hi = std::max(level.escape_hi, left.left_hi + up.base);
  }
  // Some stack reads on at a count within the cap (the counts are relative to the state, so the
  // cap is checked here, against the level's base, not in the automaton).
  bool alive(const Level &level) const {
    const CountingAutomaton::Info &info = automaton_.info(level.state);
    return info.alive && uint64_t(level.base) + info.least_live <= cap_;
  }
  bool follows(uint8_t byte) const { return follow_.test(byte); }
  const CountingAutomaton::Info &info(const Level &level) const {
    return automaton_.info(level.state);
  }
  bool overflowed() const { return automaton_.overflowed(); }

  // Whether a path of this token's bytes leaves the known frames with bytes still to read: as
  // walk_trie would sort it (the token's own node, or a subtree given up on).
  bool escapes(std::string_view bytes) {
    Level level = root_;
    for (size_t k = 0; k < bytes.size(); ++k) {
      level = descend(level, uint8_t(bytes[k]));
      if (k + 1 == bytes.size()) return level.escape;
      if (!alive(level)) return level.escape || (level.sentinel && follows(uint8_t(bytes[k + 1])));
    }
    return false;
  }

private:
  const ByteSet &follow_;
  uint32_t cap_;
  StackArena arena_;
  CountingAutomaton automaton_;
  Level root_;
};

uint32_t shifted(uint32_t v, uint32_t base) { return v == CountedTable::kNone ? v : v + base; }

} // namespace

std::shared_ptr<CountedTable> walk_counted(const CompiledGrammar &g,
                                           std::span<const uint32_t> frames, bool rooted,
                                           const ByteSet &follow, uint32_t cap, bool no_exit,
                                           size_t &visited) {
  using Counts = CountedTable::Counts;
  constexpr uint32_t kNone = CountedTable::kNone;
  const auto &ids = g.vocabulary->token_ids();
  auto table = std::make_shared<CountedTable>();
  table->vocabulary_size = g.vocabulary->size();
  table->cap = cap;
  table->no_exit = no_exit;
  CountingWalk walk(g, frames, rooted, follow, cap, no_exit);
  std::vector<Counts> plain;
  auto other = [&](uint32_t from, uint32_t to, const CountedTable::Other &o) {
    // Counts past max_need are clamped to it: it must cover where paths leave the frames too.
    if (o.escape && o.escape_lo != kNone) table->max_need = std::max(table->max_need, o.escape_hi);
    for (uint32_t k = from; k < to; ++k) {
      table->others.push_back(o);
      table->others.back().counts.id = ids[k];
    }
  };
  walk_trie(
      *g.vocabulary, walk, visited,
      [&](const CountingWalk::Level &level, uint32_t from, uint32_t to) {
        if (from == to) return;
        const CountingAutomaton::Info &info = walk.info(level);
        Counts c{0, shifted(info.inside, level.base), shifted(info.exit_lo, level.base),
                 shifted(info.exit_lo == kNone ? kNone : info.exit_hi, level.base)};
        if (c.inside == kNone && c.exit_lo == kNone && !level.escape) return; // never
        if (c.inside != kNone) table->max_need = std::max(table->max_need, c.inside);
        if (c.exit_lo != kNone) table->max_need = std::max(table->max_need, c.exit_hi);
        if (level.escape || info.gap) {
          other(from, to, {c, info.gap, level.escape, level.escape_lo, level.escape_hi});
          return;
        }
        for (uint32_t k = from; k < to; ++k) {
          c.id = ids[k];
          plain.push_back(c);
        }
      },
      [&](const CountingWalk::Level &level, bool left_here, uint32_t from, uint32_t to) {
        CountingWalk::Level escaped = level;
        if (left_here) walk.widen_escape(escaped, level); // they leave on the next byte
        other(from, to,
              {{0, kNone, kNone, kNone}, false, true, escaped.escape_lo, escaped.escape_hi});
      });
  table->overflowed = walk.overflowed();
  // Counting sorts (keys are counts, at most max_need): by key, then by where exits start.
  auto p = std::make_shared<CountedTable::Plain>();
  auto key = [](const Counts &c) { return std::min(c.inside, c.exit_lo); };
  p->to.assign(size_t(table->max_need) + 1, 0);
  p->exit_to.assign(size_t(table->max_need) + 1, 0);
  size_t with_exits = 0;
  for (const Counts &c : plain) {
    ++p->to[key(c)];
    if (c.exit_lo != kNone) ++p->exit_to[c.exit_lo], ++with_exits;
  }
  for (size_t h = 1; h < p->to.size(); ++h) {
    p->to[h] += p->to[h - 1];
    p->exit_to[h] += p->exit_to[h - 1];
  }
  p->ids.resize(plain.size());
  p->by_exit.resize(with_exits);
  std::vector<uint32_t> at(p->to.size(), 0), exit_at(p->exit_to.size(), 0);
  for (size_t h = 1; h < at.size(); ++h) at[h] = p->to[h - 1], exit_at[h] = p->exit_to[h - 1];
  for (const Counts &c : plain) {
    p->ids[at[key(c)]++] = c.id;
    if (c.exit_lo != kNone) p->by_exit[exit_at[c.exit_lo]++] = c;
  }
  table->plain = std::move(p);
  return table;
}

std::shared_ptr<CountedTable> refine_counted(const CompiledGrammar &g, const CountedTable &wider,
                                             std::span<const uint32_t> frames, bool rooted,
                                             const ByteSet &follow) {
  auto table = std::make_shared<CountedTable>();
  table->plain = wider.plain;
  table->owns_plain = false; // charged with the table it came from
  table->max_need = wider.max_need;
  table->vocabulary_size = wider.vocabulary_size;
  table->cap = wider.cap;
  table->no_exit = wider.no_exit;
  CountingWalk walk(g, frames, rooted, follow, wider.cap, wider.no_exit);
  for (CountedTable::Other o : wider.others) {
    if (o.escape) o.escape = walk.escapes(g.vocabulary->texts().bytes[size_t(o.counts.id)]);
    if (o.escape || o.counts.inside != CountedTable::kNone ||
        o.counts.exit_lo != CountedTable::kNone)
      table->others.push_back(o);
  }
  table->overflowed = wider.overflowed || walk.overflowed();
  return table;
}

namespace {

// The plain tokens with key <= hi as a bitset: from the nearest prefix made before, by the
// difference, else from nothing.
std::shared_ptr<const std::vector<uint64_t>> prefix_bits(CountedTable::Plain &plain, uint32_t hi,
                                                         size_t vocabulary_size, size_t &grown) {
  std::lock_guard lock(plain.mutex);
  if (auto it = plain.prefix_bits.find(hi); it != plain.prefix_bits.end()) return it->second;
  const size_t n = plain.to[hi];
  const std::vector<uint64_t> *near = nullptr;
  size_t near_n = 0, near_cost = n;
  for (const auto &[h, bits] : plain.prefix_bits) {
    const size_t m = plain.to[h];
    const size_t cost = m > n ? m - n : n - m;
    if (cost < near_cost) near = bits.get(), near_n = m, near_cost = cost;
  }
  auto bits = std::make_shared<std::vector<uint64_t>>();
  if (near) {
    *bits = *near;
    for (size_t k = std::min(near_n, n); k < std::max(near_n, n); ++k) {
      const size_t id = size_t(plain.ids[k]);
      if (near_n > n)
        (*bits)[id >> 6] &= ~(uint64_t(1) << (id & 63));
      else
        set_bit(*bits, id);
    }
  } else {
    bits->assign((vocabulary_size + 63) / 64, 0);
    for (size_t k = 0; k < n; ++k) set_bit(*bits, size_t(plain.ids[k]));
  }
  plain.prefix_bits.emplace(hi, bits);
  grown += bits->size() * sizeof(uint64_t);
  return bits;
}

} // namespace

std::shared_ptr<const ContextTable> derive_counted(CountedTable &counted, uint32_t lo, uint32_t hi,
                                                   size_t &grown) {
  // Counts past max_need all give the same table.
  const uint32_t top = counted.max_need;
  hi = std::min(hi, top);
  lo = std::min(std::max(lo, 1u), top + 1);
  std::lock_guard lock(counted.mutex);
  if (auto it = counted.derived.find({lo, hi}); it != counted.derived.end()) return it->second;
  auto table = std::make_shared<ContextTable>();
  CountedTable::Plain &plain = *counted.plain;
  const size_t n_plain = plain.to[hi];
  // The prefix, less the tokens it holds whose exits start below lo and that no count in [lo, hi]
  // accepts (a token outside the prefix is accepted at no such count).
  const auto below_lo = std::span(plain.by_exit).first(lo > 1 ? plain.exit_to[lo - 1] : 0);
  auto refused = [&](const CountedTable::Counts &c) {
    return std::min(c.inside, c.exit_lo) <= hi && !CountedTable::accepted(c, lo, hi);
  };
  if (n_plain * 32 > counted.vocabulary_size) {
    table->accepted_bits = *prefix_bits(plain, hi, counted.vocabulary_size, grown);
    for (const CountedTable::Counts &c : below_lo)
      if (refused(c))
        table->accepted_bits[size_t(c.id) >> 6] &= ~(uint64_t(1) << (size_t(c.id) & 63));
  } else {
    table->accepted_ids.assign(plain.ids.begin(), plain.ids.begin() + std::ptrdiff_t(n_plain));
    if (!below_lo.empty()) {
      std::vector<int32_t> out;
      for (const CountedTable::Counts &c : below_lo)
        if (refused(c)) out.push_back(c.id);
      std::sort(out.begin(), out.end());
      std::erase_if(table->accepted_ids,
                    [&](int32_t id) { return std::binary_search(out.begin(), out.end(), id); });
    }
  }
  // The others: accepted where some path's count fits; uncertain where a path left the frames, or
  // where the counts their exits take have a gap around this range.
  for (const CountedTable::Other &o : counted.others) {
    const CountedTable::Counts &c = o.counts;
    const bool ends_fit =
        (c.exit_lo != CountedTable::kNone && lo <= c.exit_lo && c.exit_lo <= hi) ||
        (c.exit_lo != CountedTable::kNone && lo <= c.exit_hi && c.exit_hi <= hi);
    if ((c.inside != CountedTable::kNone && c.inside <= hi) ||
        (o.gap ? ends_fit : CountedTable::accepted(c, lo, hi)))
      table->accepted_ids.push_back(c.id);
    else if ((o.escape && o.escape_lo <= hi && lo <= o.escape_hi) ||
             (o.gap && c.exit_lo < lo && hi < c.exit_hi))
      table->uncertain.push_back(c.id);
  }
  grown += table->bytes();
  counted.derived.emplace(std::make_pair(lo, hi), table);
  return table;
}

} // namespace matcher_detail

} // namespace offgraph::sample
