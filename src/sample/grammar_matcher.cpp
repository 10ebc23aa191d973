#include "sample/grammar_matcher.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <limits>
#include <mutex>
#include <unordered_set>

namespace offgraph::sample {

namespace {

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

uint64_t node_key(uint32_t pos, uint32_t parent) { return (uint64_t(pos) << 32) | parent; }

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

} // namespace

struct GrammarMatcher::Arena : StackArena {};

class CompiledGrammar {
public:
  struct Table {
    std::vector<int32_t> accepted_ids;   // when few
    std::vector<uint64_t> accepted_bits; // when many: a bitset over token ids
    std::vector<int32_t> uncertain;
  };

  Grammar grammar;
  std::vector<Code> code;
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
  mutable std::unordered_map<std::string, std::unique_ptr<Table>> tables_;
  mutable GrammarCompileStats computed_;
};

namespace {

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

void set_bit(std::vector<uint64_t> &bits, size_t i) { bits[i >> 6] |= uint64_t(1) << (i & 63); }
bool test_bit(const std::vector<uint64_t> &bits, size_t i) {
  return (bits[i >> 6] >> (i & 63)) & 1;
}

void lay_out(CompiledGrammar &g) {
  const Grammar &gr = g.grammar;
  g.alternatives.assign(gr.rules.size(), {});
  for (uint32_t r = 0; r < gr.rules.size(); ++r)
    for (const Sequence &alt : gr.rules[r].alternatives) {
      g.alternatives[r].push_back(uint32_t(g.code.size()));
      for (const Element &e : alt) {
        const Op op = e.kind == Element::Kind::kBytes     ? Op::kBytes
                      : e.kind == Element::Kind::kSpecial ? Op::kSpecial
                                                          : Op::kRule;
        g.code.push_back({op, e.value});
        g.rule_of.push_back(r);
      }
      g.code.push_back({Op::kEnd, 0});
      g.rule_of.push_back(r);
    }
}

// FOLLOW(rule) over bytes: what may be read right after the rule ends, anywhere it is used. A
// position whose rule ends on a byte outside it is dead whatever lies below.
void compute_follow(CompiledGrammar &g) {
  const Grammar &gr = g.grammar;
  const size_t n = gr.rules.size();
  std::vector<ByteSet> first(n);
  std::vector<bool> nullable(n, false);
  auto unite = [](ByteSet &a, const ByteSet &b) {
    bool changed = false;
    for (int w = 0; w < 4; ++w) {
      const uint64_t x = a.bits[size_t(w)] | b.bits[size_t(w)];
      changed |= x != a.bits[size_t(w)];
      a.bits[size_t(w)] = x;
    }
    return changed;
  };
  // FIRST of the elements from i on; true if they can all be empty.
  auto first_of = [&](const Sequence &alt, size_t i, ByteSet &out) {
    for (; i < alt.size(); ++i) {
      const Element &e = alt[i];
      if (e.kind == Element::Kind::kBytes) {
        unite(out, gr.byte_sets[e.value]);
        return false;
      }
      if (e.kind == Element::Kind::kSpecial) return false;
      unite(out, first[e.value]);
      if (!nullable[e.value]) return false;
    }
    return true;
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r)
      for (const Sequence &alt : gr.rules[r].alternatives) {
        ByteSet f;
        const bool empty = first_of(alt, 0, f);
        changed |= unite(first[r], f);
        if (empty && !nullable[r]) nullable[r] = changed = true;
      }
  }
  g.follow.assign(n, ByteSet{});
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r)
      for (const Sequence &alt : gr.rules[r].alternatives)
        for (size_t i = 0; i < alt.size(); ++i) {
          if (alt[i].kind != Element::Kind::kRule) continue;
          ByteSet f;
          const bool rest_empty = first_of(alt, i + 1, f);
          if (rest_empty) unite(f, g.follow[r]);
          changed |= unite(g.follow[alt[i].value], f);
        }
  }
}

