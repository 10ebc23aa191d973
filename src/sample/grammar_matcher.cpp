// The grammar laid out as code, the vocabulary trie, and the matcher's walk of one request.
#include "sample/grammar_matcher_internal.h"

#include <chrono>
#include <limits>

namespace offgraph::sample {

using namespace matcher_detail;

struct GrammarMatcher::Arena : StackArena {};

namespace {

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

// Drops the alternatives that can never be completed (an empty byte set, a special token the
// vocabulary does not have as one, or a rule that is itself such, on every way through), so that
// a grammar never leaves a request in a state with no way on. Error when the root is such a
// rule: the grammar matches nothing.
Status prune_unproductive(Grammar &g, const GrammarVocabulary &vocabulary) {
  const Derivable productive = derivable(g, [&](const Element &e) {
    return e.kind == Element::Kind::kBytes ? !g.byte_sets[e.value].empty()
                                           : vocabulary.is_special(int32_t(e.value));
  });
  if (!productive.rules[g.root])
    return Status::error("grammar: rule '" + g.rules[g.root].name +
                         "' matches nothing (every way through it needs an empty character "
                         "class or a special token this vocabulary does not have)");
  for (uint32_t r = 0; r < g.rules.size(); ++r) {
    std::vector<Sequence> kept;
    for (size_t i = 0; i < g.rules[r].alternatives.size(); ++i)
      if (productive.alternatives[r][i]) kept.push_back(std::move(g.rules[r].alternatives[i]));
    g.rules[r].alternatives = std::move(kept);
  }
  return ok_status();
}

} // namespace

GrammarVocabulary::GrammarVocabulary(std::shared_ptr<const TokenTexts> texts)
    : texts_(std::move(texts)), tables_(std::make_shared<GrammarTableCache>()) {
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
    longest_token_ = std::max(longest_token_, s.size());
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
  if (Status s = prune_unproductive(grammar, *vocabulary); !s.ok()) return s;
  auto g = std::make_shared<CompiledGrammar>();
  g->grammar = std::move(grammar);
  g->vocabulary = std::move(vocabulary);
  g->end_tokens = std::move(end_tokens);
  const size_t own_rules = g->grammar.rules.size();
  const std::vector<RepetitionSpot> spots = add_counting_rules(g->grammar);
  lay_out(*g);
  g->own_code_size =
      own_rules < g->grammar.rules.size() ? g->alternatives[own_rules][0] : g->code.size();
  g->counting_rule.assign(g->grammar.rules.size(), false);
  for (size_t r = own_rules; r < g->grammar.rules.size(); ++r) g->counting_rule[r] = true;
  for (const RepetitionSpot &s : spots)
    g->counted_spots[g->alternatives[s.rule][s.alternative] + s.element] = {
        g->alternatives[s.counting_rule][0] + (s.at_item ? 0 : 1), s.lo, s.hi};
  g->follow = follow_sets(g->grammar);
  for (uint32_t p = 0; p < g->own_code_size; ++p)
    g->terminal_positions += g->code[p].op == Op::kBytes;
  g->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return std::shared_ptr<const CompiledGrammar>(std::move(g));
}

GrammarCompileStats CompiledGrammar::stats() const {
  std::lock_guard lock(mutex_);
  GrammarCompileStats s = computed_;
  s.terminal_positions = terminal_positions;
  s.seconds = seconds;
  return s;
}

GrammarCompileStats compile_stats(const CompiledGrammar &grammar) { return grammar.stats(); }

size_t grammar_vocabulary_size(const CompiledGrammar &grammar) {
  return grammar.vocabulary->size();
}

Status warm_up(std::shared_ptr<const CompiledGrammar> grammar, std::span<const int32_t> symbols,
               const std::atomic<bool> *cancel) {
  GrammarMatcher m(std::move(grammar));
  std::vector<uint64_t> bits;
  for (size_t i = 0; i < symbols.size(); ++i) {
    if (cancel && *cancel) return ok_status();
    if (Status s = m.fill_mask(bits); !s.ok()) return s;
    const int32_t sym = symbols[i];
    const char byte = char(uint8_t(sym));
    const bool ok = sym < 256 ? m.accept_bytes({&byte, 1}) : m.accept_token(sym - 256);
    if (!ok) return Status::error("warm-up: the grammar refuses symbol " + std::to_string(i));
  }
  return m.fill_mask(bits);
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar)
    : grammar_(std::move(grammar)), arena_(std::make_shared<Arena>()) {
  Expander ex(*grammar_, *arena_);
  Expansion e, all;
  for (uint32_t s : grammar_->alternatives[grammar_->grammar.root]) {
    ex.start(s, kRoot, e);
    all.tops.insert(all.tops.end(), e.tops.begin(), e.tops.end());
    all.complete |= e.complete;
    all.overflow |= e.overflow;
  }
  std::sort(all.tops.begin(), all.tops.end());
  all.tops.erase(std::unique(all.tops.begin(), all.tops.end()), all.tops.end());
  ambiguous_ = all.overflow || all.tops.size() > kMaxStacks;
  state_ = std::move(all.tops);
  if (all.complete) state_.push_back(kComplete);
}

GrammarMatcher::GrammarMatcher(const GrammarMatcher &o)
    : grammar_(o.grammar_), arena_(std::make_shared<Arena>(*o.arena_)), state_(o.state_),
      finished_(o.finished_), ambiguous_(o.ambiguous_), cache_(o.cache_),
      cache_next_(o.cache_next_), compact_at_(o.compact_at_) {}

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
  if (e.overflow) ambiguous_ = true;
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

Status too_ambiguous_error() {
  return Status::error("the grammar is too ambiguous here (more than " +
                       std::to_string(GrammarMatcher::kMaxStacks) + " parses at once)");
}

Status GrammarMatcher::fill_mask(std::vector<uint64_t> &bits) {
  const CompiledGrammar &g = *grammar_;
  const size_t n = g.vocabulary->size();
  if (!finished_ && ambiguous_) return too_ambiguous_error();
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
  std::vector<std::vector<uint32_t>> path;
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
    if (table.overflowed) return too_ambiguous_error();
    if (!table.accepted_bits.empty())
      for (size_t w = 0; w < bits.size(); ++w) bits[w] |= table.accepted_bits[w];
    for (int32_t a : table.accepted_ids) set_bit(bits, size_t(a));
    // The uncertain tokens, walked on the real stack. They come in trie order, so a token walks
    // on from the state its common prefix with the one before reached (`path[d]`: after d
    // bytes; `walked` of them valid), and the stacks made go back once at the end.
    const size_t mark = arena_->mark();
    path.resize(1);
    path[0].assign(1, t);
    std::string_view prev;
    size_t walked = 0;
    for (int32_t u : table.uncertain) {
      if (test_bit(bits, size_t(u))) continue;
      const std::string_view b = g.vocabulary->texts().bytes[size_t(u)];
      size_t d = 0;
      const size_t limit = std::min({walked, prev.size(), b.size()});
      while (d < limit && b[d] == prev[d]) ++d;
      for (; d < b.size() && !path[d].empty(); ++d) {
        ex.step(path[d], uint8_t(b[d]), e);
        if (e.overflow) {
          arena_->rollback(mark);
          return too_ambiguous_error();
        }
        if (path.size() <= d + 1) path.resize(d + 2);
        path[d + 1] = e.tops;
        if (e.complete) path[d + 1].push_back(kComplete);
      }
      walked = d; // path[d] is the state after b[0, d); empty if the token died before its end
      prev = b;
      if (d == b.size() && !path[d].empty()) set_bit(bits, size_t(u));
    }
    arena_->rollback(mark);
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
