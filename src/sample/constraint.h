// Forced output: at chosen points, what the model writes next must spell one of a set of
// alternatives exactly; elsewhere it writes freely. This is the small grammar tool_choice needs
// ("required": the next recipient is one of the tools; a named tool: that tool), enforced by
// masking the logits of every token that would leave all alternatives.
#pragma once

#include "base/status.h"

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace offgraph::sample {

// What each token id writes: its bytes, and whether it is a control token (matched only by a
// control segment, never spelled out by text).
struct TokenTexts {
  std::vector<std::string> bytes;
  std::vector<bool> control;
};

// One piece of an alternative: text, or exactly one control token.
struct Segment {
  std::string text;
  int32_t control = -1;
  static Segment of_text(std::string t) { return {std::move(t), -1}; }
  static Segment of_control(int32_t id) { return {"", id}; }
};
using Alternative = std::vector<Segment>;

struct ConstraintSpec {
  std::vector<Alternative> alternatives;
  // The constraint applies at the start of the output and again each time the output ends with
  // this text (control tokens count as their text); empty: only at the start.
  std::string trigger;
};

// The per-request state: masks logits while an alternative is being spelled, watches for the
// trigger otherwise.
class Constraint {
public:
  static Result<Constraint> create(std::shared_ptr<const ConstraintSpec> spec,
                                   std::shared_ptr<const TokenTexts> texts);

  bool active() const { return !live_.empty(); }
  // Sets the logit of every token that no alternative allows to -infinity. An error when no
  // token at all is allowed (the vocabulary cannot spell the alternatives).
  Status mask(std::span<float> logits) const;
  // Records a sampled token.
  void accept(int32_t token);

private:
  // A place inside one alternative: segment index and byte offset into a text segment.
  struct Place {
    size_t alt, seg, off;
  };
  Constraint(std::shared_ptr<const ConstraintSpec> spec, std::shared_ptr<const TokenTexts> texts);
  void start();
  // Where `token` leads from `p`: false if nowhere.
  bool step(const Place &p, int32_t token, Place &out) const;
  bool at_end(const Place &p) const;

  std::shared_ptr<const ConstraintSpec> spec_;
  std::shared_ptr<const TokenTexts> texts_;
  std::vector<Place> live_; // empty: inactive
  std::string tail_;        // the last output bytes, to spot the trigger
};

} // namespace offgraph::sample
