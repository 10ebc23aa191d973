#include "sample/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <limits>
#include <optional>
#include <string>

namespace offgraph::sample {

namespace {

// "%g" keeps messages short and prints nan/inf readably.
std::string fmt(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

Status field_error(const char *field, const std::string &rule, double got) {
  return Status::error(std::string("sampling parameter ") + field + " " + rule + " (got " +
                       fmt(got) + ")");
}

// Best first: larger logit, then lower id. A strict total order, so every sort below produces
// the same sequence on every standard library.
// A lambda rather than a function so the standard algorithms inline it.
constexpr auto better = [](const Candidate &a, const Candidate &b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
};

constexpr float kInf = std::numeric_limits<float>::infinity();

// top_k straight from the logit vector, skipping banned (-inf) tokens: at 200k vocab this avoids
// materialising 200k candidates only to keep 64. Same result as building them all and calling
// top_k. A bounded heap of the best k with the worst on top; on model-like logits only a few
// hundred tokens ever displace the top, so the scan is about one comparison per token.
void select_top_k(std::span<const float> logits, size_t k, std::vector<Candidate> &out) {
  out.clear();
  size_t i = 0;
  for (; i < logits.size() && out.size() < k; ++i) {
    if (logits[i] != -kInf) out.push_back({static_cast<int32_t>(i), logits[i]});
  }
  std::make_heap(out.begin(), out.end(), better);
  // Ids only grow, so a later token never wins a tie with a held one: strict > suffices.
  for (; i < logits.size(); ++i) {
    if (logits[i] > out.front().logit) {
      std::pop_heap(out.begin(), out.end(), better);
      out.back() = {static_cast<int32_t>(i), logits[i]};
      std::push_heap(out.begin(), out.end(), better);
    }
  }
  std::sort(out.begin(), out.end(), better);
}

uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t splitmix64(uint64_t &state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

bool penalties_enabled(const SamplingParams &p) {
  return p.penalty_last_n != 0 && (p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f ||
                                   p.frequency_penalty != 0.0f);
}

// The penalties' window: the last `last_n` (all when negative) ids of `history` that are not image
// rows (ids at or past the vocabulary, engine::image_row_ids), which neither count nor take a
// place, so that an image of 4,096 rows does not push every token out of it. Negative ids take a
// place: they are errors, which sample_checked reports and apply_penalties skips.
std::span<const int32_t> penalty_window(std::span<const int32_t> history, int32_t last_n,
                                        size_t n_vocab) {
  const size_t want = last_n < 0 ? history.size() : static_cast<size_t>(last_n);
  size_t start = history.size(), taken = 0;
  while (start > 0 && taken < want) {
    --start;
    if (history[start] < 0 || static_cast<size_t>(history[start]) < n_vocab) ++taken;
  }
  return history.subspan(start);
}

} // namespace

Status validate(const SamplingParams &p, int32_t vocab_size) {
  if (vocab_size <= 0) {
    return Status::error("sampling: vocab_size must be positive (got " +
                         std::to_string(vocab_size) + ")");
  }
  if (!std::isfinite(p.temperature) || p.temperature < 0.0f) {
    return field_error("temperature", "must be finite and >= 0 (0 = greedy)", p.temperature);
  }
  if (p.top_k < 0) return field_error("top_k", "must be >= 0 (0 disables)", p.top_k);
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
    return field_error("top_p", "must be in (0, 1] (1 disables)", p.top_p);
  }
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) {
    return field_error("min_p", "must be in [0, 1] (0 disables)", p.min_p);
  }
  if (!std::isfinite(p.repetition_penalty) || p.repetition_penalty <= 0.0f) {
    return field_error("repetition_penalty", "must be finite and > 0 (1 disables)",
                       p.repetition_penalty);
  }
  if (!std::isfinite(p.presence_penalty)) {
    return field_error("presence_penalty", "must be finite", p.presence_penalty);
  }
  if (!std::isfinite(p.frequency_penalty)) {
    return field_error("frequency_penalty", "must be finite", p.frequency_penalty);
  }
  if (p.penalty_last_n < -1) {
    return field_error("penalty_last_n", "must be >= -1 (-1 = all history, 0 disables)",
                       p.penalty_last_n);
  }
  for (const auto &[id, bias] : p.logit_bias) {
    if (id < 0 || id >= vocab_size) {
      return Status::error("sampling parameter logit_bias: token id " + std::to_string(id) +
                           " is outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
    }
    // NaN would poison the softmax; +inf makes exp(inf - inf) = NaN. -inf is a ban.
    if (std::isnan(bias) || bias == std::numeric_limits<float>::infinity()) {
      return Status::error("sampling parameter logit_bias: bias for token " + std::to_string(id) +
                           " must be finite or -inf (got " + fmt(bias) + ")");
    }
  }
  return ok_status();
}

void Rng::reseed(uint64_t seed) {
  // splitmix64 spreads any seed (including 0) over the state; xoshiro must not start all-zero,
  // which splitmix64's outputs never are for four consecutive draws.
  uint64_t sm = seed;
  for (auto &word : s_) word = splitmix64(sm);
}

uint64_t Rng::next_u64() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

void apply_penalties(std::span<float> logits, std::span<const int32_t> history,
                     const SamplingParams &params) {
  if (!penalties_enabled(params)) return;
  // Sorting a copy of the window's tokens groups repeats without a vocab-sized count array.
  std::vector<int32_t> ids;
  for (int32_t id : penalty_window(history, params.penalty_last_n, logits.size()))
    if (id >= 0 && static_cast<size_t>(id) < logits.size()) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j < ids.size() && ids[j] == ids[i]) ++j;
    const float count = static_cast<float>(j - i);
    float &l = logits[static_cast<size_t>(ids[i])];
    // Dividing a negative logit would raise it; multiplying pushes it further down instead.
    if (l <= 0.0f) {
      l *= params.repetition_penalty;
    } else {
      l /= params.repetition_penalty;
    }
    l -= count * params.frequency_penalty + params.presence_penalty;
    i = j;
  }
}

