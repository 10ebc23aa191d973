// Forced output: at chosen points, the next tokens the model writes must be one of a set of token
// sequences; elsewhere it writes freely. This is the small grammar tool_choice needs ("required":
// the next recipient is one of the tools; a named tool: that tool), enforced by masking the
// logits of every token that would leave all sequences. Where the sequences diverge (at a tool's
// name) the model's own logits choose among them.
#pragma once

#include "base/status.h"

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace offgraph::sample {

// What each token id writes (control tokens as their text), to spot the trigger.
struct TokenTexts {
  std::vector<std::string> bytes;
};

struct ConstraintSpec {
  // Each alternative in the tokenizer's own (canonical) tokenization: forcing text byte by byte
  // would let a model spell it in odd pieces it never saw in training.
  std::vector<std::vector<int32_t>> alternatives;
  // The constraint applies at the start of the output and again each time the output ends with
  // this text; empty: only at the start.
  std::string trigger;
};

// The per-request state.
class Constraint {
public:
  static Result<Constraint> create(std::shared_ptr<const ConstraintSpec> spec,
                                   std::shared_ptr<const TokenTexts> texts);

  bool active() const { return !live_.empty(); }
  // Sets the logit of every token that no live alternative continues with to -infinity.
  Status mask(std::span<float> logits) const;
  // Records a sampled token.
  void accept(int32_t token);

private:
  struct Place {
    size_t alt, pos;
  };
  Constraint(std::shared_ptr<const ConstraintSpec> spec, std::shared_ptr<const TokenTexts> texts);
  void start();

  std::shared_ptr<const ConstraintSpec> spec_;
  std::shared_ptr<const TokenTexts> texts_;
  std::vector<Place> live_; // empty: inactive
  std::string tail_;        // the last output bytes, to spot the trigger
};

} // namespace offgraph::sample
