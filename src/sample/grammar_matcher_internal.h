// What the matcher (grammar_matcher.cpp) and the table builder (grammar_tables.cpp) share: the
// grammar laid out as code, hash-consed stacks, the expansion of stacks over a symbol, and the
// compiled grammar with its tables. Internal to sample/.
#pragma once

#include "sample/grammar_matcher.h"

#include <algorithm>
#include <bit>
#include <list>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace offgraph::sample {

namespace matcher_detail {

constexpr uint32_t kRoot = 0xFFFFFFFFu;     // parent of the sentence's own frame
constexpr uint32_t kSentinel = 0xFFFFFFFEu; // parent standing for "unknown", in compilation
constexpr uint32_t kComplete = 0xFFFFFFFFu; // a state entry: the sentence is complete here

enum class Op : uint8_t { kBytes, kSpecial, kRule, kEnd };
struct Code {
  Op op;
  uint32_t value;
};

struct StackNode {
  uint32_t pos, parent;
};

inline uint64_t node_key(uint32_t pos, uint32_t parent) { return (uint64_t(pos) << 32) | parent; }

// Hash-consed stack nodes: one id per (position, parent), so equal stacks have equal ids.
// Nodes made while trying something out are dropped again with mark/rollback.
struct StackArena {
  std::vector<StackNode> nodes;
  std::unordered_map<uint64_t, uint32_t> index;