void apply_logit_bias(std::span<float> logits, const std::map<int32_t, float> &bias) {
  for (const auto &[id, b] : bias) logits[static_cast<size_t>(id)] += b;
}

void top_k(std::vector<Candidate> &cands, int32_t k) {
  if (k <= 0 || static_cast<size_t>(k) >= cands.size()) return;
  const auto kk = static_cast<ptrdiff_t>(k);
  // Same bounded heap as select_top_k, over an arbitrary candidate order.
  std::make_heap(cands.begin(), cands.begin() + kk, better);
  for (auto it = cands.begin() + kk; it != cands.end(); ++it) {
    if (better(*it, cands.front())) {
      std::pop_heap(cands.begin(), cands.begin() + kk, better);
      cands[static_cast<size_t>(kk - 1)] = *it;
      std::push_heap(cands.begin(), cands.begin() + kk, better);
    }
  }
  cands.resize(static_cast<size_t>(k));
  std::sort(cands.begin(), cands.end(), better);
}

void top_p(std::vector<Candidate> &cands, float p) {
  if (p >= 1.0f || cands.size() <= 1) return;
  float max_logit = -kInf;
  for (const auto &c : cands) max_logit = std::max(max_logit, c.logit);
  struct Weighted {
    Candidate c;
    double w; // unnormalised probability
  };
  std::vector<Weighted> v(cands.size());
  double total = 0.0;
  for (size_t i = 0; i < cands.size(); ++i) {
    v[i] = {cands[i], std::exp(static_cast<double>(cands[i].logit) - max_logit)};
    total += v[i].w;
  }

  // Weighted quickselect for the boundary token: the first one, best first, at which the
  // cumulative mass reaches p. Expected O(n) even when a flat distribution puts 100k tokens in
  // the nucleus, where sorting them (llama.cpp's approach) costs milliseconds per token.
  double need = static_cast<double>(p) * total;
  size_t lo = 0, hi = v.size();
  std::optional<Candidate> boundary;
  while (lo < hi) {
    // Median of three by the total order: deterministic, and immune to sorted input.
    size_t a = lo, b = lo + (hi - lo) / 2, c = hi - 1;
    if (better(v[b].c, v[a].c)) std::swap(a, b);
    if (better(v[c].c, v[b].c)) std::swap(b, c);
    if (better(v[b].c, v[a].c)) std::swap(a, b);
    std::swap(v[b], v[hi - 1]);
    const Candidate pivot = v[hi - 1].c;
    size_t split = lo;
    double mass_better = 0.0;
    for (size_t j = lo; j + 1 < hi; ++j) {
      if (better(v[j].c, pivot)) {
        std::swap(v[split], v[j]);
        mass_better += v[split].w;
        ++split;
      }
    }
    std::swap(v[split], v[hi - 1]);
    if (mass_better >= need) {
      hi = split; // the boundary is strictly better than the pivot
    } else if (mass_better + v[split].w >= need) {
      boundary = pivot;
      break;
    } else {
      need -= mass_better + v[split].w;
      lo = split + 1;
    }
  }
  if (!boundary) return; // rounding left the mass just short of p: keep everything
  // A filter rather than the selection's order: survivors keep their incoming order, which is
  // well defined (ids ascending, or best first after top_k) on every standard library.
  std::erase_if(cands, [&](const Candidate &c) { return better(*boundary, c); });
}