// Sorts every token for a stack whose top frames are `frames` (top first), walking the trie with
// the unknown below them, or nothing below when `rooted`.
void compile_context(const CompiledGrammar &g, std::span<const uint32_t> frames, bool rooted,
                     StackArena &arena, CompiledGrammar::Table &table) {
  const GrammarVocabulary &v = *g.vocabulary;
  const auto &nodes = v.nodes();
  const auto &ids = v.token_ids();
  // Leaving the deepest known frame's rule: what may be read next is what may follow that rule.
  ByteSet none;
  const ByteSet &follow = rooted ? none : g.follow[g.rule_of[frames.back()]];
  Expander ex(g, arena);
  struct Level {
    std::vector<uint32_t> tops;
    bool escape = false;   // a path left the rule before this depth and may go on below it
    bool sentinel = false; // a path left the rule exactly here
    size_t mark = 0;
  };
  std::vector<Level> levels(1);
  const size_t base = arena.mark();
  uint32_t below = rooted ? kRoot : kSentinel;
  for (size_t f = frames.size(); f-- > 1;) below = arena.intern(frames[f], below);
  levels[0].tops = {arena.intern(frames[0], below)};
  levels[0].mark = arena.mark();
  std::vector<int32_t> accepted;
  auto tokens_below = [&](uint32_t i) { // tokens of node i's subtree, itself excluded
    const uint32_t from = nodes[i].last;
    const uint32_t to =
        nodes[i].skip < nodes.size() ? nodes[nodes[i].skip].first : uint32_t(ids.size());
    for (uint32_t k = from; k < to; ++k) table.uncertain.push_back(ids[k]);
  };
  auto tokens_of_subtree = [&](uint32_t i) {
    for (uint32_t k = nodes[i].first; k < nodes[i].last; ++k) table.uncertain.push_back(ids[k]);
    tokens_below(i);
  };
  Expansion e;
  for (uint32_t i = 1; i < nodes.size();) {
    const auto &node = nodes[i];
    const size_t d = node.depth;
    const Level &up = levels[d - 1];
    arena.rollback(up.mark);
    ex.step(up.tops, node.byte, e);
    const bool escape = up.escape || (up.sentinel && follow.test(node.byte));
    const bool here = !e.tops.empty() || e.sentinel || e.complete;
    for (uint32_t k = node.first; k < node.last; ++k) {
      if (here)
        accepted.push_back(ids[k]);
      else if (escape)
        table.uncertain.push_back(ids[k]);
    }
    if (e.tops.empty()) {
      if (escape) {
        tokens_below(i);
      } else if (e.sentinel) {
        for (uint32_t c = i + 1; c < node.skip; c = nodes[c].skip)
          if (follow.test(nodes[c].byte)) tokens_of_subtree(c);
      }
      i = node.skip;
      continue;
    }
    if (levels.size() <= d) levels.resize(d + 1);
    levels[d].tops = e.tops;
    levels[d].escape = escape;
    levels[d].sentinel = e.sentinel;
    levels[d].mark = arena.mark();
    ++i;
  }
  arena.rollback(base);
  const size_t n = v.size();
  if (accepted.size() * 32 > n) {
    table.accepted_bits.assign((n + 63) / 64, 0);
    for (int32_t t : accepted) set_bit(table.accepted_bits, size_t(t));
  } else {
    table.accepted_ids = std::move(accepted);
  }
}

} // namespace

