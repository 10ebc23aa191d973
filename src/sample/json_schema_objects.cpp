// Objects (members in schema order, optional ones, extra keys) and arrays (prefixItems, items,
// length bounds), and tries of literals (keys, enum values).
#include "sample/json_schema_internal.h"

#include <algorithm>
#include <functional>
#include <set>

namespace offgraph::sample::json_schema_detail {
namespace {

constexpr size_t kMaxInlined = 16; // longer member chains become rules

} // namespace

// A quoted key that is none of `listed`. Written without escapes, so that the text is the key
// and a trie of the listed names can rule them out code point by code point.
Result<Element> Compiler::extra_key(const std::vector<std::string> &listed) {
  if (listed.empty()) return any_string();
  Ranges special = {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}};
  if (options_.escape_lt) special.push_back({'<', '<'});
  struct Node {
    std::map<uint32_t, size_t> next;
    bool end = false;
  };
  std::vector<Node> trie(1);
  for (const std::string &name : listed) {
    auto cps = decode_utf8(name);
    if (!cps) continue;
    if (std::any_of(cps->begin(), cps->end(), [&](uint32_t c) { return contains(special, c); }))
      continue; // cannot be written without escapes, so it cannot be written at all here
    size_t at = 0;
    for (uint32_t c : *cps) {
      auto it = trie[at].next.find(c);
      if (it == trie[at].next.end()) {
        trie.push_back({});
        it = trie[at].next.emplace(c, trie.size() - 1).first;
      }
      at = it->second;
    }
    trie[at].end = true;
  }
  auto plain = b.code_points(special, true);
  if (!plain) return plain;
  Element free = *b.repeat("key-chars", {*plain}, 0, kUnbounded);
  std::vector<uint32_t> rules(trie.size());
  for (size_t i = 0; i < trie.size(); ++i) rules[i] = b.declare("extra-key");
  for (size_t i = 0; i < trie.size(); ++i) {
    std::vector<Sequence> alternatives;
    if (!trie[i].end) alternatives.push_back({b.byte('"')});
    Ranges taken = special;
    for (const auto &[c, to] : trie[i].next) {
      taken = unite(taken, {{c, c}});
      Sequence s = b.literal(encode_utf8(c));
      s.push_back(GrammarBuilder::ref(rules[to]));
      alternatives.push_back(std::move(s));
    }
    auto other = b.code_points(taken, true);
    if (!other) return other;
    alternatives.push_back({*other, free, b.byte('"')});
    b.define(rules[i], std::move(alternatives));
  }
  return b.rule("extra-key", {{b.byte('"'), GrammarBuilder::ref(rules[0])}});
}