  uint32_t intern(uint32_t pos, uint32_t parent) {
    auto [it, fresh] = index.try_emplace(node_key(pos, parent), uint32_t(nodes.size()));
    if (fresh) nodes.push_back({pos, parent});
    return it->second;
  }
  size_t mark() const { return nodes.size(); }
  void rollback(size_t mark) {
    for (size_t i = mark; i < nodes.size(); ++i)
      index.erase(node_key(nodes[i].pos, nodes[i].parent));
    nodes.resize(mark);
  }
};

// How every token fares from one stack context: accepted whatever lies below, uncertain (to be
// walked on the real stack), or rejected (in neither list).
struct ContextTable {
  std::vector<int32_t> accepted_ids;   // when few
  std::vector<uint64_t> accepted_bits; // when many: a bitset over token ids
  std::vector<int32_t> uncertain;
  bool overflowed = false; // a walk met more than kMaxStacks parses: the table is incomplete
  size_t bytes() const {
    return (accepted_ids.size() + uncertain.size()) * sizeof(int32_t) +
           accepted_bits.size() * sizeof(uint64_t);
  }
};

// A place inside a bounded repetition (X{m,n}, laid out as m copies of X then a tail
// X (X (...)?)?; a star X* likewise), where the stack context would otherwise be a context per
// count left, each its own walk of the vocabulary. Its table is derived instead from one walk of
// the repetition's counting rule (C ::= X C | "", added to the code, reached only by table walks),
// which counts iterations: the same place in C stands for this one, and [lo, hi] is how many
// iterations, the current one included, the repetition may end after (grammar_counted.cpp).
struct CountedSpot {
  uint32_t abstract_pos; // the position in the counting rule standing for this one
  uint32_t lo, hi;       // hi kNoCountLimit: a star
};
constexpr uint32_t kNoCountLimit = 0xFFFFFFFFu;

// A repetition place found in a Grammar (rule, alternative, element), before the code is laid out.
struct RepetitionSpot {
  uint32_t rule, alternative, element;
  uint32_t counting_rule; // C for this repetition's item
  bool at_item;           // the item is a byte set and this is it; else the return after the item
  uint32_t lo, hi;
};
// Finds the bounded repetitions (and stars) whose item cannot match the empty string, adds a
// counting rule per distinct item to `grammar` (after every rule it had), and returns the places.
std::vector<RepetitionSpot> add_counting_rules(Grammar &grammar);

struct CountedTable;
// The counting walk of a context whose frames stand at a counting rule (frames as
// CompiledGrammar::table's, `follow` what may come after the deepest one's rule), and the table
// it gives where the repetition may end after lo to hi iterations (`grown`: bytes it added to
// `counted`, which keeps the tables and prefix bitsets it derived; add to it).
// Paths past `cap` iterations are not followed (the table serves places with hi <= cap); with
// `no_exit`, no path leaves the repetition (it serves places whose lo is past every token's
// length, where no token can finish the repetition: a block of 10,000 characters).
std::shared_ptr<CountedTable> walk_counted(const CompiledGrammar &g,
                                           std::span<const uint32_t> frames, bool rooted,
                                           const ByteSet &follow, uint32_t cap, bool no_exit,
                                           size_t &visited);
// The cap a counting walk for a place allowing `hi` iterations is made with: a power of two from 8,
// none (kNoCountLimit) past 4096. Not a doubling loop: clang 14 (-O2, the fuzz tree) compiled the
// caller's `c == kNoCountLimit` test to false after inlining one, and the cap search never ended.
inline uint32_t counting_cap(uint32_t hi) {
  if (hi > 4096) return kNoCountLimit;
  return hi <= 8 ? 8u : std::bit_ceil(hi);
}
std::shared_ptr<const ContextTable> derive_counted(CountedTable &counted, uint32_t lo, uint32_t hi,
                                                   size_t &grown);
// A counting walk's result for a narrower FOLLOW set from one made for a wider one: the counts
// are the same (they never read FOLLOW); the tokens that left the frames are sorted again.
std::shared_ptr<CountedTable> refine_counted(const CompiledGrammar &g, const CountedTable &wider,
                                             std::span<const uint32_t> frames, bool rooted,
                                             const ByteSet &follow);

// One walk of the vocabulary from a counting context: for every token, how many iterations its
// paths need. A token is accepted at [lo, hi] when a path still inside the repetition at its end
// needs at most hi (`inside`), or a path that left it did so at a count in [lo, hi] (exits, from
// `exit_lo` to `exit_hi`). Where lo is at most exit_lo (always so for lo = 1: every tail and star)
// that is `key = min(inside, exit_lo) <= hi`: the plain tokens (no gap in their exits, no path out
// of the frames) are sorted by key, so a table is a prefix of them, corrected for lo > 1 through
// those whose exits start below lo. The others are compared one by one.
struct CountedTable {
  static constexpr uint32_t kNone = 0xFFFFFFFFu;
  struct Counts {
    int32_t id;
    uint32_t inside, exit_lo, exit_hi; // kNone: no such path
  };
  static bool accepted(const Counts &c, uint32_t lo, uint32_t hi) {
    return (c.inside != kNone && c.inside <= hi) ||
           (c.exit_lo != kNone && std::max(lo, c.exit_lo) <= std::min(hi, c.exit_hi));
  }
  // The plain tokens, shared by the tables refined from this one (FOLLOW never changes them).
  struct Plain {
    std::vector<int32_t> ids;      // by key, ascending
    std::vector<uint32_t> to;      // to[h]: how many have key <= h
    std::vector<Counts> by_exit;   // those with exits, by exit_lo ascending
    std::vector<uint32_t> exit_to; // exit_to[h]: how many of by_exit have exit_lo <= h
    std::mutex mutex;              // guards prefix_bits
    // The prefix of `ids` up to key h as a bitset over the vocabulary, for the h met.
    std::map<uint32_t, std::shared_ptr<const std::vector<uint64_t>>> prefix_bits;
    size_t bytes() const {
      return ids.size() * sizeof(int32_t) + (to.size() + exit_to.size()) * sizeof(uint32_t) +
             by_exit.size() * sizeof(Counts);
    }
  };
  struct Other {
    Counts counts;
    bool gap;    // some count between exit_lo and exit_hi is no path's
    bool escape; // a path left the known frames with bytes to read, at escape_lo to escape_hi
    uint32_t escape_lo, escape_hi;
  };
  std::shared_ptr<Plain> plain;
  std::vector<Other> others;
  uint32_t max_need = 1;        // every count past it allows the same
  uint32_t cap = kNoCountLimit; // paths past it were not followed: serves places with hi <= cap
  bool no_exit = false;         // no path left the repetition: serves places with lo past tokens
  size_t vocabulary_size = 0;
  bool overflowed = false;

  std::mutex mutex; // guards `derived`
  std::map<std::pair<uint32_t, uint32_t>, std::shared_ptr<const ContextTable>> derived;
  // Under GrammarTableCache::mutex: held by the shared cache, and the bytes charged to it.
  bool in_cache = false;
  size_t charged = 0;

  bool owns_plain = true; // false where refined from another table, which is charged for it
  size_t base_bytes() const {
    return (owns_plain ? plain->bytes() : 0) + others.size() * sizeof(Other);
  }
};

} // namespace matcher_detail

