#include "sample/grammar_exclude.h"

#include <algorithm>
#include <array>
#include <bit>
#include <map>
#include <optional>
#include <utility>

namespace offgraph::sample {

namespace {

using States = uint64_t; // a set of automaton states, one bit each
constexpr uint8_t kDead = 0xFF;
States bit(uint32_t s) { return States(1) << s; }

// Aho-Corasick over bytes with the states that complete a forbidden string removed: next[s][b]
// is the state after reading b in s, or kDead. State 0 is "no forbidden string begun".
struct Automaton {
  std::vector<std::array<uint8_t, 256>> next;
  uint32_t size() const { return uint32_t(next.size()); }
};

Result<Automaton> build_automaton(std::span<const std::string> forbidden) {
  if (forbidden.empty()) return Status::error("no substring to leave out");
  size_t total = 0;
  for (const std::string &f : forbidden) {
    if (f.empty()) return Status::error("a substring to leave out is empty");
    total += f.size();
  }
  if (total > kMaxExcludedBytes)
    return Status::error("the substrings to leave out hold " + std::to_string(total) +
                         " bytes, past " + std::to_string(kMaxExcludedBytes));
  std::vector<std::array<int, 256>> child(1);
  child[0].fill(-1);
  std::vector<bool> terminal(1, false);
  for (const std::string &f : forbidden) {
    int u = 0;
    for (char c : f) {
      if (child[size_t(u)][uint8_t(c)] < 0) {
        const int v = int(child.size());
        child.emplace_back().fill(-1); // may move the rows: no reference into them is held
        terminal.push_back(false);
        child[size_t(u)][uint8_t(c)] = v;
      }
      u = child[size_t(u)][uint8_t(c)];
    }
    terminal[size_t(u)] = true;
  }
  // Breadth first: a node's failure link is shorter, so already complete.
  const size_t n = child.size();
  std::vector<std::array<int, 256>> go(n);
  std::vector<int> fail(n, 0), order{0};
  for (size_t k = 0; k < order.size(); ++k) {
    const int u = order[k];
    for (int c = 0; c < 256; ++c) {
      const int v = child[size_t(u)][size_t(c)];
      if (v < 0) {
        go[size_t(u)][size_t(c)] = u == 0 ? 0 : go[size_t(fail[size_t(u)])][size_t(c)];
        continue;
      }
      go[size_t(u)][size_t(c)] = v;
      fail[size_t(v)] = u == 0 ? 0 : go[size_t(fail[size_t(u)])][size_t(c)];
      // A string that ends inside this one (its failure chain) is found here too.
      if (terminal[size_t(fail[size_t(v)])]) terminal[size_t(v)] = true;
      order.push_back(v);
    }
  }
  std::vector<int> id(n, -1);
  int live = 0;
  for (int u : order)
    if (!terminal[size_t(u)]) id[size_t(u)] = live++;
  Automaton a;
  a.next.resize(size_t(live));
  for (int u : order) {
    if (id[size_t(u)] < 0) continue;
    for (int c = 0; c < 256; ++c) {
      const int t = go[size_t(u)][size_t(c)];
      a.next[size_t(id[size_t(u)])][size_t(c)] = id[size_t(t)] < 0 ? kDead : uint8_t(id[size_t(t)]);
    }
  }
  return a;
}

// The product of a grammar with the automaton (Bar-Hillel): rule A read from state p to an end
// state in the set T becomes rule A[p,T]; an alternative's elements are chained through rules
// C[i,s,T] ("from element i in state s, ending in T"). Only what some sentence reaches is built:
// ends() first computes, per rule and start state, the states its sentences can end in.
//
// Targets are sets, not single states, so that a rule reference does not guess where it ends when
// the guesses cannot differ: before a byte set that moves those states alike (")" after a nested
// rule, a newline after a line), or at the end of an alternative, the states share one rule. A
// guess per state would keep one parse per guess alive at each nesting level: exponential stacks.
class Product {
public:
  Product(const Grammar &g, Automaton a, size_t max_rules)
      : g_(g), a_(std::move(a)), max_rules_(max_rules) {}