GrammarVocabulary::GrammarVocabulary(std::shared_ptr<const TokenTexts> texts)
    : texts_(std::move(texts)) {
  const auto &bytes = texts_->bytes;
  std::vector<int32_t> order;
  for (size_t t = 0; t < bytes.size(); ++t)
    if (!is_special(int32_t(t)) && !bytes[t].empty()) order.push_back(int32_t(t));
  auto key = [&](int32_t t) -> std::string_view {
    const std::string &s = bytes[size_t(t)];
    return std::string_view(s).substr(0, 65535);
  };
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return key(a) < key(b); });
  nodes_.push_back({0, 0, 0, 0, 0});
  std::vector<uint32_t> path{0}; // node ids from the root to the deepest open node
  std::string_view prev;
  for (int32_t t : order) {
    const std::string_view s = key(t);
    size_t common = 0;
    while (common < s.size() && common < prev.size() && s[common] == prev[common]) ++common;
    while (path.size() > common + 1) {
      nodes_[path.back()].skip = uint32_t(nodes_.size());
      path.pop_back();
    }
    for (size_t k = common; k < s.size(); ++k) {
      path.push_back(uint32_t(nodes_.size()));
      const uint32_t here = uint32_t(token_ids_.size());
      nodes_.push_back({uint8_t(s[k]), uint16_t(k + 1), 0, here, here});
    }
    token_ids_.push_back(t);
    nodes_[path.back()].last = uint32_t(token_ids_.size());
    prev = s;
  }
  while (!path.empty()) {
    nodes_[path.back()].skip = uint32_t(nodes_.size());
    path.pop_back();
  }
}

bool GrammarVocabulary::is_special(int32_t token) const {
  return token >= 0 && size_t(token) < texts_->special.size() && texts_->special[size_t(token)];
}

Result<std::shared_ptr<const CompiledGrammar>>
compile_grammar(Grammar grammar, std::shared_ptr<const GrammarVocabulary> vocabulary,
                std::vector<int32_t> end_tokens) {
  const auto t0 = std::chrono::steady_clock::now();
  if (!vocabulary) return Status::error("grammar: no vocabulary");
  if (Status s = validate_grammar(grammar); !s.ok()) return s;
  for (int32_t t : end_tokens)
    if (t < 0 || size_t(t) >= vocabulary->size())
      return Status::error("grammar: end token " + std::to_string(t) +
                           " is outside the vocabulary");
  auto g = std::make_shared<CompiledGrammar>();
  g->grammar = std::move(grammar);
  g->vocabulary = std::move(vocabulary);
  g->end_tokens = std::move(end_tokens);
  lay_out(*g);
  compute_follow(*g);
  for (const Code &c : g->code) g->terminal_positions += c.op == Op::kBytes;
  g->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return std::shared_ptr<const CompiledGrammar>(std::move(g));
}

const CompiledGrammar::Table &CompiledGrammar::table(std::span<const uint32_t> frames,
                                                     bool rooted) const {
  std::string key(reinterpret_cast<const char *>(frames.data()), frames.size() * sizeof(uint32_t));
  key += rooted ? 'r' : 'u';
  std::lock_guard lock(mutex_);
  auto [it, fresh] = tables_.try_emplace(std::move(key));
  if (!fresh) return *it->second;
  const auto t0 = std::chrono::steady_clock::now();
  it->second = std::make_unique<Table>();
  Table &t = *it->second;
  StackArena arena;
  compile_context(*this, frames, rooted, arena, t);
  ++computed_.computed_tables;
  computed_.accepted += t.accepted_bits.empty() ? t.accepted_ids.size() : 0;
  computed_.uncertain += t.uncertain.size();
  computed_.table_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return t;
}

GrammarCompileStats CompiledGrammar::stats() const {
  std::lock_guard lock(mutex_);
  GrammarCompileStats s = computed_;
  s.terminal_positions = terminal_positions;
  s.seconds = seconds;
  return s;
}

GrammarCompileStats compile_stats(const CompiledGrammar &grammar) { return grammar.stats(); }