// Context tables, shared by every grammar compiled against the vocabulary. A table depends only
// on the code that bytes can reach from its frames and, for tokens that leave them all, on what
// may follow the deepest one's rule (FOLLOW), so grammars that share rules (JSON strings, numbers
// and whitespace; the ATEM free text) share their tables, and the full-vocabulary walk that builds
// one is paid once per process. Keyed by that code, written out canonically (closure_key); each
// key holds a table per FOLLOW set met. A table made for a wider FOLLOW is a sound start for a
// narrower one: the accepted tokens are the same, and only its uncertain ones need a second look
// (refine). Least recently used keys go past max_bytes (the grammars that hold a table keep it).
struct GrammarTableCache {
  static constexpr size_t kDefaultMaxBytes = size_t(256) << 20;
  size_t max_bytes = kDefaultMaxBytes; // under `mutex`
  struct Variant {
    ByteSet follow;
    std::shared_ptr<const matcher_detail::ContextTable> table; // or
    std::shared_ptr<matcher_detail::CountedTable> counted;     // under a counted key ('c' first)
    size_t bytes() const { return table ? table->bytes() : counted->charged; }
  };
  struct Entry {
    std::vector<Variant> variants;
    std::list<std::string>::iterator at;
  };
  struct Found {
    std::shared_ptr<const matcher_detail::ContextTable> exact; // made for this FOLLOW set
    std::shared_ptr<const matcher_detail::ContextTable>
        wider; // else the smallest made for a superset of it
  };

  std::mutex mutex;
  std::list<std::string> order; // most recently used first
  std::unordered_map<std::string, Entry> entries;
  size_t bytes = 0;

  static bool holds(const ByteSet &outer, const ByteSet &inner) {
    for (size_t w = 0; w < outer.bits.size(); ++w)
      if (inner.bits[w] & ~outer.bits[w]) return false;
    return true;
  }
  Found find(const std::string &key, const ByteSet &follow) {
    std::lock_guard lock(mutex);
    Found found;
    auto it = entries.find(key);
    if (it == entries.end()) return found;
    order.splice(order.begin(), order, it->second.at);
    for (const Variant &v : it->second.variants) {
      if (!v.table) continue;
      if (v.follow == follow) return {v.table, nullptr};
      if (holds(v.follow, follow) &&
          (!found.wider || v.table->uncertain.size() < found.wider->uncertain.size()))
        found.wider = v.table;
    }
    return found;
  }
  struct FoundCounted {
    std::shared_ptr<matcher_detail::CountedTable> exact, wider; // as Found
  };
  FoundCounted find_counted(const std::string &key, const ByteSet &follow) {
    std::lock_guard lock(mutex);
    FoundCounted found;
    auto it = entries.find(key);
    if (it == entries.end()) return found;
    order.splice(order.begin(), order, it->second.at);
    for (const Variant &v : it->second.variants) {
      if (!v.counted) continue;
      if (v.follow == follow) return {v.counted, nullptr};
      if (holds(v.follow, follow) &&
          (!found.wider || v.counted->others.size() < found.wider->others.size()))
        found.wider = v.counted;
    }
    return found;
  }
  void insert(const std::string &key, const ByteSet &follow,
              std::shared_ptr<const matcher_detail::ContextTable> table) {
    insert_variant(key, {follow, std::move(table), nullptr});
  }
  void insert_counted(const std::string &key, const ByteSet &follow,
                      std::shared_ptr<matcher_detail::CountedTable> counted) {
    insert_variant(key, {follow, nullptr, std::move(counted)});
  }
  // A table derived from a counted one: its bytes count while the cache holds that one.
  void charge(matcher_detail::CountedTable &counted, size_t n) {
    std::lock_guard lock(mutex);
    if (!counted.in_cache) return;
    counted.charged += n;
    bytes += n;
    evict();
  }

private:
  void insert_variant(const std::string &key, Variant variant) {
    std::lock_guard lock(mutex);
    auto [it, fresh] = entries.try_emplace(key);
    if (fresh) {
      order.push_front(key);
      it->second.at = order.begin();
      bytes += 2 * key.size(); // held in the map and in the order
    } else {
      order.splice(order.begin(), order, it->second.at);
    }
    for (const Variant &v : it->second.variants)
      if (v.follow == variant.follow && !v.table == !variant.table)
        return; // another grammar made it meanwhile
    if (variant.counted) {
      variant.counted->in_cache = true;
      variant.counted->charged = variant.counted->base_bytes();
    }
    bytes += variant.bytes();
    it->second.variants.push_back(std::move(variant));
    evict();
  }
  void evict() {
    while (bytes > max_bytes && order.size() > 1) {
      auto last = entries.find(order.back());
      bytes -= 2 * last->first.size();
      for (const Variant &v : last->second.variants) {
        bytes -= v.bytes();
        if (v.counted) v.counted->in_cache = false;
      }
      entries.erase(last);
      order.pop_back();
    }
  }
};

