// PrefixTree: a radix tree over the token ids of every cached sequence, with the ring snapshots
// taken along them. It decides which cached state a new prompt can start from; the engine owns
// the sequences (kv::KvStore) and the snapshots, and names them here by id.
//
// Why a tree of sequences and snapshots, not only of pages: on a sliding-window model a prefix's
// flat pages alone cannot resume it; the rings must hold the window before the resume point. A
// cached sequence provides both (it shares its pages with a fork, and its rings serve a fork at
// any point its rewind floor allows); a snapshot provides the rings at one depth, the pages coming
// from any cached sequence below it (their first tokens are the snapshot's prefix, so their pages
// hold the same K/V).
//
// Invariants (tests/engine/prefix_tree_test.cpp checks them against a naive list of sequences):
// - a node's depth is its parent's plus its edge length; children differ in their first token;
// - every node is on the path of at least one sequence (no node survives its last sequence);
// - a snapshot sits at the end of a node, at the depth it was taken; a sequence ends at a node;
// - a node other than the root has a non-empty edge; a node with one child, no sequence ending
//   and no snapshot is merged with its child.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace offgraph::engine {

class PrefixTree {
public:
  using SeqId = int32_t;
  using SnapshotId = int64_t;

  struct Match {
    int32_t depth = 0;            // leading prompt tokens found on some sequence's path
    std::vector<SeqId> sequences; // the cached sequences whose first `depth` tokens match
    // The snapshot that resumes the prompt deepest, at restore_depth <= the limit: one on the
    // matched path, or one past the divergence whose reach goes back to it.
    std::optional<SnapshotId> snapshot;
    int32_t snapshot_depth = 0; // where it sits
    int32_t restore_depth = 0;  // where the prompt resumes: in [snapshot_depth - reach, it]
    // A cached sequence through the snapshot's node: its pages hold the snapshot's prefix, whose
    // first restore_depth tokens are the prompt's (using it also keeps the snapshot alive).
    SeqId snapshot_source = -1;
  };

  PrefixTree();
  ~PrefixTree();
  PrefixTree(const PrefixTree &) = delete;
  PrefixTree &operator=(const PrefixTree &) = delete;

  // What of `prompt` the tree holds; no snapshot is offered to resume past `snapshot_limit`.
  Match match(std::span<const int32_t> prompt, int32_t snapshot_limit) const;

  // A cached sequence holding exactly `tokens`. An id already present is refused (false).
  bool insert_sequence(std::span<const int32_t> tokens, SeqId seq);
  // Removes a sequence; returns the snapshots no remaining sequence passes through (the caller
  // frees them).
  std::vector<SnapshotId> remove_sequence(SeqId seq);
  // The sequences whose tokens are a proper prefix of `tokens` (a longer one makes them redundant).
  std::vector<SeqId> prefixes_of(std::span<const int32_t> tokens) const;
  // A snapshot taken at the end of `prefix`, which must lie on some sequence's path (else false,
  // and the caller keeps the snapshot); it resumes any of the `reach` depths before as well. A
  // snapshot already at that depth is replaced: the old id is returned through `replaced`.
  bool insert_snapshot(std::span<const int32_t> prefix, SnapshotId id, int32_t reach = 0,
                       std::optional<SnapshotId> *replaced = nullptr);
  // The snapshot at the end of `prefix` and its reach, if any.
  std::optional<std::pair<SnapshotId, int32_t>> snapshot_at(std::span<const int32_t> prefix) const;
  // Drops one snapshot (eviction); false when unknown.
  bool remove_snapshot(SnapshotId id);

  const std::vector<int32_t> *tokens_of(SeqId seq) const;
  size_t n_sequences() const { return sequences_.size(); }
  size_t n_snapshots() const { return snapshots_.size(); }
  size_t n_nodes() const;
  // Depth of a snapshot (-1: unknown).
  int32_t snapshot_depth(SnapshotId id) const;
  // Checks the invariants above; an empty string when they hold, else what broke.
  std::string check() const;

private:
  struct Node;
  // Walks `tokens` from the root, splitting an edge where the walk ends inside it so that a node
  // ends exactly at the walk's end; creates nodes for the unmatched rest when `create`. Returns
  // the node at depth tokens.size(), or null when it does not exist and !create.
  Node *descend(std::span<const int32_t> tokens, bool create);
  // The node at depth tokens.size() on some path, without splitting (null when none ends there).
  const Node *find(std::span<const int32_t> tokens) const;
  static void split(Node *node, size_t at);
  // Absorbs the only child of `n` (which has no sequence ending and no snapshot of its own).
  void merge_with_child(Node *n);
  void collect_sequences(const Node *node, std::vector<SeqId> &out) const;
  // Offers the snapshots under `node` (inclusive) whose reach goes back to `at` (the depth where
  // the prompt left their path).
  void offer_reaching(const Node *node, int32_t at, Match &m) const;
  std::string check_node(const Node *node, int32_t depth, size_t &sequences,
                         size_t &snapshots) const;

  std::unique_ptr<Node> root_;
  std::map<SeqId, std::pair<Node *, std::vector<int32_t>>> sequences_;
  std::map<SnapshotId, Node *> snapshots_;
  int32_t max_reach_ = 0; // the largest reach ever inserted: bounds offer_reaching's search
};

} // namespace offgraph::engine