void precompute_all(const CompiledGrammar &grammar) {
  for (uint32_t p = 0; p < grammar.code.size(); ++p)
    if (grammar.code[p].op == Op::kBytes) {
      const uint32_t frame[1] = {p};
      (void)grammar.table(frame, false);
    }
}
size_t grammar_vocabulary_size(const CompiledGrammar &grammar) {
  return grammar.vocabulary->size();
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar)
    : grammar_(std::move(grammar)), arena_(std::make_shared<Arena>()) {
  Expander ex(*grammar_, *arena_);
  Expansion e, all;
  for (uint32_t s : grammar_->alternatives[grammar_->grammar.root]) {
    ex.start(s, kRoot, e);
    all.tops.insert(all.tops.end(), e.tops.begin(), e.tops.end());
    all.complete |= e.complete;
  }
  std::sort(all.tops.begin(), all.tops.end());
  all.tops.erase(std::unique(all.tops.begin(), all.tops.end()), all.tops.end());
  state_ = std::move(all.tops);
  if (all.complete) state_.push_back(kComplete);
}

GrammarMatcher::GrammarMatcher(const GrammarMatcher &o)
    : grammar_(o.grammar_), arena_(std::make_shared<Arena>(*o.arena_)), state_(o.state_),
      finished_(o.finished_), cache_(o.cache_), cache_next_(o.cache_next_),
      compact_at_(o.compact_at_) {}

GrammarMatcher &GrammarMatcher::operator=(const GrammarMatcher &o) {
  if (this != &o) *this = GrammarMatcher(o);
  return *this;
}

bool GrammarMatcher::can_end() const {
  return !finished_ && !state_.empty() && state_.back() == kComplete;
}

bool GrammarMatcher::advance(uint32_t symbol) {
  Expander ex(*grammar_, *arena_);
  Expansion e;
  ex.step(state_, symbol, e);
  if (e.overflow || (e.tops.empty() && !e.complete)) return false;
  state_ = std::move(e.tops);
  if (e.complete) state_.push_back(kComplete);
  return true;
}

bool GrammarMatcher::accept_bytes(std::string_view bytes) {
  if (finished_) return false;
  const size_t mark = arena_->mark();
  const std::vector<uint32_t> before = state_;
  for (char c : bytes)
    if (!advance(uint8_t(c))) {
      state_ = before;
      arena_->rollback(mark);
      return false;
    }
  compact();
  return true;
}

bool GrammarMatcher::accept_token(int32_t token) {
  const GrammarVocabulary &v = *grammar_->vocabulary;
  if (finished_ || token < 0 || size_t(token) >= v.size()) return false;
  const auto &ends = grammar_->end_tokens;
  const bool end = std::find(ends.begin(), ends.end(), token) != ends.end();
  // An end token ends a complete sentence, whatever its text (end tokens need not be control
  // tokens, and the mask allows them exactly there).
  if (end && can_end() && !v.is_special(token)) {
    finished_ = true;
    return true;
  }
  if (!v.is_special(token)) {
    const std::string &b = v.texts().bytes[size_t(token)];
    return !b.empty() && accept_bytes(b);
  }
  const size_t mark = arena_->mark();
  if (advance(256 + uint32_t(token))) return true;
  arena_->rollback(mark);
  if (can_end() && end) {
    finished_ = true;
    return true;
  }
  return false;
}

