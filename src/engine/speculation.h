// Speculative decoding's per-sequence side (docs/speculative.md): where drafts come from, how
// many drafted tokens a step verifies, and what earlier verifications taught. The engine verifies
// a draft of k tokens as one span of k + 1 ([last token, d_1..d_k]) through update_and_attend,
// samples each of the k + 1 rows in turn with the request's own sampler and keeps drafted tokens
// while they equal what it drew (sample-and-match), then rewinds the rest. Every token is thus the
// one plain decoding draws with the same seed: greedy output is identical, and so is sampled
// output where the logits of a span equal those of single steps. (A draft model's sampled drafts
// may instead be verified by speculative sampling, SpeculationOptions::pq.)
#pragma once

#include "base/status.h"
#include "engine/ngram_drafter.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace offgraph::engine {

enum class DraftSource {
  None,  // plain decoding
  Ngram, // prompt lookup over the sequence's own history (NgramDrafter)
  Draft, // a draft model (EngineOptions::draft_model): its greedy continuation
};
// "none", "ngram" or "draft"; an error naming the choices otherwise.
Result<DraftSource> parse_draft_source(std::string_view name);
const char *draft_source_name(DraftSource source);

// The most drafted tokens one step may verify, whatever the options.
inline constexpr int32_t kMaxDraftTokens = 64;

struct SpeculationOptions {
  DraftSource source = DraftSource::None;
  // The most drafted tokens one step verifies. The engine clips it to what a rejection can be
  // rewound from (cache::Sequence::max_draft_tokens: the ring lead, at most max_write - 1, a
  // verify span being at most max_write), to the tokens the request may still write, and to the
  // step's budget.
  int32_t n_max = 8;
  // A draft shorter than this is not verified (the step decodes one token); a probe (below)
  // drafts this many.
  int32_t n_min = 1;
  // The draft length follows the acceptance rate this sequence has seen and the measured cost of
  // a longer step (StepCost), so that drafts that keep being rejected stop costing time. Off: every
  // step verifies as many drafted tokens as the drafter gives, up to n_max.
  bool adaptive = true;
  // Sampled requests with a draft model: false (the default) verifies the draft by sampling each
  // row and matching, as for n-gram drafts: the same seed gives the same text as plain decoding.
  // True: speculative sampling (keep d with probability min(1, p/q), else draw from the residual),
  // which keeps more drafts but whose text for a seed depends on the draft lengths chosen (the
  // acceptance tests draw from the request's stream); the distribution is the target's either way.
  bool pq = false;
  NgramDrafterOptions ngram;
};
// The message names the field and the allowed range.
Status validate(const SpeculationOptions &options);

// The seconds of a decode step by its token count T, measured: a decayed mean per T over the
// recent decode-only steps of that size. Costs are not linear in T: on 2 CPU cores a step of 2
// tokens of a 1B model costs 2.2 steps of 1, one of 8 about 4.5 (docs/speculative-bench.md), so
// a line through the points would mislead. A size not measured yet is estimated optimistically,
// from the largest measured size below it plus kOptimism of a one-token step per token more, so
// that it gets tried and measured (a pessimistic guess would never be tried, and never
// corrected); kPrior per token before anything is measured.
class StepCost {
public:
  static constexpr double kDecay = 0.95; // per observation of the same size
  static constexpr double kPrior = 0.25;
  static constexpr double kOptimism = 0.05;
  static constexpr int32_t kMaxTokens = 256; // sizes above are not tracked (estimated)
  void observe(int32_t tokens, double seconds);
  // The time of a step of `base` + k tokens over that of `base` tokens, for k = 0..k_max.
  std::vector<double> relative(int32_t base, int32_t k_max) const;
  // Seconds of a step of `tokens`; none before a size up to it was measured.
  std::optional<double> seconds(int32_t tokens) const { return estimate(tokens); }

private:
  // Seconds; none when no size up to `tokens` was measured.
  std::optional<double> estimate(int32_t tokens) const;
  std::vector<double> sum_, weight_; // by token count: decayed sums of seconds and of 1
};

// Of the drafted tokens verifications tested (compared with the token drawn: the kept ones and
// the first rejected one of each draft), the share kept: a per-token acceptance rate. It starts
// from a prior worth two tested tokens, and each observation decays what came before by `decay`,
// so that it follows a change of text (an echoed passage ending).
class Acceptance {
public:
  explicit Acceptance(double prior = 0.5, double decay = 0.9) : prior_(prior), decay_(decay) {}
  void observe(int32_t tested, int32_t kept);
  double rate() const { return (kept_ + 2 * prior_) / (tested_ + 2); }

private:
  double prior_, decay_;
  double kept_ = 0, tested_ = 0;
};

