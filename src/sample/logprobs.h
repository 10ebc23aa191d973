// Log-probabilities of tokens under a model's logits, as the OpenAI API reports them: the chosen
// token's and the k most likely. They are the log-softmax of the logits as the model computed
// them, before any sampling step (penalties, bias, forced output, temperature, top-k/p/min-p):
// the model's own distribution, which is what evaluations score (the log-softmax of what
// `offgraph logits -o` writes), and the same whatever sampling settings a request chose.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace offgraph::sample {

struct TokenLogprobs {
  int32_t token = -1;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top; // most likely first (ties: lower id first)
};

// Largest `top` a request may ask for (OpenAI's limit for chat).
constexpr int32_t kMaxTopLogprobs = 20;

// `token` in [0, logits.size()); 0 <= top <= kMaxTopLogprobs. Computed in double precision.
TokenLogprobs token_logprobs(std::span<const float> logits, int32_t token, int32_t top);

} // namespace offgraph::sample
