#include "engine/speculation.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace offgraph::engine {

Result<DraftSource> parse_draft_source(std::string_view name) {
  if (name == "none") return DraftSource::None;
  if (name == "ngram") return DraftSource::Ngram;
  return Status::error("unknown draft source '" + std::string(name) +
                       "' (choose 'none' or 'ngram')");
}

const char *draft_source_name(DraftSource source) {
  switch (source) {
  case DraftSource::None:
    return "none";
  case DraftSource::Ngram:
    return "ngram";
  }
  return "?";
}

Status validate(const SpeculationOptions &o) {
  auto range = [](const char *what, int32_t v, int32_t lo, int32_t hi) {
    return Status::error(std::string(what) + " must be between " + std::to_string(lo) + " and " +
                         std::to_string(hi) + ", not " + std::to_string(v));
  };
  if (o.n_max < 1 || o.n_max > kMaxDraftTokens)
    return range("the draft's n_max", o.n_max, 1, kMaxDraftTokens);
  if (o.n_min < 0 || o.n_min > o.n_max) return range("the draft's n_min", o.n_min, 0, o.n_max);
  if (o.ngram.n_min < 1 || o.ngram.n_min > 64)
    return range("the n-gram drafter's shortest match", o.ngram.n_min, 1, 64);
  if (o.ngram.n_max < o.ngram.n_min || o.ngram.n_max > 256)
    return range("the n-gram drafter's longest match", o.ngram.n_max, o.ngram.n_min, 256);
  return ok_status();
}

void StepCost::observe(int32_t tokens, double seconds) {
  if (tokens < 1 || !(seconds > 0) || !std::isfinite(seconds)) return;
  const double t = double(tokens);
  n_ = n_ * kDecay + 1;
  x_ = x_ * kDecay + t;
  xx_ = xx_ * kDecay + t * t;
  y_ = y_ * kDecay + seconds;
  xy_ = xy_ * kDecay + t * seconds;
}

double StepCost::marginal(int32_t tokens) const {
  // Determined once the token counts vary: their weighted variance is at least a tenth of a token
  // squared (steps of one size alone say nothing of the slope).
  const double det = n_ * xx_ - x_ * x_;
  if (n_ < 4 || det < 0.1 * n_ * n_) return kPrior;
  const double per_token = (n_ * xy_ - x_ * y_) / det;
  const double fixed = (y_ - per_token * x_) / n_;
  const double step = fixed + per_token * double(std::max(tokens, 1));
  if (!(step > 0)) return 1.0;
  return std::clamp(per_token / step, 0.01, 1.0);
}

void Acceptance::observe(int32_t tested, int32_t kept) {
  if (tested <= 0) return;
  kept_ = kept_ * kDecay + kept;
  tested_ = tested_ * kDecay + tested;
}

int32_t best_draft_length(double rate, double marginal, int32_t k_max) {
  int32_t best = 0;
  double best_gain = 1.0, expected = 1.0, term = 1.0;
  for (int32_t k = 1; k <= k_max; ++k) {
    term *= rate;
    expected += term;
    const double gain = expected / (1.0 + marginal * k);
    if (gain > best_gain) best = k, best_gain = gain;
  }
  return best;
}

Speculator::Speculator(const SpeculationOptions &options, std::span<const int32_t> prediction,
                       std::span<const int32_t> history)
    : options_(options), ngram_(options.ngram) {
  ngram_.append(prediction);
  ngram_.append(history);
}

std::vector<int32_t> Speculator::draft(int32_t limit, double marginal) {
  int32_t k = std::min(limit, options_.n_max);
  if (options_.adaptive) {
    k = std::min(k, best_draft_length(acceptance_.rate(), marginal, k));
    if (k == 0 && ++since_draft_ >= kProbeEvery) k = std::min(limit, std::max(options_.n_min, 1));
  }
  if (k < std::max(options_.n_min, 1)) return {};
  std::vector<int32_t> tokens = ngram_.draft(size_t(k)).tokens;
  if (int32_t(tokens.size()) < std::max(options_.n_min, 1)) return {};
  since_draft_ = 0;
  return tokens;
}

void Speculator::observe(int32_t tested, int32_t kept) { acceptance_.observe(tested, kept); }

} // namespace offgraph::engine