Result<Element> Compiler::object_value(const Json &schema, const std::string &path, int depth) {
  const Json *props = find(schema, "properties");
  if (props && !props->is_object()) return error("'properties' at " + path + " must be an object");
  std::vector<std::string> required;
  if (const Json *r = find(schema, "required")) {
    if (!r->is_array()) return error("'required' at " + path + " must be an array of strings");
    for (const Json &name : *r) {
      if (!name.is_string()) return error("'required' at " + path + " must be an array of strings");
      if (std::find(required.begin(), required.end(), name.get<std::string>()) == required.end())
        required.push_back(name.get<std::string>());
    }
  }
  const Json *extra = find(schema, "additionalProperties");
  if (extra && !extra->is_object() && !extra->is_boolean())
    return error("'additionalProperties' at " + path + " must be a schema");
  const bool closed = extra && extra->is_boolean() && !extra->get<bool>();
  auto is_required = [&](const std::string &k) {
    return std::find(required.begin(), required.end(), k) != required.end();
  };
  if (options_.strict) {
    if (!closed)
      return error("'additionalProperties' at " + path + " must be false in strict mode");
    if (props)
      for (const auto &[k, v] : props->items())
        if (!is_required(k))
          return error("'required' at " + path + " must list every property in strict mode; '" + k +
                       "' is missing");
  }

  NonLeading members_follow_a_brace(*this);
  std::vector<ObjectMember> members;
  std::vector<std::string> listed;
  auto add = [&](const std::string &key, const Json &sub, const std::string &at,
                 bool req) -> Status {
    auto v = value(sub, at, depth + 1);
    if (!v) return v.status();
    auto quoted = dump_json(Json(key), options_.escape_lt);
    if (!quoted) return error("'properties' at " + path + " has a name that is not valid UTF-8");
    Sequence rest = colon();
    rest.push_back(*v);
    members.push_back({std::move(*quoted), std::move(rest), req});
    return ok_status();
  };
  if (props) {
    for (const auto &[k, sub] : props->items()) {
      listed.push_back(k);
      const std::string at = child(child(path, "properties"), k);
      if (sub.is_boolean() && !sub.get<bool>()) {
        if (is_required(k))
          return error("'required' at " + path + " lists '" + k + "', whose schema at " + at +
                       " is false");
        continue;
      }
      OFFGRAPH_TRY(add(k, sub, at, is_required(k)));
    }
  }
  for (const std::string &k : required) {
    if (props && props->contains(k)) continue;
    if (closed)
      return error("'required' at " + path + " lists '" + k +
                   "', which is not in 'properties' while 'additionalProperties' is false");
    listed.push_back(k);
    const Json any = true;
    OFFGRAPH_TRY(add(k, extra ? *extra : any, child(path, "additionalProperties"), true));
  }
  // Extra keys: when additionalProperties is a schema, or the object lists no properties at all
  // (a free-form object). Otherwise none, which is sound and keeps the model to the listed ones.
  const bool extras = !closed && ((extra && extra->is_object()) || !props || props->empty());
  std::optional<Sequence> extra_member;
  Sequence tail;
  if (extras) {
    auto key = extra_key(listed);
    if (!key) return key.status();
    const Json any = true;
    auto v = value(extra ? *extra : any, child(path, "additionalProperties"), depth + 1);
    if (!v) return v.status();
    extra_member = Sequence{*key};
    for (Element e : colon()) extra_member->push_back(e);
    extra_member->push_back(*v);
    Sequence more = comma();
    more.insert(more.end(), extra_member->begin(), extra_member->end());
    auto rest = b.repeat("extra-members", more, 0, kUnbounded);
    if (!rest) return rest.status();
    tail = {*rest};
  }

  return object_body(path, members, extra_member, tail);
}

namespace {

// Tries of byte strings (literals), each made from another by adding one literal and copying
// only the path to it, so that tries of growing sets share what they have in common. A choice
// among many literals becomes one branch of bytes at a time: a parser holds one stack, not one
// per literal (the matcher caps the stacks it holds).
class LiteralTries {
public:
  // A trie of `text` (literal `id`) and the literals in `base` (0: none).
  uint32_t add(uint32_t base, const std::string &text, int id) {
    std::vector<uint32_t> path = {base}; // the old nodes along the text, 0 where there is none
    for (unsigned char c : text) {
      const Node &at = nodes_[path.back()];
      auto it = at.next.find(c);
      path.push_back(path.back() == 0 || it == at.next.end() ? 0 : it->second);
    }
    // New nodes from the end up: children before parents, so ids grow towards the root.
    Node end = path.back() == 0 ? Node{} : nodes_[path.back()];
    end.id = id;
    nodes_.push_back(std::move(end));
    uint32_t below = uint32_t(nodes_.size() - 1);
    for (size_t d = text.size(); d-- > 0;) {
      Node copy = path[d] == 0 ? Node{} : nodes_[path[d]];
      copy.next[uint8_t(text[d])] = below;
      nodes_.push_back(std::move(copy));
      below = uint32_t(nodes_.size() - 1);
    }
    return below;
  }