Status GrammarMatcher::fill_mask(std::vector<uint64_t> &bits) {
  const CompiledGrammar &g = *grammar_;
  const size_t n = g.vocabulary->size();
  if (!finished_)
    for (const Cached &c : cache_)
      if (c.state == state_) {
        bits = c.bits; // the common case: a state seen before
        return ok_status();
      }
  bits.assign((n + 63) / 64, 0);
  if (finished_) return ok_status();
  Expander ex(g, *arena_);
  Expansion e;
  std::vector<uint32_t> walk;
  for (uint32_t t : state_) {
    if (t == kComplete) {
      for (int32_t end : g.end_tokens) set_bit(bits, size_t(end));
      continue;
    }
    const StackNode node = arena_->nodes[t];
    const Code c = g.code[node.pos];
    if (c.op == Op::kSpecial) {
      if (c.value < n && g.vocabulary->is_special(int32_t(c.value))) set_bit(bits, c.value);
      continue;
    }
    uint32_t frames[CompiledGrammar::kContextFrames];
    size_t n_frames = 0;
    uint32_t at = t;
    for (; at != kRoot && n_frames < CompiledGrammar::kContextFrames; at = arena_->nodes[at].parent)
      frames[n_frames++] = arena_->nodes[at].pos;
    const CompiledGrammar::Table &table = g.table({frames, n_frames}, at == kRoot);
    if (!table.accepted_bits.empty())
      for (size_t w = 0; w < bits.size(); ++w) bits[w] |= table.accepted_bits[w];
    for (int32_t a : table.accepted_ids) set_bit(bits, size_t(a));
    const uint32_t top[1] = {t};
    for (int32_t u : table.uncertain) {
      if (test_bit(bits, size_t(u))) continue;
      const std::string &b = g.vocabulary->texts().bytes[size_t(u)];
      const size_t mark = arena_->mark();
      walk.assign(top, top + 1);
      bool alive = true;
      for (char ch : b) {
        ex.step(walk, uint8_t(ch), e);
        if (e.overflow)
          return Status::error("the grammar is too ambiguous here (more than " +
                               std::to_string(kMaxStacks) + " parses at once)");
        if (e.tops.empty() && !e.complete) {
          alive = false;
          break;
        }
        walk = e.tops;
        if (e.complete) walk.push_back(kComplete);
      }
      arena_->rollback(mark);
      if (alive) set_bit(bits, size_t(u));
    }
  }
  constexpr size_t kCacheSize = 16;
  if (cache_.size() < kCacheSize) {
    cache_.push_back({state_, bits});
  } else {
    cache_[cache_next_] = {state_, bits};
    cache_next_ = (cache_next_ + 1) % kCacheSize;
  }
  return ok_status();
}

Status GrammarMatcher::mask_logits(std::span<float> logits) {
  if (logits.size() != grammar_->vocabulary->size())
    return Status::error("grammar: " + std::to_string(logits.size()) +
                             " logits for a vocabulary of " +
                             std::to_string(grammar_->vocabulary->size()),
                         StatusCode::kInternal);
  if (Status s = fill_mask(scratch_bits_); !s.ok()) return s;
  bool any = false;
  for (size_t i = 0; i < logits.size(); ++i) {
    const bool allowed = (scratch_bits_[i >> 6] >> (i & 63)) & 1;
    any |= allowed;
    if (!allowed) logits[i] = -std::numeric_limits<float>::infinity();
  }
  if (!any) return Status::error("the grammar allows no token here");
  return ok_status();
}

// Drops nodes no stack reaches any more, when they dominate: every accepted byte interns a few.
void GrammarMatcher::compact() {
  if (arena_->nodes.size() < compact_at_) return;
  std::unordered_map<uint32_t, uint32_t> remap;
  auto fresh = std::make_shared<Arena>();
  std::vector<uint32_t> chain;
  auto move = [&](uint32_t id) {
    chain.clear();
    for (uint32_t x = id; x != kRoot && !remap.count(x); x = arena_->nodes[x].parent)
      chain.push_back(x);
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
      const StackNode n = arena_->nodes[*it];
      const uint32_t parent = n.parent == kRoot ? kRoot : remap.at(n.parent);
      remap[*it] = fresh->intern(n.pos, parent);
    }
    return remap.at(id);
  };
  std::vector<uint32_t> moved = state_;
  for (uint32_t &t : moved)
    if (t != kComplete) t = move(t);
  // Mostly live (deep nesting): keep the arena, and look again only once it has doubled.
  if (fresh->nodes.size() * 4 > arena_->nodes.size()) {
    compact_at_ = 2 * arena_->nodes.size();
    return;
  }
  std::sort(moved.begin(), moved.end());
  state_ = std::move(moved);
  arena_ = std::move(fresh);
  compact_at_ = std::max<size_t>(kCompactAt, 4 * arena_->nodes.size());
  cache_.clear();
  cache_next_ = 0;
}

} // namespace offgraph::sample
