#include "sample/speculative.h"

#include <algorithm>

namespace offgraph::sample {

SpeculativeVerdict verify_greedy(std::span<const int32_t> draft,
                                 std::span<const int32_t> target_choice) {
  SpeculativeVerdict v;
  while (v.accepted < draft.size() && v.accepted + 1 < target_choice.size() &&
         draft[v.accepted] == target_choice[v.accepted])
    ++v.accepted;
  if (v.accepted < target_choice.size()) v.next = target_choice[v.accepted];
  return v;
}

namespace {

// A draw from the positive weights of w (not necessarily normalised); the last positive one if
// rounding runs out; -1 if none is positive.
int32_t draw(const std::vector<double> &w, double u) {
  double total = 0;
  for (double x : w) total += std::max(0.0, x);
  double at = u * total;
  int32_t last = -1;
  for (size_t i = 0; i < w.size(); ++i) {
    if (w[i] <= 0) continue;
    last = int32_t(i);
    if (at < w[i]) return int32_t(i);
    at -= w[i];
  }
  return last;
}

} // namespace

SpeculativeVerdict verify_sampled(std::span<const int32_t> draft,
                                  std::span<const std::vector<double>> target,
                                  std::span<const std::vector<double>> draft_dists,
                                  const std::function<double()> &uniform) {
  SpeculativeVerdict v;
  const size_t k =
      std::min({draft.size(), draft_dists.size(), target.empty() ? 0 : target.size() - 1});
  for (; v.accepted < k; ++v.accepted) {
    const int32_t d = draft[v.accepted];
    const std::vector<double> &p = target[v.accepted], &q = draft_dists[v.accepted];
    const double pd = d >= 0 && size_t(d) < p.size() ? p[size_t(d)] : 0.0;
    const double qd = d >= 0 && size_t(d) < q.size() ? q[size_t(d)] : 0.0;
    // Kept with probability min(1, p(d) / q(d)). A d that q could not have drawn cannot be kept,
    // and then nothing of p was covered: the correction is drawn from p itself.
    if (qd <= 0) {
      v.next = draw(p, uniform());
      return v;
    }
    if (uniform() * qd < pd) continue;
    // Rejected: the rest of p that q did not already cover.
    std::vector<double> residual(p.size());
    bool any = false;
    for (size_t i = 0; i < p.size(); ++i) {
      residual[i] = std::max(0.0, p[i] - (i < q.size() ? q[i] : 0.0));
      any |= residual[i] > 0;
    }
    v.next = draw(any ? residual : p, uniform());
    return v;
  }
  if (!target.empty()) v.next = draw(target[v.accepted], uniform());
  return v;
}

} // namespace offgraph::sample