  Result<Grammar> run() {
    compute_ends();
    const States roots = ends_[g_.root][0];
    if (!roots)
      return Status::error("the grammar matches nothing once the forbidden text is left out");
    const uint32_t root = rule_ref(g_.root, 0, roots);
    while (!todo_.empty()) {
      if (b_.rule_count() > max_rules_)
        return Status::error("the grammar grows past " + std::to_string(max_rules_) +
                             " rules once the forbidden text is left out");
      const Key k = todo_.back();
      todo_.pop_back();
      define(k);
    }
    return std::move(b_).finish(root);
  }

private:
  // {rule, alternative (kWhole: the rule itself), element, from state, target set}
  using Key = std::array<uint64_t, 5>;
  static constexpr uint64_t kWhole = 0xFFFFFFFFu;

  // The bytes of set `set` that lead from state s to each state t (dead ones dropped).
  const std::vector<std::pair<uint8_t, ByteSet>> &split(uint32_t set, uint32_t s) {
    auto [it, fresh] = splits_.try_emplace({set, s});
    if (fresh) {
      std::array<ByteSet, 64> by_target{};
      States seen = 0;
      for (int c = 0; c < 256; ++c) {
        if (!g_.byte_sets[set].test(uint8_t(c))) continue;
        const uint8_t t = a_.next[s][size_t(c)];
        if (t == kDead) continue;
        by_target[t].set(uint8_t(c));
        seen |= bit(t);
      }
      for (uint32_t t = 0; t < a_.size(); ++t)
        if (seen & bit(t)) it->second.push_back({uint8_t(t), by_target[t]});
    }
    return it->second;
  }

  States step(const Element &e, uint32_t s) {
    if (e.kind == Element::Kind::kSpecial) return bit(0); // a special token is no text
    if (e.kind == Element::Kind::kRule) return ends_[e.value][s];
    States out = 0;
    for (const auto &[t, bytes] : split(e.value, s)) out |= bit(t);
    return out;
  }

  States run(const Sequence &seq, size_t from, States current) {
    for (size_t i = from; i < seq.size() && current; ++i) {
      States next = 0;
      for (uint32_t s = 0; s < a_.size(); ++s)
        if (current & bit(s)) next |= step(seq[i], s);
      current = next;
    }
    return current;
  }

  // Least fixed point by worklist: when a rule's end states grow, only the rules that refer to it
  // are looked at again (sweeping until nothing changes is quadratic on a long chain of rules).
  void compute_ends() {
    const size_t n = g_.rules.size();
    ends_.assign(n, std::vector<States>(a_.size(), 0));
    users_.assign(n, {});
    for (uint32_t r = 0; r < n; ++r)
      for (const Sequence &alt : g_.rules[r].alternatives)
        for (const Element &e : alt)
          if (e.kind == Element::Kind::kRule &&
              (users_[e.value].empty() || users_[e.value].back() != r))
            users_[e.value].push_back(r);
    std::vector<uint32_t> work;
    std::vector<bool> queued(n, true);
    for (uint32_t r = 0; r < n; ++r) work.push_back(r); // the last rules (often leaves) first
    while (!work.empty()) {
      const uint32_t r = work.back();
      work.pop_back();
      queued[r] = false;
      bool grew = false;
      for (uint32_t p = 0; p < a_.size(); ++p)
        for (const Sequence &alt : g_.rules[r].alternatives) {
          const States got = run(alt, 0, bit(p));
          if (got & ~ends_[r][p]) {
            ends_[r][p] |= got;
            grew = true;
          }
        }
      if (!grew) continue;
      for (uint32_t u : users_[r])
        if (!queued[u]) {
          queued[u] = true;
          work.push_back(u);
        }
    }
  }