class CompiledGrammar {
public:
  using Table = matcher_detail::ContextTable;

  Grammar grammar;
  std::vector<matcher_detail::Code> code;
  std::vector<std::vector<uint32_t>> alternatives; // per rule: where each alternative starts
  std::vector<uint32_t> rule_of;                   // per position
  std::vector<ByteSet> follow;                     // per rule: bytes that may come after it
  std::shared_ptr<const GrammarVocabulary> vocabulary;
  std::vector<int32_t> end_tokens;
  size_t terminal_positions = 0;
  double seconds = 0;
  // Bounded repetitions (grammar_counted.cpp): the places whose tables come from a counting walk,
  // by position; which rules are counting rules; where their code starts (every position before
  // it is the grammar's own).
  std::unordered_map<uint32_t, matcher_detail::CountedSpot> counted_spots;
  std::vector<bool> counting_rule;
  size_t own_code_size = 0;

  // The table of a stack's top frames: its top position and the return positions of up to
  // kContextFrames - 1 frames below, with `rooted` when those are all the frames there are (then
  // nothing is unknown below, and no token is uncertain). Knowing where a rule returns to is what
  // keeps the uncertain sets small: a token that ends whitespace and goes on into the next
  // value is decided by the value that follows here, not by everything that may follow
  // whitespace anywhere. Computed the first time a stack has these top frames (a grammar has far
  // more contexts than an answer visits, and each costs a walk of the vocabulary), shared by every
  // request with this grammar and every thread: computed once under the lock, then read.
  static constexpr size_t kContextFrames = 3;
  const Table &table(std::span<const uint32_t> frames, bool rooted) const;
  GrammarCompileStats stats() const;

private:
  std::shared_ptr<const Table> counted_table(std::span<const uint32_t> frames, bool rooted,
                                             const ByteSet &follow) const;

  mutable std::mutex mutex_;
  mutable std::unordered_map<std::string, std::shared_ptr<const Table>> tables_;
  // Counting walks whose code is too long a key to share (kept for this grammar's other counts).
  mutable std::unordered_map<std::string, std::shared_ptr<matcher_detail::CountedTable>> counted_;
  mutable GrammarCompileStats computed_;
};

namespace matcher_detail {

// Where a step's stacks end up: the tops (terminal positions), and whether some path finished
// the sentence or, in compilation, ran into the unknown below.
struct Expansion {
  std::vector<uint32_t> tops;
  bool complete = false;
  bool sentinel = false;
  bool overflow = false; // more than kMaxStacks stacks
};

class Expander {
public:
  Expander(const CompiledGrammar &g, StackArena &arena) : g_(g), arena_(arena) {}

