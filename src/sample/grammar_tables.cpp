// Mask tables: the vocabulary trie walked from a stack context, and the cache through which every
// grammar compiled against a vocabulary shares them.
#include "sample/grammar_matcher_internal.h"

#include <chrono>
#include <optional>

namespace offgraph::sample {

using namespace matcher_detail;

namespace {

// The states a table's trie walk passes through, determinized as they are met. A state is the
// set of stack tops after some bytes; most bytes of a walk lead into a handful of states (inside
// a string every ordinary character returns to the same one), so the expansion of a state on a
// byte is computed once and every later trie node with that byte below that state is a lookup.
// Invariant: state 0 is the empty set (dead); ids index `starts`; a transition packs the next
// state with the sentinel and complete flags of that step.
class WalkAutomaton {
public:
  WalkAutomaton(const CompiledGrammar &g, const StackArena &arena, Expander &ex)
      : g_(g), arena_(arena), ex_(ex) {
    intern({});
  }

  uint32_t intern(std::span<const uint32_t> tops) {
    std::string key(reinterpret_cast<const char *>(tops.data()), tops.size() * sizeof(uint32_t));
    auto [it, fresh] = index_.try_emplace(std::move(key), uint32_t(starts_.size()));
    if (fresh) {
      starts_.push_back(uint32_t(pool_.size()));
      pool_.insert(pool_.end(), tops.begin(), tops.end());
      ends_.push_back(uint32_t(pool_.size()));
      ByteSet live; // the bytes some top reads: any other byte kills every stack at once
      for (uint32_t t : tops) {
        const Code c = g_.code[arena_.nodes[t].pos];
        if (c.op == Op::kBytes)
          for (size_t w = 0; w < live.bits.size(); ++w)
            live.bits[w] |= g_.grammar.byte_sets[c.value].bits[w];
      }
      live_.push_back(live);
      // Rows for the first states only: a walk that keeps finding new states (a grammar that
      // counts bytes) still runs, just without the memo past that.
      if (starts_.size() <= kMaxRows) next_.resize(next_.size() + 256, kUnknown);
    }
    return it->second;
  }

  // Some expansion met more than kMaxStacks parses (and kept only those).
  bool overflowed() const { return overflowed_; }

  static constexpr uint32_t kSentinelFlag = 2, kCompleteFlag = 1;
  // (next state << 2) | flags.
  uint32_t step(uint32_t state, uint8_t byte) {
    if (state < kMaxRows) {
      const uint32_t known = next_[size_t(state) * 256 + byte];
      if (known != kUnknown) return known;
    }
    return expand(state, byte);
  }

private:
  [[gnu::noinline]] uint32_t expand(uint32_t state, uint8_t byte) {
    if (!live_[state].test(byte)) {
      if (state < kMaxRows) next_[size_t(state) * 256 + byte] = 0;
      return 0;
    }
    tops_.assign(pool_.begin() + starts_[state], pool_.begin() + ends_[state]);
    ex_.step(tops_, byte, e_);
    overflowed_ |= e_.overflow;
    const uint32_t packed = (intern(e_.tops) << 2) | (e_.sentinel ? kSentinelFlag : 0) |
                            (e_.complete ? kCompleteFlag : 0);
    if (state < kMaxRows) next_[size_t(state) * 256 + byte] = packed;
    return packed;
  }

  static constexpr uint32_t kUnknown = 0xFFFFFFFFu;
  static constexpr size_t kMaxRows = 16384; // 16 MiB of transitions at most
  const CompiledGrammar &g_;
  const StackArena &arena_;
  Expander &ex_;
  std::unordered_map<std::string, uint32_t> index_;
  std::vector<ByteSet> live_;
  std::vector<uint32_t> pool_, starts_, ends_, next_, tops_;
  bool overflowed_ = false;
  Expansion e_;
};

// The walk of tokens' bytes from one stack context: its top frames (top first) with the unknown
// below them, or nothing below when `rooted`.
class ContextWalk {
public:
  struct Level {
    uint32_t state = 0;    // WalkAutomaton state; 0: no stack is alive
    bool escape = false;   // a path left the known frames before here and may go on below them
    bool sentinel = false; // a path left them exactly here
    bool here = false;     // a token ending on this byte is accepted
  };