  // The end states of alternative `alt` of `rule` from element i in state s: one backward table
  // per alternative (element by element, every start state), made the first time it is asked.
  States suffix(uint32_t rule, uint32_t alt, uint32_t i, uint32_t s) {
    auto [it, fresh] = suffixes_.try_emplace({rule, alt});
    std::vector<States> &table = it->second; // [i * states + s]
    const Sequence &seq = g_.rules[rule].alternatives[alt];
    const uint32_t n = a_.size();
    if (fresh) {
      table.assign((seq.size() + 1) * n, 0);
      for (uint32_t t = 0; t < n; ++t) table[seq.size() * n + t] = bit(t);
      for (size_t k = seq.size(); k-- > 0;)
        for (uint32_t t = 0; t < n; ++t) {
          States out = 0;
          const States next = step(seq[k], t);
          for (uint32_t u = 0; u < n; ++u)
            if (next & bit(u)) out |= table[(k + 1) * n + u];
          table[k * n + t] = out;
        }
    }
    return table[size_t(i) * n + s];
  }

  uint32_t rule_ref(uint32_t rule, uint32_t p, States targets) {
    return get({rule, kWhole, 0, p, targets});
  }
  uint32_t chain_ref(uint32_t rule, uint32_t alt, uint32_t i, uint32_t s, States targets) {
    return get({rule, alt, i, s, targets});
  }
  uint32_t get(const Key &k) {
    auto [it, fresh] = rules_.try_emplace(k, 0);
    if (fresh) {
      std::string name = g_.rules[k[0]].name;
      if (k[1] != kWhole) name += "-" + std::to_string(k[1]) + "." + std::to_string(k[2]);
      it->second = b_.declare(name + "@" + std::to_string(k[3]) + "-" + std::to_string(k[4]));
      todo_.push_back(k);
    }
    return it->second;
  }

  void define(const Key &k) {
    const uint32_t rule = uint32_t(k[0]), alt = uint32_t(k[1]), i = uint32_t(k[2]),
                   s = uint32_t(k[3]);
    const States targets = k[4];
    std::vector<Sequence> alternatives;
    if (k[1] == kWhole) {
      for (uint32_t a = 0; a < g_.rules[rule].alternatives.size(); ++a)
        if (suffix(rule, a, 0, s) & targets) chain(rule, a, 0, s, targets, alternatives);
    } else {
      chain(rule, alt, i, s, targets, alternatives);
    }
    b_.define(rules_.at(k), std::move(alternatives));
  }

  // Mid states after element i that the rest of the alternative treats alike: those its first
  // bytes (FIRST of the rest, over nullable rules) move to the same states, and, where the rest
  // can be empty, that are alike in being targets. A special token starts the text anew, so every
  // state is alike before one.
  // FIRST over bytes of each rule, by worklist as compute_ends (users_ is made there).
  void compute_first() {
    const size_t n = g_.rules.size();
    nullable_ = nullable_rules(g_);
    first_.assign(n, ByteSet{});
    std::vector<uint32_t> work;
    std::vector<bool> queued(n, true);
    for (uint32_t r = 0; r < n; ++r) work.push_back(r);
    while (!work.empty()) {
      const uint32_t r = work.back();
      work.pop_back();
      queued[r] = false;
      ByteSet u = first_[r];
      for (const Sequence &alt : g_.rules[r].alternatives) {
        const ByteSet f = first_seq(alt, 0);
        for (int w = 0; w < 4; ++w) u.bits[w] |= f.bits[w];
      }
      if (u == first_[r]) continue;
      first_[r] = u;
      for (uint32_t x : users_[r])
        if (!queued[x]) {
          queued[x] = true;
          work.push_back(x);
        }
    }
  }
  ByteSet first_seq(const Sequence &seq, size_t from) {
    ByteSet out;
    for (size_t k = from; k < seq.size(); ++k) {
      const Element &e = seq[k];
      if (e.kind == Element::Kind::kSpecial) return out;
      const ByteSet &f = e.kind == Element::Kind::kBytes ? g_.byte_sets[e.value] : first_[e.value];
      for (int w = 0; w < 4; ++w) out.bits[w] |= f.bits[w];
      if (e.kind == Element::Kind::kBytes || !nullable_[e.value]) return out;
    }
    return out;
  }
  bool seq_nullable(const Sequence &seq, size_t from) {
    for (size_t k = from; k < seq.size(); ++k) {
      const Element &e = seq[k];
      if (e.kind != Element::Kind::kRule || !nullable_[e.value]) return false;
    }
    return true;
  }
  std::vector<States> alike(const Sequence &seq, uint32_t i, States mids, States targets) {
    if (first_.empty()) compute_first();
    const ByteSet first = first_seq(seq, i + 1);
    const bool may_end = seq_nullable(seq, i + 1);
    std::map<std::pair<bool, std::array<uint8_t, 256>>, States> by_moves;
    for (uint32_t t = 0; t < a_.size(); ++t) {
      if (!(mids & bit(t))) continue;
      std::array<uint8_t, 256> moves{};
      for (int c = 0; c < 256; ++c)
        moves[size_t(c)] = first.test(uint8_t(c)) ? a_.next[t][size_t(c)] : 0;
      by_moves[{may_end && (targets & bit(t)), moves}] |= bit(t);
    }
    std::vector<States> groups;
    for (const auto &[key, group] : by_moves) groups.push_back(group);
    return groups;
  }
  std::vector<bool> nullable_;
  std::vector<ByteSet> first_;

