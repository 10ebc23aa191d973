// Logit processors and the seeded sampler. This layer sees one vector of logits per step and the
// tokens generated so far; it knows nothing about models, caches or text (stop strings live in
// stop.h).
//
// Chain order of Sampler::sample (llama.cpp's default chain, minus the samplers we do not have):
//   1. penalties over the last `penalty_last_n` history tokens (repetition, presence, frequency)
//   2. logit bias (additive; -inf bans a token outright)
//   3. top-k   4. top-p   5. min-p   (probabilities at temperature 1, over the survivors so far)
//   6. temperature   7. draw from the softmax of the survivors with the seeded PRNG
// Steps 6-7 work in double precision (softmax and draw below).
// temperature == 0 is greedy: the argmax of the logits after steps 1-2 (lowest id on ties);
// steps 3-5 never remove the argmax, so they are skipped.
//
// The pinned llama.cpp applies the logit bias *before* the penalties. We apply it after, so a
// caller's bias is exactly the additive shift it asked for instead of being divided by the
// repetition penalty. Bans (-inf) behave the same either way.
#pragma once

#include "base/status.h"

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

namespace offgraph::sample {

struct SamplingParams {
  // Generic defaults are llama.cpp's common_params_sampling defaults, a widely tested middle
  // ground: temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, no penalties, window 64. A
  // model's architecture may recommend others (engine::default_sampling).
  float temperature = 0.8f;        // >= 0; 0 = greedy
  int32_t top_k = 40;              // >= 0; 0 disables
  float top_p = 0.95f;             // in (0, 1]; 1 disables
  float min_p = 0.05f;             // in [0, 1]; 0 disables
  float repetition_penalty = 1.0f; // > 0; 1 disables. Divides positive logits, multiplies others
  float presence_penalty = 0.0f;   // subtracted once from every token present in the window
  float frequency_penalty = 0.0f;  // subtracted `count` times (count = occurrences in the window)
  int32_t penalty_last_n = 64;     // window: last N history tokens; 0 disables, -1 = all history
  uint64_t seed = 0;
  std::map<int32_t, float> logit_bias; // token id -> additive bias; -inf bans, +inf is invalid
};

// Checks every field; the message names the offending field and value. `vocab_size` bounds the
// token ids in logit_bias.
Status validate(const SamplingParams &params, int32_t vocab_size);

// xoshiro256** seeded through splitmix64: fixed integer arithmetic, so the same seed yields the
// same stream on every platform (std::*_distribution outputs are implementation-defined).
class Rng {
public:
  explicit Rng(uint64_t seed) { reseed(seed); }
  void reseed(uint64_t seed);
  uint64_t next_u64();
  // Uniform in [0, 1) with 53 random bits.
  double next_double() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

private:
  uint64_t s_[4];
};

struct Candidate {
  int32_t id;
  float logit;
};

// The processors, exposed so tests can check each against an independent computation. They act
// on a candidate list. "Best first" means logit descending, then id ascending: a total order, so
// results never depend on the standard library's sort. Only top_k reorders; the others filter
// and keep the incoming order, so the order the draw sees is the same on every platform.

// Step 1 over a full logit vector, on the last penalty_last_n tokens of `history`. Its ids at or
// past logits.size() are not tokens (image rows): neither penalised nor counted in the window.
// Negative ids (errors, which sample_checked reports) take a place and are skipped.
void apply_penalties(std::span<float> logits, std::span<const int32_t> history,
                     const SamplingParams &params);
// Step 2. Ids must be in [0, logits.size()).
void apply_logit_bias(std::span<float> logits, const std::map<int32_t, float> &bias);
// Keeps the k best, sorted best first (k <= 0 or k >= size keeps all, order untouched).
void top_k(std::vector<Candidate> &cands, int32_t k);
// Keeps the shortest best-first prefix whose probability mass reaches p (at least one token);
// order preserved. Expected O(n) however large the nucleus.
void top_p(std::vector<Candidate> &cands, float p);
// Keeps tokens with probability >= p * (largest probability); preserves order.
void min_p(std::vector<Candidate> &cands, float p);
// Step 6: probs[i] = softmax(logit / temperature)[i], temperature > 0. Computed in double from
// (logit - max) / temperature, so a tiny temperature cannot overflow to inf - inf = NaN.
void softmax(std::span<const Candidate> cands, float temperature, std::vector<double> &probs);
// Step 7: the first index whose cumulative probability exceeds u * (sum of probs), u in [0, 1).
size_t draw(std::span<const double> probs, double u);
// Lowest id among the largest values.
int32_t argmax(std::span<const float> logits);

class Sampler {
public:
  // Validates params against vocab_size.
  static Result<Sampler> create(SamplingParams params, int32_t vocab_size);

  // One token from `logits` (size vocab_size) given the tokens generated so far. Returns
  // kNoToken when the input cannot be sampled; sample_checked says why.
  static constexpr int32_t kNoToken = -1;
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history);
  // Errors: wrong logits size, a NaN or +inf logit, an id outside the vocabulary in the penalty
  // window of `history`, or every token banned (-inf). A failed call does not advance the PRNG.
  Result<int32_t> sample_checked(std::span<const float> logits, std::span<const int32_t> history);

  // The distribution sample_checked draws from, as a probability per token id (steps 1-6; zero
  // for every token the filters removed; one-hot at the argmax when greedy), without drawing.
  // For speculative sampling's p and q. Errors as sample_checked's.
  Status distribution(std::span<const float> logits, std::span<const int32_t> history,
                      std::vector<double> &probs);
  // One token drawn from `probs` (by id, summing to about 1) with this sampler's PRNG; kNoToken
  // when none has weight.
  int32_t draw_from(std::span<const double> probs);
  // One draw of the PRNG, uniform in [0, 1) (speculative sampling's acceptance tests).
  double uniform() { return rng_.next_double(); }

  // Restarts the PRNG stream, e.g. to replay a generation.
  void reseed(uint64_t seed) { rng_.reseed(seed); }
  const SamplingParams &params() const { return params_; }
  int32_t vocab_size() const { return vocab_size_; }

private:
  Sampler(SamplingParams params, int32_t vocab_size)
      : params_(std::move(params)), vocab_size_(vocab_size), rng_(params_.seed) {}

  // Steps 1-6 of the chain: the greedy token, or -1 with the candidates in cands_ and their
  // probabilities (unnormalised) in probs_.
  Result<int32_t> filter(std::span<const float> logits, std::span<const int32_t> history);

  SamplingParams params_;
  int32_t vocab_size_;
  Rng rng_;
  // Scratch reused across calls so a step allocates nothing once warm.
  std::vector<float> work_;
  std::vector<Candidate> cands_;
  std::vector<double> probs_;
};

} // namespace offgraph::sample