  // The trie at `root` as a rule: its literals, each followed by then(id).
  Element rule(GrammarBuilder &b, const std::string &name, uint32_t root,
               const std::function<Sequence(int)> &then) {
    std::vector<uint32_t> order, stack = {root};
    while (!stack.empty()) {
      const uint32_t u = stack.back();
      stack.pop_back();
      if (!seen_.insert(u).second) continue;
      if (u == root || needs_rule(u)) order.push_back(u);
      for (const auto &[c, v] : nodes_[u].next) stack.push_back(v);
    }
    std::sort(order.begin(), order.end()); // children first
    for (uint32_t u : order) {
      if (rules_.count(u)) continue;
      std::vector<Sequence> alternatives;
      if (nodes_[u].id >= 0) alternatives.push_back(then(nodes_[u].id));
      for (const auto &[c, v] : nodes_[u].next) {
        Sequence s = {b.byte(c)};
        uint32_t to = v;
        while (!needs_rule(to) && !nodes_[to].next.empty()) {
          s.push_back(b.byte(nodes_[to].next.begin()->first));
          to = nodes_[to].next.begin()->second;
        }
        if (needs_rule(to)) {
          s.push_back(rules_.at(to));
        } else {
          const Sequence t = then(nodes_[to].id);
          s.insert(s.end(), t.begin(), t.end());
        }
        alternatives.push_back(std::move(s));
      }
      rules_.emplace(u, b.choice(name, std::move(alternatives)));
    }
    return rules_.at(root);
  }

private:
  struct Node {
    std::map<uint8_t, uint32_t> next;
    int id = -1; // a literal ends here
  };
  // More than one way on: a node with several children, or one where a literal ends and another
  // goes on.
  bool needs_rule(uint32_t u) const {
    return nodes_[u].next.size() > 1 || (nodes_[u].id >= 0 && !nodes_[u].next.empty());
  }
  std::vector<Node> nodes_ = {Node{}}; // 0: the empty trie
  std::map<uint32_t, Element> rules_;  // roots, and the nodes that need rules
  std::set<uint32_t> seen_;            // nodes whose subtrie has its rules
};

} // namespace

Element Compiler::literals(const std::string &name, const std::vector<std::string> &texts) {
  LiteralTries tries;
  uint32_t root = 0;
  for (size_t i = 0; i < texts.size(); ++i) root = tries.add(root, texts[i], int(i));
  return tries.rule(b, name, root, [](int) { return Sequence{}; });
}

Element Compiler::object_body(const std::string &path, const std::vector<ObjectMember> &members,
                              const std::optional<Sequence> &extra_member, const Sequence &tail) {
  // next(i): the members from i on, from the first one written (those before it being optional
  // and absent); after(i): what follows member i-1, a comma and next(i), or nothing when every
  // member from i on is optional. The comma comes before the choice of the next member, and the
  // choice is a trie of keys, so a parser past a member holds a few items, not one per member.
  auto shortened = [&](Sequence s) {
    if (s.size() <= kMaxInlined) return s;
    return Sequence{b.rule(path, {std::move(s)})};
  };
  const size_t n = members.size();
  std::vector<Sequence> then(n); // after member i's key: ':' and its value, then after(i+1)
  std::vector<uint32_t> roots(n);
  LiteralTries tries;
  auto then_key = [&](int i) { return then[size_t(i)]; };
  std::optional<Sequence> first; // next(i)
  if (extra_member) {
    first = *extra_member;
    first->insert(first->end(), tail.begin(), tail.end());
  }
  const std::optional<Sequence> extra_first = first;
  Sequence after = tail; // after(i)
  bool optional_on = true;
  for (size_t i = n; i-- > 0;) {
    Sequence rest = members[i].rest;
    rest.insert(rest.end(), after.begin(), after.end());
    then[i] = shortened(std::move(rest));
    roots[i] =
        tries.add(members[i].required || i + 1 == n ? 0 : roots[i + 1], members[i].key, int(i));
    optional_on = optional_on && !members[i].required;
    const Element keys = tries.rule(b, path, roots[i], then_key);
    first = optional_on && extra_first ? Sequence{b.choice(path, {{keys}, *extra_first})}
                                       : Sequence{keys};
    Sequence behind = comma();
    behind.insert(behind.end(), first->begin(), first->end());
    after = optional_on ? Sequence{b.choice(path, {std::move(behind), {}})}
                        : shortened(std::move(behind));
  }
  std::vector<Sequence> alternatives;
  if (optional_on) alternatives.push_back({b.byte('{'), ws(), b.byte('}')});
  if (first) {
    Sequence full = {b.byte('{'), ws()};
    full.insert(full.end(), first->begin(), first->end());
    full.insert(full.end(), {ws(), b.byte('}')});
    alternatives.push_back(std::move(full));
  }
  return b.choice(path, std::move(alternatives));
}