  // The ways element i of the alternative, read from state s, continues to end in the targets;
  // the caller knows that some do.
  void chain(uint32_t rule, uint32_t alt, uint32_t i, uint32_t s, States targets,
             std::vector<Sequence> &out) {
    const Sequence &seq = g_.rules[rule].alternatives[alt];
    if (i == seq.size()) {
      out.push_back({}); // s is a target here
      return;
    }
    // `first` read, the rest goes on from `t` (any state of a group: they go on alike).
    auto emit = [&](Element first, uint32_t t) {
      if (!(suffix(rule, alt, i + 1, t) & targets)) return;
      Sequence s_out{first};
      if (i + 1 < seq.size())
        s_out.push_back(GrammarBuilder::ref(chain_ref(rule, alt, i + 1, t, targets)));
      out.push_back(std::move(s_out));
    };
    const Element &e = seq[i];
    switch (e.kind) {
    case Element::Kind::kSpecial:
      emit(e, 0);
      break;
    case Element::Kind::kBytes:
      for (const auto &[t, bytes] : split(e.value, s)) emit(b_.bytes(bytes), t);
      break;
    case Element::Kind::kRule: {
      // Mid states from which the rest can reach the targets.
      States mids = 0;
      for (uint32_t t = 0; t < a_.size(); ++t)
        if ((ends_[e.value][s] & bit(t)) && (suffix(rule, alt, i + 1, t) & targets)) mids |= bit(t);
      for (States group : alike(seq, i, mids, targets)) {
        const uint32_t t = uint32_t(std::countr_zero(group));
        // At the alternative's end the group is the targets the rule may end in itself.
        Sequence s_out{GrammarBuilder::ref(rule_ref(e.value, s, group))};
        if (i + 1 < seq.size())
          s_out.push_back(GrammarBuilder::ref(chain_ref(rule, alt, i + 1, t, targets)));
        out.push_back(std::move(s_out));
      }
      break;
    }
    }
  }

  const Grammar &g_;
  Automaton a_;
  size_t max_rules_;
  GrammarBuilder b_;
  std::vector<std::vector<States>> ends_;
  std::map<std::pair<uint32_t, uint32_t>, std::vector<std::pair<uint8_t, ByteSet>>> splits_;
  std::map<std::pair<uint32_t, uint32_t>, std::vector<States>> suffixes_;
  std::vector<std::vector<uint32_t>> users_; // rule -> the rules whose alternatives refer to it
  std::map<Key, uint32_t> rules_;
  std::vector<Key> todo_;
};

} // namespace

Result<Grammar> exclude_substrings(const Grammar &grammar, std::span<const std::string> forbidden,
                                   size_t max_rules) {
  auto automaton = build_automaton(forbidden);
  if (!automaton.ok()) return automaton.status();
  if (Status s = validate_grammar(grammar); !s.ok()) return s;
  return Product(grammar, std::move(automaton).value(), std::min(max_rules, kMaxGrammarRules))
      .run();
}

} // namespace offgraph::sample
