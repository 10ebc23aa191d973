#include "engine/prefix_tree.h"

#include <algorithm>
#include <string>

namespace offgraph::engine {

struct PrefixTree::Node {
  std::vector<int32_t> edge; // the tokens from the parent's end to this node's end
  Node *parent = nullptr;
  std::map<int32_t, std::unique_ptr<Node>> children; // by the first token of their edge
  int32_t depth = 0;
  std::vector<SeqId> ending; // sequences holding exactly the tokens up to here
  std::optional<SnapshotId> snapshot;
  int32_t reach = 0; // the snapshot's
  int32_t below = 0; // sequences ending here or under this node
};

PrefixTree::PrefixTree() : root_(std::make_unique<Node>()) {}
PrefixTree::~PrefixTree() = default;

void PrefixTree::split(Node *node, size_t at) {
  // node keeps edge[0, at); a new child takes the rest and everything that ended at node.
  auto rest = std::make_unique<Node>();
  rest->edge.assign(node->edge.begin() + long(at), node->edge.end());
  rest->parent = node;
  rest->children = std::move(node->children);
  for (auto &[t, c] : rest->children) c->parent = rest.get();
  rest->depth = node->depth;
  rest->ending = std::move(node->ending);
  rest->snapshot = node->snapshot;
  rest->reach = node->reach;
  rest->below = node->below;
  node->edge.resize(at);
  node->depth -= int32_t(rest->edge.size());
  node->ending.clear();
  node->snapshot.reset();
  node->reach = 0;
  node->children.clear();
  const int32_t first = rest->edge.front();
  node->children.emplace(first, std::move(rest));
}

PrefixTree::Node *PrefixTree::descend(std::span<const int32_t> tokens, bool create) {
  Node *n = root_.get();
  size_t i = 0;
  while (i < tokens.size()) {
    auto it = n->children.find(tokens[i]);
    if (it == n->children.end()) {
      if (!create) return nullptr;
      auto child = std::make_unique<Node>();
      child->edge.assign(tokens.begin() + long(i), tokens.end());
      child->parent = n;
      child->depth = int32_t(tokens.size());
      Node *made = child.get();
      n->children.emplace(tokens[i], std::move(child));
      return made;
    }
    Node *c = it->second.get();
    size_t k = 0;
    while (k < c->edge.size() && i + k < tokens.size() && c->edge[k] == tokens[i + k]) ++k;
    if (k < c->edge.size()) {
      if (i + k < tokens.size() && !create) return nullptr; // diverges inside the edge
      split(c, k);
      // Whatever ended at c now ends at its new child.
      Node *moved = c->children.begin()->second.get();
      for (SeqId s : moved->ending) sequences_[s].first = moved;
      if (moved->snapshot) snapshots_[*moved->snapshot] = moved;
    }
    n = c;
    i += k;
  }
  return n;
}

void PrefixTree::merge_with_child(Node *n) {
  std::unique_ptr<Node> child = std::move(n->children.begin()->second);
  n->children.clear();
  n->edge.insert(n->edge.end(), child->edge.begin(), child->edge.end());
  n->depth = child->depth;
  n->ending = std::move(child->ending);
  n->snapshot = child->snapshot;
  n->reach = child->reach;
  n->children = std::move(child->children);
  for (auto &[t, c] : n->children) c->parent = n;
  for (SeqId s : n->ending) sequences_[s].first = n;
  if (n->snapshot) snapshots_[*n->snapshot] = n;
}

PrefixTree::Match PrefixTree::match(std::span<const int32_t> prompt, int32_t limit) const {
  Match m;
  const Node *n = root_.get(); // matched to its end, at depth i
  const Node *under = nullptr; // the node whose subtree holds every sequence matching m.depth
  size_t i = 0;
  // Whether a snapshot past depth i reaching back to it could resume deeper than the best so far.
  auto worth_reaching = [&](size_t depth) {
    return max_reach_ > 0 && std::min(int32_t(depth), limit) > m.restore_depth;
  };
  while (true) {
    auto it = i < prompt.size() ? n->children.find(prompt[i]) : n->children.end();
    const Node *next = it == n->children.end() ? nullptr : it->second.get();
    // The branches the prompt leaves here: their snapshots may reach back to this depth.
    if (worth_reaching(i))
      for (const auto &[t, c] : n->children)
        if (c.get() != next) offer_reaching(c.get(), std::min(int32_t(i), limit), m);
    if (!next) break;
    size_t k = 0;
    while (k < next->edge.size() && i + k < prompt.size() && next->edge[k] == prompt[i + k]) ++k;
    i += k;
    if (k < next->edge.size()) {
      under = next; // the prompt leaves (or ends) inside its edge
      if (worth_reaching(i)) offer_reaching(next, std::min(int32_t(i), limit), m);
      break;
    }
    n = next;
    if (n->snapshot) {
      const int32_t at = std::min(n->depth, limit);
      if (at > m.restore_depth && at >= n->depth - n->reach)
        m.snapshot = n->snapshot, m.snapshot_depth = n->depth, m.restore_depth = at;
    }
  }
  m.depth = int32_t(i);
  if (m.depth == 0) return m;
  collect_sequences(under ? under : n, m.sequences);
  if (m.snapshot) { // every node has a sequence ending at or under it
    const Node *x = snapshots_.at(*m.snapshot);
    while (x->ending.empty()) x = x->children.begin()->second.get();
    m.snapshot_source = x->ending.front();
  }
  return m;
}

void PrefixTree::offer_reaching(const Node *node, int32_t at, Match &m) const {
  // Depth grows downwards, so nothing under a node deeper than at + max_reach_ reaches back.
  if (node->depth - max_reach_ > at || m.restore_depth == at) return;
  if (node->snapshot && node->depth - node->reach <= at) {
    m.snapshot = node->snapshot, m.snapshot_depth = node->depth, m.restore_depth = at;
    return;
  }
  for (const auto &[t, c] : node->children) offer_reaching(c.get(), at, m);
}

void PrefixTree::collect_sequences(const Node *node, std::vector<SeqId> &out) const {
  out.insert(out.end(), node->ending.begin(), node->ending.end());
  for (const auto &[t, c] : node->children) collect_sequences(c.get(), out);
}

bool PrefixTree::insert_sequence(std::span<const int32_t> tokens, SeqId seq) {
  if (sequences_.count(seq) || tokens.empty()) return false;
  Node *n = descend(tokens, true);
  n->ending.push_back(seq);
  for (Node *p = n; p; p = p->parent) ++p->below;
  sequences_[seq] = {n, std::vector<int32_t>(tokens.begin(), tokens.end())};
  return true;
}

std::vector<PrefixTree::SnapshotId> PrefixTree::remove_sequence(SeqId seq) {
  std::vector<SnapshotId> orphans;
  auto it = sequences_.find(seq);
  if (it == sequences_.end()) return orphans;
  Node *n = it->second.first;
  sequences_.erase(it);
  std::erase(n->ending, seq);
  for (Node *p = n; p; p = p->parent) --p->below;
  // Upward from n: nodes no sequence passes through go (with their snapshots); a node left with
  // one child and nothing of its own merges with that child.
  while (n != root_.get()) {
    Node *parent = n->parent;
    if (n->below == 0) {
      if (n->snapshot) {
        orphans.push_back(*n->snapshot);
        snapshots_.erase(*n->snapshot);
      }
      // Every node under n has below == 0 as well, and was emptied the same way before (a node's
      // children keep sequences or it would have gone): n has no children left.
      parent->children.erase(n->edge.front());
    } else if (n->ending.empty() && !n->snapshot && n->children.size() == 1) {
      merge_with_child(n);
    } else {
      break;
    }
    n = parent;
  }
  return orphans;
}

std::vector<PrefixTree::SeqId> PrefixTree::prefixes_of(std::span<const int32_t> tokens) const {
  std::vector<SeqId> out;
  const Node *n = root_.get();
  size_t i = 0;
  while (i < tokens.size()) {
    auto it = n->children.find(tokens[i]);
    if (it == n->children.end()) break;
    const Node *c = it->second.get();
    if (c->edge.size() > tokens.size() - i ||
        !std::equal(c->edge.begin(), c->edge.end(), tokens.begin() + long(i)))
      break;
    i += c->edge.size();
    if (i < tokens.size()) out.insert(out.end(), c->ending.begin(), c->ending.end());
    n = c;
  }
  return out;
}

bool PrefixTree::insert_snapshot(std::span<const int32_t> prefix, SnapshotId id, int32_t reach,
                                 std::optional<SnapshotId> *replaced) {
  if (prefix.empty() || snapshots_.count(id)) return false;
  Node *n = descend(prefix, false);
  if (!n) return false;
  if (replaced) *replaced = n->snapshot;
  if (n->snapshot) snapshots_.erase(*n->snapshot);
  n->snapshot = id;
  n->reach = std::clamp(reach, 0, n->depth);
  max_reach_ = std::max(max_reach_, n->reach);
  snapshots_[id] = n;
  return true;
}

const PrefixTree::Node *PrefixTree::find(std::span<const int32_t> tokens) const {
  const Node *n = root_.get();
  size_t i = 0;
  while (i < tokens.size()) {
    auto it = n->children.find(tokens[i]);
    if (it == n->children.end()) return nullptr;
    const Node *c = it->second.get();
    if (tokens.size() - i < c->edge.size() ||
        !std::equal(c->edge.begin(), c->edge.end(), tokens.begin() + long(i)))
      return nullptr; // ends inside the edge, or leaves it
    i += c->edge.size();
    n = c;
  }
  return n;
}

std::optional<std::pair<PrefixTree::SnapshotId, int32_t>>
PrefixTree::snapshot_at(std::span<const int32_t> prefix) const {
  const Node *n = find(prefix);
  if (!n || !n->snapshot) return std::nullopt;
  return std::make_pair(*n->snapshot, n->reach);
}

bool PrefixTree::remove_snapshot(SnapshotId id) {
  auto it = snapshots_.find(id);
  if (it == snapshots_.end()) return false;
  Node *n = it->second;
  snapshots_.erase(it);
  n->snapshot.reset();
  n->reach = 0;
  // A node kept only for the snapshot merges with its one child.
  if (n != root_.get() && n->ending.empty() && n->children.size() == 1) merge_with_child(n);
  return true;
}

const std::vector<int32_t> *PrefixTree::tokens_of(SeqId seq) const {
  auto it = sequences_.find(seq);
  return it == sequences_.end() ? nullptr : &it->second.second;
}

int32_t PrefixTree::snapshot_depth(SnapshotId id) const {
  auto it = snapshots_.find(id);
  return it == snapshots_.end() ? -1 : it->second->depth;
}

size_t PrefixTree::n_nodes() const {
  size_t n = 0;
  std::vector<const Node *> stack = {root_.get()};
  while (!stack.empty()) {
    const Node *x = stack.back();
    stack.pop_back();
    ++n;
    for (const auto &[t, c] : x->children) stack.push_back(c.get());
  }
  return n - 1; // the root holds nothing
}

std::string PrefixTree::check_node(const Node *node, int32_t depth, size_t &sequences,
                                   size_t &snapshots) const {
  const std::string at = "node at depth " + std::to_string(node->depth) + ": ";
  if (node->depth != depth) return at + "depth is not the parent's plus the edge";
  if (node != root_.get() && node->edge.empty()) return at + "empty edge";
  int32_t below = int32_t(node->ending.size());
  for (SeqId s : node->ending) {
    auto it = sequences_.find(s);
    if (it == sequences_.end() || it->second.first != node) return at + "stale sequence entry";
    if (int32_t(it->second.second.size()) != node->depth) return at + "sequence length differs";
  }
  sequences += node->ending.size();
  if (node->snapshot) {
    auto it = snapshots_.find(*node->snapshot);
    if (it == snapshots_.end() || it->second != node) return at + "stale snapshot entry";
    ++snapshots;
  }
  for (const auto &[t, c] : node->children) {
    if (c->parent != node) return at + "child's parent pointer is wrong";
    if (c->edge.empty() || c->edge.front() != t) return at + "child keyed by the wrong token";
    if (std::string e = check_node(c.get(), depth + int32_t(c->edge.size()), sequences, snapshots);
        !e.empty())
      return e;
    below += c->below;
  }
  if (below != node->below) return at + "sequence count below is wrong";
  if (node != root_.get()) {
    if (node->below == 0) return at + "no sequence passes through";
    if (node->ending.empty() && !node->snapshot && node->children.size() == 1)
      return at + "should have been merged with its one child";
  }
  return "";
}

std::string PrefixTree::check() const {
  size_t sequences = 0, snapshots = 0;
  if (std::string e = check_node(root_.get(), 0, sequences, snapshots); !e.empty()) return e;
  if (sequences != sequences_.size()) return "sequence index holds entries not in the tree";
  if (snapshots != snapshots_.size()) return "snapshot index holds entries not in the tree";
  // Each sequence's tokens spell its path.
  for (const auto &[s, entry] : sequences_) {
    std::vector<int32_t> path;
    std::vector<const Node *> chain;
    for (const Node *n = entry.first; n != root_.get(); n = n->parent) chain.push_back(n);
    for (auto it = chain.rbegin(); it != chain.rend(); ++it)
      path.insert(path.end(), (*it)->edge.begin(), (*it)->edge.end());
    if (path != entry.second)
      return "sequence " + std::to_string(s) + "'s path spells other tokens";
  }
  return "";
}

} // namespace offgraph::engine
