// Speculative decoding's per-sequence side (docs/speculative.md): where drafts come from, how
// many drafted tokens a step verifies, and what earlier verifications taught. The engine verifies
// a draft of k tokens as one span of k + 1 ([last token, d_1..d_k]) through update_and_attend,
// samples each of the k + 1 rows in turn with the request's own sampler and keeps drafted tokens
// while they equal what it drew (sample-and-match), then rewinds the rest. Every token is thus the
// one plain decoding draws with the same seed: greedy output is identical, and so is sampled
// output where the logits of a span equal those of single steps.
#pragma once

#include "base/status.h"
#include "engine/ngram_drafter.h"

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace offgraph::engine {

enum class DraftSource {
  None,  // plain decoding
  Ngram, // prompt lookup over the sequence's own history (NgramDrafter)
};
// "none" or "ngram"; an error naming the choices otherwise.
Result<DraftSource> parse_draft_source(std::string_view name);
const char *draft_source_name(DraftSource source);

// The most drafted tokens one step may verify, whatever the options.
inline constexpr int32_t kMaxDraftTokens = 64;

struct SpeculationOptions {
  DraftSource source = DraftSource::None;
  // The most drafted tokens one step verifies. The engine clips it to what a rejection can be
  // rewound from (cache::Sequence::max_draft_tokens: max_write - 1, a verify span being at most
  // max_write), to the tokens the request may still write, and to the step's budget.
  int32_t n_max = 8;
  // A draft shorter than this is not verified (the step decodes one token); a probe (below)
  // drafts this many.
  int32_t n_min = 1;
  // The draft length follows the acceptance rate this sequence has seen and the measured cost of
  // a longer step (StepCost), so that drafts that keep being rejected stop costing time. Off: every
  // step verifies as many drafted tokens as the drafter gives, up to n_max.
  bool adaptive = true;
  NgramDrafterOptions ngram;
};
// The message names the field and the allowed range.
Status validate(const SpeculationOptions &options);

// The seconds of a decode step as a function of its token count, t = fixed + per_token * tokens,
// fitted by least squares over recent decode-only steps (older ones weigh less: each step decays
// the sums by kDecay). Until the fit is determined it assumes a drafted token costs kPrior of a
// one-token step.
class StepCost {
public:
  static constexpr double kDecay = 0.98;
  static constexpr double kPrior = 0.25;
  void observe(int32_t tokens, double seconds);
  // What one more token adds to a step of `tokens`, relative to that step's time, in (0, 1].
  double marginal(int32_t tokens) const;

private:
  double n_ = 0, x_ = 0, xx_ = 0, y_ = 0, xy_ = 0; // decayed sums of 1, T, T², t, T·t
};

// Of the drafted tokens a sequence's verifications tested (compared with the token drawn: the kept
// ones and the first rejected one of each draft), the share kept: a per-token acceptance rate,
// with a prior of one kept and one rejected, decayed so that it follows a change of text (an
// echoed passage ending).
class Acceptance {
public:
  static constexpr double kDecay = 0.9;
  void observe(int32_t tested, int32_t kept);
  double rate() const { return (kept_ + 1) / (tested_ + 2); }

private:
  double kept_ = 0, tested_ = 0;
};

// The draft length in [0, k_max] that yields the most tokens per unit of step time, when each
// drafted token is kept with probability `rate` (given the ones before it were) and costs
// `marginal` of a one-token step: argmax_k (1 + rate + ... + rate^k) / (1 + marginal * k).
int32_t best_draft_length(double rate, double marginal, int32_t k_max);

// One sequence's drafter and what its verifications taught. Its history must follow the
// sequence's tokens (append every token the sequence keeps).
class Speculator {
public:
  // Every this many steps without a draft a sequence drafts one token anyway, so that a rate
  // estimated low can recover.
  static constexpr int32_t kProbeEvery = 16;

  // `prediction`: tokens to draft from besides the history (they come first in the drafter's
  // history, never in the sequence's).
  Speculator(const SpeculationOptions &options, std::span<const int32_t> prediction,
             std::span<const int32_t> history);
  const SpeculationOptions &options() const { return options_; }
  void append(int32_t token) { ngram_.append(token); }
  // The tokens to verify after the history's last token: at most `limit`, the adaptive length
  // for a step whose extra tokens cost `marginal` each, empty when shorter than n_min.
  std::vector<int32_t> draft(int32_t limit, double marginal);
  // The outcome of a verification: `tested` drafted tokens compared with the token drawn, `kept`
  // of them equal.
  void observe(int32_t tested, int32_t kept);
  const Acceptance &acceptance() const { return acceptance_; }

private:
  SpeculationOptions options_;
  NgramDrafter ngram_;
  Acceptance acceptance_;
  int32_t since_draft_ = 0;
};

} // namespace offgraph::engine
