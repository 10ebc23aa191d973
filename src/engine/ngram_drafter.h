// Drafts tokens for speculative decoding from a sequence's own history (prompt lookup): the
// tokens that followed the most recent earlier occurrence of the history's longest matching
// suffix. Agent and coding answers echo long stretches of their context, which this finds with
// no draft model.
//
// Occurrences are found as zlib finds matches: a hash chain over the positions where each
// n_min-gram ends (head of the chain per n-gram, link to the previous occurrence per position),
// walked most recent first, at most max_candidates links, each extended backwards to n_max.
// Appending a token costs O(n_min) (a hash and a map update); a draft O(max_candidates × n_max).
// Truncation undoes appends exactly (the links are a stack), so a rewound sequence drafts as if it
// had never gone further.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace offgraph::engine {

// The hash of an n-gram, the key of NgramDrafter's chains and PredictionCursor's index. Users
// compare the tokens of what a key finds: a collision never makes a wrong draft.
uint64_t ngram_key(std::span<const int32_t> ngram);
// How many trailing tokens of `a` and `b` are equal, at most `max`: the length of a match that
// ends where both end (NgramDrafter's and PredictionCursor's measure).
int32_t matching_tail(std::span<const int32_t> a, std::span<const int32_t> b, int32_t max);

struct NgramDrafterOptions {
  int32_t n_min = 2;           // shortest suffix that may match (>= 1)
  int32_t n_max = 8;           // longest match looked for (>= n_min)
  int32_t max_candidates = 64; // chain links tried per draft (>= 1)
};

class NgramDrafter {
public:
  using Options = NgramDrafterOptions;
  // Options outside those bounds are clamped into them.
  explicit NgramDrafter(Options options = {});

  void append(int32_t token);
  void append(std::span<const int32_t> tokens);
  // Keeps the first `length` tokens (no-op if there are fewer).
  void truncate(size_t length);
  size_t size() const { return tokens_.size(); }
  std::span<const int32_t> tokens() const { return tokens_; }
  const Options &options() const { return options_; } // clamped

  struct Draft {
    std::vector<int32_t> tokens; // at most max_tokens; empty when nothing matched
    int32_t match = 0;           // length of the suffix that matched
  };
  // The continuation of the longest suffix (n_min to n_max tokens) that also ends earlier in the
  // history; the most recent such occurrence among the chain's first max_candidates.
  Draft draft(size_t max_tokens) const;

private:
  uint64_t key_ending_at(size_t end) const; // the n_min-gram ending at `end` (inclusive)

  Options options_;
  std::vector<int32_t> tokens_;
  std::vector<int32_t> previous_; // per position: the previous end of the same n_min-gram, or -1
  std::unordered_map<uint64_t, int32_t> head_; // n_min-gram -> its most recent end position
};

} // namespace offgraph::engine