void min_p(std::vector<Candidate> &cands, float p) {
  if (p <= 0.0f || cands.empty()) return;
  float max_logit = -kInf;
  for (const auto &c : cands) max_logit = std::max(max_logit, c.logit);
  // p_i >= p * p_max  <=>  logit_i >= max_logit + log(p); no softmax needed.
  const double threshold = static_cast<double>(max_logit) + std::log(static_cast<double>(p));
  std::erase_if(cands,
                [&](const Candidate &c) { return static_cast<double>(c.logit) < threshold; });
}

void softmax(std::span<const Candidate> cands, float temperature, std::vector<double> &probs) {
  probs.resize(cands.size());
  if (cands.empty()) return;
  float max_logit = -kInf;
  for (const auto &c : cands) max_logit = std::max(max_logit, c.logit);
  double total = 0.0;
  for (size_t i = 0; i < cands.size(); ++i) {
    probs[i] = std::exp((static_cast<double>(cands[i].logit) - max_logit) / temperature);
    total += probs[i];
  }
  for (double &v : probs) v /= total;
}

size_t draw(std::span<const double> probs, double u) {
  double total = 0.0;
  for (double v : probs) total += v;
  const double target = u * total;
  double cum = 0.0;
  size_t last_positive = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0.0) continue;
    last_positive = i;
    cum += probs[i];
    if (cum > target) return i;
  }
  return last_positive; // u * total rounded up to total
}

int32_t argmax(std::span<const float> logits) {
  if (logits.empty()) return 0;
  // Two passes (max, then its first index) instead of one index-tracking loop; the first match
  // gives the lowest id on ties.
  // Eight independent lanes: a single running max is one long dependency chain, which the
  // compiler may not reorder for floats. Max is exact, so the lanes give the same answer.
  float lane[8];
  std::fill(std::begin(lane), std::end(lane), logits[0]);
  size_t i = 0;
  for (; i + 8 <= logits.size(); i += 8) {
    for (size_t j = 0; j < 8; ++j) lane[j] = logits[i + j] > lane[j] ? logits[i + j] : lane[j];
  }
  float best = logits[0];
  for (float v : lane) best = v > best ? v : best;
  for (; i < logits.size(); ++i) best = logits[i] > best ? logits[i] : best;
  for (size_t k = 0; k < logits.size(); ++k) {
    if (logits[k] == best) return static_cast<int32_t>(k);
  }
  return 0; // unreachable unless best is NaN, which sample_checked rules out
}