Result<Element> Compiler::array_value(const Json &schema, const std::string &path, int depth) {
  auto min_items = count_keyword(schema, "minItems", path);
  if (!min_items) return min_items.status();
  auto max_items = count_keyword(schema, "maxItems", path);
  if (!max_items) return max_items.status();
  uint64_t lo = min_items->value_or(0), hi = max_items->value_or(kUnbounded);
  if (hi >= kUnbounded && max_items->has_value())
    return error("'maxItems' at " + path + " is " + with_commas(**max_items) + "; the limit is " +
                 with_commas(kUnbounded - 1));
  if (lo >= kUnbounded)
    return error("'minItems' at " + path + " is " + with_commas(lo) + "; the limit is " +
                 with_commas(kUnbounded - 1));
  if (hi < lo) return error("'maxItems' at " + path + " is less than 'minItems'");
  if (const Json *u = find(schema, "uniqueItems")) {
    if (!u->is_boolean()) return error("'uniqueItems' at " + path + " must be a boolean");
    if (u->get<bool>() && hi > 1)
      return error("keyword 'uniqueItems' at " + path +
                   " is not supported (unless 'maxItems' is at most 1)");
  }
  const Json *items = find(schema, "items");
  if (items && items->is_array())
    return error("keyword 'items' at " + path +
                 " as an array (a tuple, before draft 2020-12) is not supported; use "
                 "'prefixItems'");
  if (items && !items->is_object() && !items->is_boolean())
    return error("'items' at " + path + " must be a schema");
  const Json *prefix = find(schema, "prefixItems");
  if (prefix && (!prefix->is_array() || prefix->empty()))
    return error("'prefixItems' at " + path + " must be a non-empty array");

  NonLeading items_follow_a_bracket(*this);
  std::vector<Element> fixed; // prefixItems, up to the first false one
  if (prefix) {
    for (size_t i = 0; i < prefix->size(); ++i) {
      const Json &sub = (*prefix)[i];
      if (sub.is_boolean() && !sub.get<bool>()) {
        hi = std::min<uint64_t>(hi, i);
        break;
      }
      auto v = value(sub, child(child(path, "prefixItems"), std::to_string(i)), depth + 1);
      if (!v) return v.status();
      fixed.push_back(*v);
    }
  }
  std::optional<Element> rest;
  if (items && items->is_boolean() && !items->get<bool>()) {
    hi = std::min<uint64_t>(hi, fixed.size());
  } else if (fixed.size() < hi) {
    const Json any = true;
    auto v = value(items ? *items : any, child(path, "items"), depth + 1);
    if (!v) return v.status();
    rest = *v;
  }
  if (hi < lo)
    return error("'minItems' at " + path + " is more than the " + with_commas(hi) +
                 " items that 'prefixItems' and 'items' allow");

  // tail(i): what follows once i items are written.
  Sequence tail;
  const uint64_t k = fixed.size();
  if (rest && hi > k) {
    Sequence more = comma();
    more.push_back(*rest);
    const uint64_t from = std::max<uint64_t>(k, 1);
    auto r = repeat("array-items", more, lo > from ? lo - from : 0,
                    hi == kUnbounded ? kUnbounded : hi - from);
    if (!r) return r.status();
    tail = {*r};
  }
  for (uint64_t i = std::min<uint64_t>(k, hi); i-- > 1;) {
    Sequence step = comma();
    step.push_back(fixed[i]);
    step.insert(step.end(), tail.begin(), tail.end());
    if (step.size() > kMaxInlined) step = {b.rule(path, {std::move(step)})};
    tail = i < lo ? step : Sequence{b.choice(path, {std::move(step), {}})};
  }
  std::vector<Sequence> alternatives;
  if (lo == 0) alternatives.push_back({b.byte('['), ws(), b.byte(']')});
  if (hi > 0) {
    Sequence full = {b.byte('['), ws(), k > 0 ? fixed[0] : *rest};
    full.insert(full.end(), tail.begin(), tail.end());
    full.insert(full.end(), {ws(), b.byte(']')});
    alternatives.push_back(std::move(full));
  }
  return b.choice(path, std::move(alternatives));
}

} // namespace offgraph::sample::json_schema_detail
