// Stop conditions: stop token ids, checked by the caller on each sampled id, and stop strings,
// matched incrementally on the generated text so that no byte of a stop string is ever emitted.
//
// Stop strings use one Aho-Corasick automaton over bytes, built once per StopSet: each generated
// byte costs amortised O(1) however many stop strings there are (thousands are fine). The
// automaton state also tells how long the longest suffix of the text is that could still grow
// into a stop string; exactly those bytes are held back, everything before them is emitted.
// Held bytes are released when more text rules the match out, or by StopMatcher::finish().
//
// Match rule: generation stops at the first byte where any stop string ends; if several end
// there, the longest wins (it starts earliest). Text before its first byte is emitted, the stop
// string and anything after it are not.
#pragma once

#include "base/status.h"

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace offgraph::sample {

// Builds a stop-token list from a model's end-of-turn ids (sorted, duplicates removed). `eom_id`
// is the id of an end-of-*message* token such as Muse Glimmer's `<|eom|>` (200007), or nullopt:
// it must never be a stop token, because it closes a message inside a turn (reasoning blocks,
// parallel tool calls) and the turn goes on after it (MUSE_GLIMMER.md sections 10-11). Passing
// it among the end-of-turn ids is an error rather than silently dropped, since it signals a
// misread tokenizer config.
Result<std::vector<int32_t>> end_of_turn_stop_ids(std::span<const int32_t> end_of_turn_ids,
                                                  std::optional<int32_t> eom_id);

class StopSet {
public:
  // Stop strings must be non-empty; duplicates are allowed (the first index is reported).
  static Result<StopSet> create(std::vector<int32_t> stop_tokens,
                                std::vector<std::string> stop_strings);

  bool is_stop_token(int32_t id) const;
  const std::vector<int32_t> &stop_tokens() const { return tokens_; }
  const std::vector<std::string> &stop_strings() const { return strings_; }

private:
  friend class StopMatcher;
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> next; // sorted by byte
    int32_t fail = 0;
    int32_t depth = 0;
    int32_t match = -1; // longest stop string ending here (self or via fail links), or -1
  };
  StopSet() = default;
  int32_t child(int32_t node, unsigned char byte) const;
  int32_t step(int32_t node, unsigned char byte) const; // automaton transition

  std::vector<int32_t> tokens_; // sorted
  std::vector<std::string> strings_;
  std::vector<Node> nodes_; // nodes_[0] is the root
};

struct StopUpdate {
  std::string emit;                  // text now safe to show, in stream order
  std::optional<size_t> stop_string; // index into StopSet::stop_strings() once matched
};

// Per-generation state over a StopSet, which must outlive it.
class StopMatcher {
public:
  explicit StopMatcher(const StopSet &set) : set_(&set) {}

  // Feeds the next piece of generated text. After a match, further text is ignored.
  StopUpdate push(std::string_view text);
  // Generation ended for another reason (stop token, length limit): the held-back text was not
  // the start of a stop string after all and is returned for emission.
  std::string finish();

  bool stopped() const { return stopped_; }
  // Bytes currently held back (a suffix that is a proper prefix of some stop string).
  const std::string &held() const { return held_; }

private:
  const StopSet *set_;
  int32_t state_ = 0;
  bool stopped_ = false;
  std::string held_;
};

} // namespace offgraph::sample