Result<Sampler> Sampler::create(SamplingParams params, int32_t vocab_size) {
  if (Status s = validate(params, vocab_size); !s.ok()) return s;
  return Sampler(std::move(params), vocab_size);
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  Result<int32_t> r = sample_checked(logits, history);
  return r.ok() ? *r : kNoToken;
}

Result<int32_t> Sampler::sample_checked(std::span<const float> logits,
                                        std::span<const int32_t> history) {
  auto greedy = filter(logits, history);
  if (!greedy.ok()) return greedy.status();
  if (*greedy >= 0) return *greedy;
  return cands_[draw(probs_, rng_.next_double())].id;
}

Status Sampler::distribution(std::span<const float> logits, std::span<const int32_t> history,
                             std::vector<double> &probs) {
  auto greedy = filter(logits, history);
  if (!greedy.ok()) return greedy.status();
  probs.assign(size_t(vocab_size_), 0.0);
  if (*greedy >= 0) {
    probs[size_t(*greedy)] = 1.0;
    return ok_status();
  }
  double total = 0;
  for (double p : probs_) total += p;
  for (size_t i = 0; i < cands_.size(); ++i) probs[size_t(cands_[i].id)] = probs_[i] / total;
  return ok_status();
}

int32_t Sampler::draw_from(std::span<const double> probs) {
  const size_t i = draw(probs, rng_.next_double());
  return i < probs.size() && probs[i] > 0 ? int32_t(i) : kNoToken;
}

Result<int32_t> Sampler::filter(std::span<const float> logits, std::span<const int32_t> history) {
  if (logits.size() != static_cast<size_t>(vocab_size_)) {
    return Status::error("sampling: got " + std::to_string(logits.size()) +
                         " logits for a vocabulary of " + std::to_string(vocab_size_));
  }
  // Copy and check in one branch-free pass; find the culprit only if there is one.
  // !(x < inf) is true exactly for NaN and +inf.
  work_.resize(logits.size());
  bool bad = false;
  for (size_t i = 0; i < logits.size(); ++i) {
    work_[i] = logits[i];
    bad |= !(logits[i] < kInf);
  }
  if (bad) {
    for (size_t i = 0; i < logits.size(); ++i) {
      if (!(logits[i] < kInf)) {
        return Status::error("sampling: logit of token " + std::to_string(i) + " is " +
                             fmt(logits[i]) + " (the model produced a non-finite value)");
      }
    }
  }
  if (penalties_enabled(params_)) {
    for (int32_t id : penalty_window(history, params_.penalty_last_n, logits.size())) {
      if (id < 0) {
        return Status::error("sampling: history token id " + std::to_string(id) + " is negative");
      }
    }
  }

  apply_penalties(work_, history, params_);
  apply_logit_bias(work_, params_.logit_bias);

  if (params_.temperature == 0.0f) {
    const int32_t best = argmax(work_);
    if (work_[static_cast<size_t>(best)] == -kInf) {
      return Status::error("sampling: every token is banned (all logits are -inf)");
    }
    return best;
  }
  // Steps 3-6 leave the candidates in cands_ and their probabilities in probs_; -1 says so.

  // Banned tokens never enter the candidate list, so no later step can revive them.
  if (params_.top_k > 0 && params_.top_k < vocab_size_) {
    select_top_k(work_, static_cast<size_t>(params_.top_k), cands_);
  } else {
    cands_.resize(work_.size());
    size_t n = 0;
    for (size_t i = 0; i < work_.size(); ++i) {
      if (work_[i] != -kInf) cands_[n++] = {static_cast<int32_t>(i), work_[i]};
    }
    cands_.resize(n);
  }
  if (cands_.empty()) {
    return Status::error("sampling: every token is banned (all logits are -inf)");
  }
  top_p(cands_, params_.top_p);
  min_p(cands_, params_.min_p);
  softmax(cands_, params_.temperature, probs_);
  return -1;
}

} // namespace offgraph::sample