  ContextWalk(const ContextWalk &) = delete; // members refer to each other
  ContextWalk &operator=(const ContextWalk &) = delete;
  // `follow`: what may come after the deepest frame's rule (deepest_follow).
  ContextWalk(const CompiledGrammar &g, std::span<const uint32_t> frames, bool rooted,
              const ByteSet &follow)
      : follow_(follow), ex_(g, arena_), automaton_(g, arena_, ex_) {
    uint32_t below = rooted ? kRoot : kSentinel;
    for (size_t f = frames.size(); f-- > 1;) below = arena_.intern(frames[f], below);
    const uint32_t top = arena_.intern(frames[0], below);
    root_.state = automaton_.intern({&top, 1});
  }

  const Level &root() const { return root_; }
  bool overflowed() const { return automaton_.overflowed(); }
  Level descend(const Level &up, uint8_t byte) {
    const uint32_t next = automaton_.step(up.state, byte);
    // Leaving the deepest known frame's rule: what may be read next is what may follow it.
    return {next >> 2, up.escape || (up.sentinel && follow_.test(byte)),
            bool(next & WalkAutomaton::kSentinelFlag),
            next != 0}; // here: a stack is alive, or a path left the frames or finished
  }
  bool alive(const Level &level) const { return level.state != 0; }
  // `byte` may come after the deepest known frame's rule.
  bool follows(uint8_t byte) const { return follow_.test(byte); }