  // The stacks of `state` after reading `symbol` (a byte, or 256 + a special token's id).
  void step(std::span<const uint32_t> state, uint32_t symbol, Expansion &out) {
    begin(out);
    for (uint32_t t : state) {
      if (t == kComplete) continue;
      const StackNode n = arena_.nodes[t];
      const Code c = g_.code[n.pos];
      const bool match = c.op == Op::kBytes
                             ? symbol < 256 && g_.grammar.byte_sets[c.value].test(uint8_t(symbol))
                             : symbol >= 256 && symbol - 256 == c.value;
      if (match) push(n.pos + 1, n.parent);
    }
    run(out);
  }
  // The stacks that start at `pos` above `parent`.
  void start(uint32_t pos, uint32_t parent, Expansion &out) {
    begin(out);
    push(pos, parent);
    run(out);
  }

private:
  void begin(Expansion &out) {
    work_.clear();
    seen_.clear();
    if (!seen_set_.empty()) seen_set_.clear();
    out.tops.clear();
    out.complete = out.sentinel = out.overflow = false;
  }
  // Expansions are small (a handful of frames): a linear scan beats hashing until they are not.
  void push(uint32_t pos, uint32_t parent) {
    const uint64_t key = node_key(pos, parent);
    if (seen_set_.empty()) {
      if (std::find(seen_.begin(), seen_.end(), key) != seen_.end()) return;
      seen_.push_back(key);
      if (seen_.size() > 32) seen_set_.insert(seen_.begin(), seen_.end());
    } else if (!seen_set_.insert(key).second) {
      return;
    }
    work_.push_back({pos, parent});
  }
  void run(Expansion &out) {
    while (!work_.empty()) {
      const auto [pos, parent] = work_.back();
      work_.pop_back();
      const Code c = g_.code[pos];
      switch (c.op) {
      case Op::kEnd:
        if (parent == kRoot)
          out.complete = true;
        else if (parent == kSentinel)
          out.sentinel = true;
        else
          push(arena_.nodes[parent].pos, arena_.nodes[parent].parent);
        break;
      case Op::kBytes:
      case Op::kSpecial:
        out.tops.push_back(arena_.intern(pos, parent));
        break;
      case Op::kRule: {
        // A reference in last place returns straight to the caller's caller: right recursion
        // keeps the stack flat.
        const uint32_t ret =
            g_.code[pos + 1].op == Op::kEnd ? parent : arena_.intern(pos + 1, parent);
        for (uint32_t s : g_.alternatives[c.value]) push(s, ret);
        break;
      }
      }
      if (out.tops.size() > GrammarMatcher::kMaxStacks) {
        out.overflow = true;
        work_.clear();
      }
    }
    std::sort(out.tops.begin(), out.tops.end());
    out.tops.erase(std::unique(out.tops.begin(), out.tops.end()), out.tops.end());
  }

  const CompiledGrammar &g_;
  StackArena &arena_;
  std::vector<std::pair<uint32_t, uint32_t>> work_;
  std::vector<uint64_t> seen_;
  std::unordered_set<uint64_t> seen_set_;
};

// The vocabulary's trie walked from one stack context, skipping a subtree as soon as its bytes
// decide it. `walk.descend(level, byte)` gives the level after a byte (Level: `escape`, a path left
// the known frames with bytes still to read; `sentinel`, a path left them on this byte) and
// `walk.alive(level)` whether some stack reads on; `at(level, from, to)` is told the tokens
// (trie order) that end at each node, `uncertain(from, to)` those under a node where the walk
// stops with paths that went on below the frames (walked on the real stack at mask time):
// `uncertain(level, left_here, from, to)`, left_here when some of them leave the frames on the
// byte after this node's (the others left before).
template <class Walk, class At, class Uncertain>
void walk_trie(const GrammarVocabulary &v, Walk &walk, size_t &visited, At &&at,
               Uncertain &&uncertain) {
  const auto &nodes = v.nodes();
  auto end_of_subtree = [&](uint32_t i) { // the first token after node i's subtree
    return nodes[i].skip < nodes.size() ? nodes[nodes[i].skip].first
                                        : uint32_t(v.token_ids().size());
  };
  std::vector<typename Walk::Level> levels{walk.root()};
  for (uint32_t i = 1; i < nodes.size();) {
    const auto &node = nodes[i];
    const size_t d = node.depth;
    ++visited;
    const typename Walk::Level level = walk.descend(levels[d - 1], node.byte);
    at(level, node.first, node.last);
    if (!walk.alive(level)) {
      if (level.escape) // and if paths also left on this byte, their counts join the escape's
        uncertain(level, level.sentinel, node.last, end_of_subtree(i));
      else if (level.sentinel)
        for (uint32_t c = i + 1; c < node.skip; c = nodes[c].skip)
          if (walk.follows(nodes[c].byte))
            uncertain(level, true, nodes[c].first, end_of_subtree(c));
      i = node.skip;
      continue;
    }
    if (levels.size() <= d) levels.resize(d + 1);
    levels[d] = level;
    ++i;
  }
}

inline void set_bit(std::vector<uint64_t> &bits, size_t i) {
  bits[i >> 6] |= uint64_t(1) << (i & 63);
}
inline bool test_bit(const std::vector<uint64_t> &bits, size_t i) {
  return (bits[i >> 6] >> (i & 63)) & 1;
}

} // namespace matcher_detail

} // namespace offgraph::sample
