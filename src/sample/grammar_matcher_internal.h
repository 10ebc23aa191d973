// What the matcher (grammar_matcher.cpp) and the table builder (grammar_tables.cpp) share: the
// grammar laid out as code, hash-consed stacks, the expansion of stacks over a symbol, and the
// compiled grammar with its tables. Internal to sample/.
#pragma once

#include "sample/grammar_matcher.h"

#include <algorithm>
#include <list>
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
    std::shared_ptr<const matcher_detail::ContextTable> table;
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
      if (v.follow == follow) return {v.table, nullptr};
      if (holds(v.follow, follow) &&
          (!found.wider || v.table->uncertain.size() < found.wider->uncertain.size()))
        found.wider = v.table;
    }
    return found;
  }
  void insert(const std::string &key, const ByteSet &follow,
              std::shared_ptr<const matcher_detail::ContextTable> table) {
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
      if (v.follow == follow) return; // another grammar made it meanwhile
    bytes += table->bytes();
    it->second.variants.push_back({follow, std::move(table)});
    while (bytes > max_bytes && order.size() > 1) {
      auto last = entries.find(order.back());
      bytes -= 2 * last->first.size();
      for (const Variant &v : last->second.variants) bytes -= v.table->bytes();
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
  mutable std::mutex mutex_;
  mutable std::unordered_map<std::string, std::shared_ptr<const Table>> tables_;
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

inline void set_bit(std::vector<uint64_t> &bits, size_t i) {
  bits[i >> 6] |= uint64_t(1) << (i & 63);
}
inline bool test_bit(const std::vector<uint64_t> &bits, size_t i) {
  return (bits[i >> 6] >> (i & 63)) & 1;
}

} // namespace matcher_detail

} // namespace offgraph::sample