  enum class Verdict { kAccepted, kUncertain, kRejected };
  // One token, as the trie walk would sort it.
  Verdict classify(std::string_view bytes) {
    Level level = root_;
    for (size_t k = 0; k < bytes.size(); ++k) {
      level = descend(level, uint8_t(bytes[k]));
      if (k + 1 == bytes.size())
        return level.here     ? Verdict::kAccepted
               : level.escape ? Verdict::kUncertain
                              : Verdict::kRejected;
      if (level.state == 0)
        return level.escape || (level.sentinel && follows(uint8_t(bytes[k + 1])))
                   ? Verdict::kUncertain
                   : Verdict::kRejected;
    }
    return Verdict::kRejected; // no bytes: never allowed under a grammar
  }

private:
  const ByteSet &follow_;
  StackArena arena_;
  Expander ex_;
  WalkAutomaton automaton_;
  Level root_;
};

// Tokens as runs of the trie's token order: a walk accepts whole subtrees at a time.
class TokenRuns {
public:
  void add(uint32_t from, uint32_t to) {
    if (from == to) return;
    if (!runs_.empty() && runs_.back().second == from)
      runs_.back().second = to;
    else
      runs_.push_back({from, to});
    count_ += to - from;
  }
  // As a table's accepted tokens: a bitset when many, else a list.
  void store(const GrammarVocabulary &v, ContextTable &table) const {
    const auto &ids = v.token_ids();
    if (count_ * 32 > v.size()) {
      table.accepted_bits.assign((v.size() + 63) / 64, 0);
      for (const auto &[from, to] : runs_)
        for (uint32_t k = from; k < to; ++k) set_bit(table.accepted_bits, size_t(ids[k]));
    } else {
      table.accepted_ids.reserve(count_);
      for (const auto &[from, to] : runs_)
        table.accepted_ids.insert(table.accepted_ids.end(), ids.begin() + from, ids.begin() + to);
    }
  }

private:
  std::vector<std::pair<uint32_t, uint32_t>> runs_;
  size_t count_ = 0;
};

// Sorts every token of the vocabulary for a context.
std::shared_ptr<const ContextTable> walk_vocabulary(const CompiledGrammar &g,
                                                    std::span<const uint32_t> frames, bool rooted,
                                                    const ByteSet &follow, size_t &visited) {
  const auto &ids = g.vocabulary->token_ids();
  auto table = std::make_shared<ContextTable>();
  ContextWalk walk(g, frames, rooted, follow);
  TokenRuns accepted;
  auto uncertain = [&](uint32_t from, uint32_t to) {
    table->uncertain.insert(table->uncertain.end(), ids.begin() + from, ids.begin() + to);
  };
  walk_trie(
      *g.vocabulary, walk, visited,
      [&](const ContextWalk::Level &level, uint32_t from, uint32_t to) {
        if (level.here)
          accepted.add(from, to);
        else if (level.escape)
          uncertain(from, to);
      },
      [&](const ContextWalk::Level &, bool, uint32_t from, uint32_t to) { uncertain(from, to); });
  accepted.store(*g.vocabulary, *table);
  table->overflowed = walk.overflowed();
  return table;
}

// A context's table from one made for the same code and a wider FOLLOW set: the same accepted
// tokens (accepting a token never reads FOLLOW), and its uncertain ones sorted again, since some
// left the frames on a byte this FOLLOW set lacks.
std::shared_ptr<const ContextTable> refine(const CompiledGrammar &g, const ContextTable &wider,
                                           std::span<const uint32_t> frames, bool rooted,
                                           const ByteSet &follow) {
  auto table = std::make_shared<ContextTable>();
  table->accepted_ids = wider.accepted_ids;
  table->accepted_bits = wider.accepted_bits;
  ContextWalk walk(g, frames, rooted, follow);
  for (int32_t u : wider.uncertain)
    if (walk.classify(g.vocabulary->texts().bytes[size_t(u)]) == ContextWalk::Verdict::kUncertain)
      table->uncertain.push_back(u);
  table->overflowed = wider.overflowed || walk.overflowed();
  return table;
}

// What a context's table depends on, written out so that equal code in two grammars gives equal
// keys: the rest of each frame's alternative and every rule reachable from those (numbered in
// the order first met), and whether it is rooted; beside the key, FOLLOW of its deepest frame's
// rule. Only what bytes can reach counts: tokens in the trie are ordinary, so a walk stops at a
// special token, and code after one (a frame below it, the end of the sentence, FOLLOW) is left
// out. The ATEM free text, which ends at <|eom|>, has one key in every grammar.
struct ClosureKey {
  std::string key;
  ByteSet follow; // empty where nothing below the frames is reached
};
// Past kMaxKeyBytes of code (a context that reaches a long chain of rules, as a bounded
// repetition is) the context is not shared: its key would cost more than its table, and there
// is one such context per count of the repetition.
constexpr size_t kMaxKeyBytes = 8192;
std::optional<ClosureKey> closure_key(const CompiledGrammar &g, std::span<const uint32_t> frames,
                                      bool rooted, const ByteSet &follow) {
  std::string code;
  auto put = [&code](const void *p, size_t n) { code.append(static_cast<const char *>(p), n); };
  std::vector<uint32_t> number(g.grammar.rules.size(), kRoot), queue;
  auto sequence = [&](uint32_t p) { // false: it stops at a special token
    for (; code.size() <= kMaxKeyBytes; ++p) {
      const Code c = g.code[p];
      code.push_back(char(c.op));
      switch (c.op) {
      case Op::kEnd:
        return true;
      case Op::kBytes:
        put(g.grammar.byte_sets[c.value].bits.data(), sizeof(ByteSet::bits));
        break;
      case Op::kSpecial:
        put(&c.value, sizeof(c.value));
        return false;
      case Op::kRule:
        // A counting rule counts where a real rule of the same code does not: keys must differ.
        if (g.counting_rule[c.value]) code.push_back('C');
        if (number[c.value] == kRoot) {
          number[c.value] = uint32_t(queue.size());
          queue.push_back(c.value);
        }
        put(&number[c.value], sizeof(uint32_t));
        break;
      }
    }
    return false; // too long: the caller gives up
  };
  uint32_t reached = 0; // frames whose code a byte can reach
  bool below = true;    // bytes can leave them all
  while (below && reached < frames.size()) below = sequence(frames[reached++]);
  for (size_t q = 0; q < queue.size() && code.size() <= kMaxKeyBytes; ++q) {
    const auto &starts = g.alternatives[queue[q]];
    const uint32_t count = uint32_t(starts.size());
    put(&count, sizeof(count));
    for (uint32_t s : starts) sequence(s);
  }
  if (code.size() > kMaxKeyBytes) return std::nullopt;
  ClosureKey out;
  out.key.assign(reinterpret_cast<const char *>(&reached), sizeof(reached));
  out.key += !below ? 's' : rooted ? 'r' : 'u';
  out.key += code;
  if (below && !rooted) out.follow = follow;
  return out;
}

} // namespace

size_t GrammarVocabulary::shared_tables() const {
  std::lock_guard lock(tables_->mutex);
  size_t n = 0; // a key holds a table per FOLLOW set met
  for (const auto &[key, entry] : tables_->entries) n += entry.variants.size();
  return n;
}
size_t GrammarVocabulary::shared_table_budget() const {
  std::lock_guard lock(tables_->mutex);
  return tables_->max_bytes;
}

void GrammarVocabulary::set_shared_table_budget(size_t bytes) {
  std::lock_guard lock(tables_->mutex);
  tables_->max_bytes = std::max<size_t>(1, bytes);
}

size_t GrammarVocabulary::shared_table_bytes() const {
  std::lock_guard lock(tables_->mutex);
  return tables_->bytes;
}

const ByteSet kNoBytes;

// What may be read after the deepest of a context's frames (nothing when rooted).
const ByteSet &deepest_follow(const CompiledGrammar &g, std::span<const uint32_t> frames,
                              bool rooted) {
  return rooted ? kNoBytes : g.follow[g.rule_of[frames.back()]];
}

// A context inside a bounded repetition: its table derived from the counting walk of the same
// context with the repetition's place replaced by its counting rule's (the topmost such frame;
// any below it stay as they are), walked once for every count and shared like a table. Null where
// no frame is such a place, or the counting walk met too many parses (the context is then walked
// as it is).
std::shared_ptr<const CompiledGrammar::Table>
CompiledGrammar::counted_table(std::span<const uint32_t> frames, bool rooted,
                               const ByteSet &deepest) const {
  const CountedSpot *spot = nullptr;
  size_t at = 0;
  uint32_t abstract[kContextFrames];
  for (size_t f = 0; f < frames.size(); ++f) {
    abstract[f] = frames[f];
    if (spot) continue;
    if (auto it = counted_spots.find(frames[f]); it != counted_spots.end()) {
      spot = &it->second;
      abstract[f] = spot->abstract_pos;
      at = f;
    }
  }
  if (!spot) return nullptr;
  // Where no token can finish the repetition (lo past the longest token), paths that leave it are
  // not followed either: after one copy of a 10,000-character block they would walk on through
  // the next block's real chain of positions, a new automaton state at every byte. Nothing below
  // the repetition's frame is then reached, so it is left out of the context (and its key, which
  // the next block's chain would make too long to share). Such a walk serves only such places; an
  // ordinary one serves them too.
  const bool no_exit = spot->lo > vocabulary->longest_token();
  const std::span<const uint32_t> context(abstract, no_exit ? at + 1 : frames.size());
  const bool walk_rooted = no_exit ? false : rooted;
  const ByteSet &follow_below = no_exit ? kNoBytes : deepest;
  GrammarTableCache &shared = vocabulary->table_cache();
  std::optional<ClosureKey> closure = closure_key(*this, context, walk_rooted, follow_below);
  if (closure) closure->key.insert(0, 1, 'c');
  // This grammar's walks, by the frames and FOLLOW (which the walk sorts leaving tokens by): the
  // ones no other grammar can share (no shared key, or overflowed), and the shared ones it found,
  // so that its next count finds them without the search below.
  std::string local(reinterpret_cast<const char *>(abstract), context.size() * sizeof(uint32_t));
  local += walk_rooted ? 'r' : 'u';
  local.append(reinterpret_cast<const char *>(follow_below.bits.data()), sizeof(follow_below.bits));
  // A walk need not follow paths past the iterations the place allows: walks are capped at a
  // power of two (a pattern's [a-z]{2,8} stops after 8 letters, not at the vocabulary's longest
  // word), and a walk with a higher cap, or none, serves a lower one.
  const uint32_t cap = counting_cap(spot->hi);
  auto with_cap = [](std::string key, uint32_t c, bool n) {
    key.append(reinterpret_cast<const char *>(&c), sizeof(c));
    return key += n ? 'n' : 'e';
  };
  local = with_cap(std::move(local), cap, no_exit);
  std::shared_ptr<CountedTable> counted;
  GrammarTableCache::FoundCounted found;
  if (auto it = counted_.find(local); it != counted_.end()) {
    counted = it->second;
  } else if (closure) {
    for (const bool n : {no_exit, false}) {
      for (uint32_t c = cap; !counted; c = counting_cap(c + 1)) {
        const GrammarTableCache::FoundCounted here =
            shared.find_counted(with_cap(closure->key, c, n), closure->follow);
        counted = here.exact;
        if (!found.wider) found.wider = here.wider;
        if (c == kNoCountLimit) break;
      }
      if (counted || !no_exit) break;
    }
  }
  if (!counted) {
    if (found.wider) {
      counted = refine_counted(*this, *found.wider, context, walk_rooted, follow_below);
      ++computed_.refined_tables;
    } else {
      counted = walk_counted(*this, context, walk_rooted, follow_below, cap, no_exit,
                             computed_.trie_nodes_walked);
      ++computed_.counting_walks;
    }
    if (closure && !counted->overflowed)
      shared.insert_counted(with_cap(closure->key, counted->cap, counted->no_exit), closure->follow,
                            counted);
  }
  counted_.emplace(local, counted);
  if (counted->overflowed) return nullptr;
  size_t grown = 0;
  auto table = derive_counted(*counted, spot->lo, spot->hi, grown);
  if (grown) shared.charge(*counted, grown);
  ++computed_.counted_tables;
  return table;
}

const CompiledGrammar::Table &CompiledGrammar::table(std::span<const uint32_t> frames,
                                                     bool rooted) const {
  std::string key(reinterpret_cast<const char *>(frames.data()), frames.size() * sizeof(uint32_t));
  key += rooted ? 'r' : 'u';
  std::lock_guard lock(mutex_);
  if (auto it = tables_.find(key); it != tables_.end()) return *it->second;
  const auto t0 = std::chrono::steady_clock::now();
  const ByteSet &deepest = deepest_follow(*this, frames, rooted);
  std::shared_ptr<const Table> made = counted_table(frames, rooted, deepest);
  if (!made) {
    GrammarTableCache &shared = vocabulary->table_cache();
    const std::optional<ClosureKey> closure = closure_key(*this, frames, rooted, deepest);
    const GrammarTableCache::Found found =
        closure ? shared.find(closure->key, closure->follow) : GrammarTableCache::Found{};
    made = found.exact;
    if (made) {
      ++computed_.shared_tables;
    } else {
      if (found.wider) {
        made = refine(*this, *found.wider, frames, rooted, deepest);
        ++computed_.refined_tables;
      } else {
        made = walk_vocabulary(*this, frames, rooted, deepest, computed_.trie_nodes_walked);
      }
      // An overflowed walk depends on how this grammar's positions happen to coincide, which the
      // key does not say: such a table stays this grammar's.
      if (closure && !made->overflowed) shared.insert(closure->key, closure->follow, made);
    }
  }
  const Table &t = *tables_.emplace(std::move(key), std::move(made)).first->second;
  ++computed_.computed_tables;
  computed_.accepted += t.accepted_bits.empty() ? t.accepted_ids.size() : 0;
  computed_.uncertain += t.uncertain.size();
  computed_.table_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return t;
}

void precompute_all(const CompiledGrammar &grammar) {
  for (uint32_t p = 0; p < grammar.own_code_size; ++p)
    if (grammar.code[p].op == Op::kBytes) {
      const uint32_t frame[1] = {p};
      (void)grammar.table(frame, false);
    }
}

} // namespace offgraph::sample
