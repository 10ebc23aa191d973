// What speculative decoding keeps of a draft: the drafted tokens accepted against the target's
// distributions at their positions, and the one token the target adds after them (a correction
// at the first rejection, or a bonus when every drafted token is kept). The engine runs the
// target once over [last token, d_1..d_k] and rewinds the rejected suffix.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace offgraph::sample {

struct SpeculativeVerdict {
  size_t accepted = 0; // drafted tokens kept, from the first
  int32_t next = -1;   // the token the target adds after them
};

// Greedy: drafted tokens are kept while each equals the target's choice at its position;
// `next` is the target's choice where they stop. `target_choice` has one entry more than
// `draft`. The output is the one plain greedy decoding writes.
SpeculativeVerdict verify_greedy(std::span<const int32_t> draft,
                                 std::span<const int32_t> target_choice);

// Speculative sampling (Leviathan et al. 2023; Chen et al. 2023): drafted token d_i, drawn from
// the draft's distribution q_i, is kept with probability min(1, p_i(d_i) / q_i(d_i)); at the
// first rejection `next` is drawn from max(0, p_i - q_i), normalised; when all are kept, from
// p_k. Every token emitted then follows the target's distribution p exactly, whatever q is.
// `target` holds k + 1 distributions and `draft_dists` k, each a probability per token id
// (vocabulary-sized, summing to 1: the sampler's candidate list after its filters and
// temperature, spread out by id); `uniform` draws from [0, 1). `next` is -1 only when the
// distribution it is drawn from has no positive entry. A
// deterministic drafter (n-grams) has q_i one-hot at d_i: then d_i is kept with probability
// p_i(d_i), and a rejection draws from p_i without d_i.
SpeculativeVerdict verify_sampled(std::span<const int32_t> draft,
                                  std::span<const std::vector<double>> target,
                                  std::span<const std::vector<double>> draft_dists,
                                  const std::function<double()> &uniform);

} // namespace offgraph::sample