// The draft length k that yields the most tokens per unit of step time, when each drafted token is
// kept with probability `rate` (given the ones before it were) and a step with k drafted tokens
// costs cost[k] (cost[0] = 1: the step without): argmax_k (1 + rate + ... + rate^k) / cost[k],
// for k < cost.size().
int32_t best_draft_length(double rate, std::span<const double> cost);

// Where a sequence's output stands in its prediction (OpenAI's Predicted Outputs: the text the
// caller expects, e.g. a file it asks to have rewritten with a few changes). While the tokens kept
// are the prediction's, in order, the next drafted tokens are the prediction's next ones. After a
// token that differs, the prediction is found again where the history's last tokens occur in it:
// the longest match (n_min to n_max tokens), of equal ones the first at or after the place last
// followed, else the first; among at most kMaxCandidates places that end in the history's last
// n_min tokens (an index built once), so that a step costs the same whatever the prediction's
// length; the search runs at the next draft(), on the history as it is then. A match that ends
// where the prediction does means it is used up: nothing to draft. Once the answer has gone past
// an end it reached by following (or found by a match of n_max), the prediction is not followed
// again (its text stays in the n-gram drafter's history). Without a cursor, a prediction is one
// more stretch of history to the n-gram search, which takes a suffix's most recent occurrence: the
// prompt's, where the prediction repeats a prompt's words, so drafts would leave an exact
// prediction for the prompt.
class PredictionCursor {
public:
  static constexpr int32_t kMaxCandidates = 64;
  PredictionCursor(std::span<const int32_t> prediction, int32_t n_min, int32_t n_max);
  // A token the sequence kept.
  void follow(int32_t token);
  // Up to `k` tokens of the prediction to verify after `history`'s end, and the length of the match
  // that found the place (n_max at the start and once a token followed confirms it). Empty when
  // lost and not found again, used up or gone past. `history` ends with the tokens passed to
  // follow(), in order (Speculator::append feeds both).
  struct Draft {
    std::vector<int32_t> tokens;
    int32_t match = 0;
  };
  Draft draft(std::span<const int32_t> history, size_t k);
  // The prediction's index of the token expected next; -1 while lost, -2 once gone past its end.
  int64_t next() const { return next_; }

private:
  struct Index {
    std::vector<int32_t> tokens;
    // The ends e (ascending) of the places prediction[e - n_min, e) with that n-gram's key.
    std::unordered_map<uint64_t, std::vector<int32_t>> ends;
  };
  void find_again(std::span<const int32_t> history);

  std::shared_ptr<const Index> index_; // shared by the choices of a request (n > 1)
  int32_t n_min_, n_max_;
  int64_t next_ = 0;     // the answer starts where the prediction does
  int64_t followed_ = 0; // the prediction's index just after the last token followed
  int32_t found_match_;  // the match that found the place: n_max at first and once confirmed
};

// One sequence's drafter and what its verifications taught. Its history must follow the
// sequence's tokens (append every token the sequence keeps).
class Speculator {
public:
  // Every this many steps without a draft a sequence drafts one token anyway, so that a rate
  // estimated low can recover.
  static constexpr int32_t kProbeEvery = 16;

  // `prediction`: tokens to draft from besides the history (they come first in the drafter's
  // history, never in the sequence's). `prior`: the acceptance rate to start from (the engine's
  // recent rate over every sequence, so that a new request does not relearn it).
  Speculator(const SpeculationOptions &options, std::span<const int32_t> prediction,
             std::span<const int32_t> history, double prior = 0.5);
  const SpeculationOptions &options() const { return options_; }
  void append(int32_t token) {
    ngram_.append(token);
    prediction_.follow(token);
  }
  // How many tokens to draft now: at most `limit`, the adaptive length for a step that costs
  // cost[k] with k drafted tokens (StepCost::relative), or a probe; 0 when fewer than n_min.
  // Call drafted() when a draft of that length is made.
  int32_t length(int32_t limit, std::span<const double> cost);
  void drafted() { since_draft_ = 0; }
  // The tokens to verify after the history's last token: at most length(), empty when shorter than
  // n_min; the prediction's where it is followed (PredictionCursor), else the n-gram drafter's.
  std::vector<int32_t> draft(int32_t limit, std::span<const double> cost);
  // The outcome of a verification: `tested` drafted tokens compared with the token drawn, `kept`
  // of them equal.
  void observe(int32_t tested, int32_t kept);
  const Acceptance &acceptance() const { return acceptance_; }

private:
  SpeculationOptions options_;
  NgramDrafter ngram_;
  PredictionCursor prediction_;
  Acceptance acceptance_;
  int32_t since_draft_ = 0;
};

} // namespace offgraph::engine
