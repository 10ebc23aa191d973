#include "engine/speculation.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

namespace offgraph::engine {

Result<DraftSource> parse_draft_source(std::string_view name) {
  if (name == "none") return DraftSource::None;
  if (name == "ngram") return DraftSource::Ngram;
  if (name == "draft") return DraftSource::Draft;
  return Status::error("unknown draft source '" + std::string(name) +
                       "' (choose 'none', 'ngram' or 'draft')");
}

const char *draft_source_name(DraftSource source) {
  switch (source) {
  case DraftSource::None:
    return "none";
  case DraftSource::Ngram:
    return "ngram";
  case DraftSource::Draft:
    return "draft";
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
  if (tokens < 1 || tokens > kMaxTokens || !(seconds > 0) || !std::isfinite(seconds)) return;
  if (sum_.size() <= size_t(tokens)) sum_.resize(size_t(tokens) + 1), weight_.resize(sum_.size());
  sum_[size_t(tokens)] = sum_[size_t(tokens)] * kDecay + seconds;
  weight_[size_t(tokens)] = weight_[size_t(tokens)] * kDecay + 1;
}

std::optional<double> StepCost::estimate(int32_t tokens) const {
  for (int32_t t = std::min<int32_t>(tokens, int32_t(sum_.size()) - 1); t >= 1; --t) {
    if (weight_[size_t(t)] <= 0) continue;
    const double measured = sum_[size_t(t)] / weight_[size_t(t)];
    if (t == tokens) return measured;
    // The smallest measured size's time, as the prior scales it, stands for a one-token step.
    double one = measured;
    for (size_t s = 1; s < sum_.size(); ++s)
      if (weight_[s] > 0) {
        one = sum_[s] / weight_[s] / (1.0 + kPrior * double(s - 1));
        break;
      }
    return measured + kOptimism * one * (tokens - t);
  }
  return std::nullopt;
}

std::vector<double> StepCost::relative(int32_t base, int32_t k_max) const {
  base = std::max(base, 1);
  std::vector<double> r(size_t(std::max(k_max, 0)) + 1, 1.0);
  const std::optional<double> b = estimate(base);
  for (int32_t k = 1; k <= k_max; ++k)
    r[size_t(k)] = b ? *estimate(base + k) / *b : 1.0 + kPrior * k; // nothing measured: the prior
  return r;
}

void Acceptance::observe(int32_t tested, int32_t kept) {
  if (tested <= 0) return;
  kept_ = kept_ * decay_ + kept;
  tested_ = tested_ * decay_ + tested;
}

int32_t best_draft_length(double rate, std::span<const double> cost) {
  int32_t best = 0;
  double best_gain = 1.0 / cost[0], expected = 1.0, term = 1.0;
  for (size_t k = 1; k < cost.size(); ++k) {
    term *= rate;
    expected += term;
    const double gain = expected / cost[k];
    if (gain > best_gain) best = int32_t(k), best_gain = gain;
  }
  return best;
}

PredictionCursor::PredictionCursor(std::span<const int32_t> prediction, int32_t n_min,
                                   int32_t n_max)
    : n_min_(n_min), n_max_(n_max), found_match_(n_max) {
  if (prediction.empty()) return;
  auto index = std::make_shared<Index>();
  index->tokens.assign(prediction.begin(), prediction.end());
  for (size_t end = size_t(n_min); end <= prediction.size(); ++end)
    index->ends[ngram_key(prediction.subspan(end - size_t(n_min), size_t(n_min)))].push_back(
        int32_t(end));
  index_ = std::move(index);
}

void PredictionCursor::follow(int32_t token) {
  if (!index_ || next_ == -2) return;
  const std::vector<int32_t> &p = index_->tokens;
  if (next_ >= 0 && next_ < int64_t(p.size()) && p[size_t(next_)] == token)
    followed_ = ++next_, found_match_ = n_max_; // a place found again is confirmed
  else
    // Past an end reached by following (or by a match of n_max): not followed again. A shorter
    // match that found the end may have been chance, as any other place found again may be.
    next_ = next_ == int64_t(p.size()) && found_match_ == n_max_ ? -2 : -1;
}

void PredictionCursor::find_again(std::span<const int32_t> history) {
  next_ = -1, found_match_ = 0;
  if (history.size() < size_t(n_min_)) return;
  auto it = index_->ends.find(ngram_key(history.last(size_t(n_min_))));
  if (it == index_->ends.end()) return;
  // The places at or after the one last followed first, then the earlier ones, in order: the first
  // of the longest matches visited is the definition's.
  const std::vector<int32_t> &ends = it->second;
  const auto ahead = std::lower_bound(ends.begin(), ends.end(), int32_t(followed_));
  int32_t visited = 0;
  auto visit = [&](auto from, auto to) {
    for (auto e = from; e != to && visited < kMaxCandidates; ++e, ++visited)
      if (const int32_t length =
              matching_tail(std::span(index_->tokens).first(size_t(*e)), history, n_max_);
          length >= n_min_ && length > found_match_)
        next_ = *e, found_match_ = length;
  };
  visit(ahead, ends.end());
  visit(ends.begin(), ahead);
}

PredictionCursor::Draft PredictionCursor::draft(std::span<const int32_t> history, size_t k) {
  Draft d;
  if (!index_ || next_ == -2) return d;
  if (next_ == -1) find_again(history);
  if (next_ < 0) return d;
  const std::vector<int32_t> &p = index_->tokens;
  const size_t from = size_t(next_), to = std::min(p.size(), from + k);
  d.tokens.assign(p.begin() + long(from), p.begin() + long(to));
  d.match = found_match_;
  return d;
}

Speculator::Speculator(const SpeculationOptions &options, std::span<const int32_t> prediction,
                       std::span<const int32_t> history, double prior)
    : options_(options), ngram_(options.ngram),
      prediction_(prediction, ngram_.options().n_min, ngram_.options().n_max), acceptance_(prior) {
  ngram_.append(prediction);
  ngram_.append(history);
}

int32_t Speculator::length(int32_t limit, std::span<const double> cost) {
  int32_t k = std::min(limit, options_.n_max);
  if (options_.adaptive) {
    k = std::min(
        k, best_draft_length(acceptance_.rate(), cost.first(std::min(cost.size(), size_t(k) + 1))));
    if (k == 0 && ++since_draft_ >= kProbeEvery) k = std::min(limit, std::max(options_.n_min, 1));
  }
  return k < std::max(options_.n_min, 1) ? 0 : k;
}

std::vector<int32_t> Speculator::draft(int32_t limit, std::span<const double> cost) {
  const int32_t k = length(limit, cost);
  if (k == 0) return {};
  // The prediction's draft unless it was lost and the n-gram search matches a longer suffix (an
  // answer gone its own way, echoing the prompt rather than the prediction).
  const int32_t least = std::max(options_.n_min, 1);
  PredictionCursor::Draft from_prediction = prediction_.draft(ngram_.tokens(), size_t(k));
  std::vector<int32_t> tokens = std::move(from_prediction.tokens);
  if (int32_t(tokens.size()) < least || from_prediction.match < ngram_.options().n_max) {
    NgramDrafter::Draft d = ngram_.draft(size_t(k));
    if (int32_t(tokens.size()) < least ||
        (d.match > from_prediction.match && int32_t(d.tokens.size()) >= least))
      tokens = std::move(d.tokens);
  }
  if (int32_t(tokens.size()) < least) return {};
  drafted();
  return tokens;
}

void Speculator::observe(int32_t tested, int32_t kept) { acceptance_.observe(tested, kept); }

} // namespace offgraph::engine
