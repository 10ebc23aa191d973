#include "sample/stop.h"

#include <algorithm>
#include <deque>

namespace offgraph::sample {

Result<std::vector<int32_t>> end_of_turn_stop_ids(std::span<const int32_t> end_of_turn_ids,
                                                  std::optional<int32_t> eom_id) {
  std::vector<int32_t> ids(end_of_turn_ids.begin(), end_of_turn_ids.end());
  for (int32_t id : ids) {
    if (id < 0) return Status::error("stop tokens: negative token id " + std::to_string(id));
    if (eom_id && id == *eom_id) {
      return Status::error("stop tokens: id " + std::to_string(id) +
                           " is the end-of-message token (<|eom|>), which must never stop "
                           "generation: the turn continues after it");
    }
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

Result<StopSet> StopSet::create(std::vector<int32_t> stop_tokens,
                                std::vector<std::string> stop_strings) {
  for (size_t i = 0; i < stop_strings.size(); ++i) {
    // An empty stop string would match before any text, ending every generation at once.
    if (stop_strings[i].empty()) {
      return Status::error("stop strings: string " + std::to_string(i) + " is empty");
    }
  }
  StopSet set;
  set.tokens_ = std::move(stop_tokens);
  std::sort(set.tokens_.begin(), set.tokens_.end());
  set.tokens_.erase(std::unique(set.tokens_.begin(), set.tokens_.end()), set.tokens_.end());
  set.strings_ = std::move(stop_strings);

  // Trie. Children are inserted unsorted, then sorted once for binary search.
  set.nodes_.emplace_back();
  for (size_t s = 0; s < set.strings_.size(); ++s) {
    int32_t node = 0;
    for (char ch : set.strings_[s]) {
      const auto byte = static_cast<unsigned char>(ch);
      int32_t next = -1;
      for (const auto &[b, c] : set.nodes_[static_cast<size_t>(node)].next) {
        if (b == byte) next = c;
      }
      if (next < 0) {
        next = static_cast<int32_t>(set.nodes_.size());
        const int32_t depth = set.nodes_[static_cast<size_t>(node)].depth + 1;
        set.nodes_[static_cast<size_t>(node)].next.emplace_back(byte, next);
        set.nodes_.emplace_back();
        set.nodes_.back().depth = depth;
      }
      node = next;
    }
    auto &end = set.nodes_[static_cast<size_t>(node)];
    if (end.match < 0) end.match = static_cast<int32_t>(s);
  }
  for (auto &n : set.nodes_) std::sort(n.next.begin(), n.next.end());

  // Failure links in breadth-first order: a node's fail target is shallower, so already final.
  // The match of a node without its own string is its fail target's, which is the longest
  // stop string ending there (shorter suffixes come later on the fail chain).
  std::deque<int32_t> queue;
  for (const auto &[b, c] : set.nodes_[0].next) {
    (void)b;
    set.nodes_[static_cast<size_t>(c)].fail = 0;
    queue.push_back(c);
  }
  while (!queue.empty()) {
    const int32_t node = queue.front();
    queue.pop_front();
    for (const auto &[b, c] : set.nodes_[static_cast<size_t>(node)].next) {
      auto &child_node = set.nodes_[static_cast<size_t>(c)];
      child_node.fail = set.step(set.nodes_[static_cast<size_t>(node)].fail, b);
      if (child_node.match < 0) {
        child_node.match = set.nodes_[static_cast<size_t>(child_node.fail)].match;
      }
      queue.push_back(c);
    }
  }
  return set;
}

bool StopSet::is_stop_token(int32_t id) const {
  return std::binary_search(tokens_.begin(), tokens_.end(), id);
}

int32_t StopSet::child(int32_t node, unsigned char byte) const {
  const auto &next = nodes_[static_cast<size_t>(node)].next;
  auto it = std::lower_bound(next.begin(), next.end(), byte,
                             [](const auto &edge, unsigned char b) { return edge.first < b; });
  return it != next.end() && it->first == byte ? it->second : -1;
}

int32_t StopSet::step(int32_t node, unsigned char byte) const {
  for (;;) {
    const int32_t c = child(node, byte);
    if (c >= 0) return c;
    if (node == 0) return 0;
    node = nodes_[static_cast<size_t>(node)].fail;
  }
}

StopUpdate StopMatcher::push(std::string_view text) {
  StopUpdate out;
  if (stopped_ || text.empty()) return out;
  std::string pending = std::move(held_);
  held_.clear();
  const size_t base = pending.size();
  pending.append(text);
  for (size_t i = 0; i < text.size(); ++i) {
    state_ = set_->step(state_, static_cast<unsigned char>(text[i]));
    const auto &node = set_->nodes_[static_cast<size_t>(state_)];
    if (node.match >= 0) {
      // The match ends at this byte; all of it was held back or is in this piece, never emitted.
      const size_t end = base + i + 1;
      const size_t len = set_->strings_[static_cast<size_t>(node.match)].size();
      out.emit = pending.substr(0, end - len);
      out.stop_string = static_cast<size_t>(node.match);
      stopped_ = true;
      return out;
    }
  }
  // The automaton depth is the longest suffix that is a proper prefix of some stop string.
  const size_t hold = static_cast<size_t>(set_->nodes_[static_cast<size_t>(state_)].depth);
  held_ = pending.substr(pending.size() - hold);
  pending.resize(pending.size() - hold);
  out.emit = std::move(pending);
  return out;
}

std::string StopMatcher::finish() {
  std::string rest = std::move(held_);
  held_.clear();
  state_ = 0;
  stopped_ = true;
  return rest;
}

} // namespace offgraph::sample
