// Compares two logits files (logits_file.h): the same prompt, the same greedy picks, and every
// row within a relative error bound (||a - b|| / ||b||). Exits 0 when they agree.
//
// With --near-ties (the AMX cases), greedy picks may part at a near tie after at least 8
// identical ones: where the row that picked them is within the bound and
// its two candidates lie closer on both sides than the rows differ (each side's pick beats the
// other's by at most the row's largest difference), the rounding of a kernel that sums in another
// order explains the split (AMX q8_0 multiplies against ggml's, model/amx_matmul.h). The rows up
// to that one are compared; later ones follow different tokens and are not.
//
//   compare_logits OURS THEIRS TOLERANCE [--near-ties]
#include "logits_file.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

int main(int argc, char **argv) {
  const bool near_ties = argc == 5 && std::string(argv[4]) == "--near-ties";
  if (argc != 4 && !near_ties)
    return std::fprintf(stderr, "usage: compare_logits OURS THEIRS TOLERANCE [--near-ties]\n"), 2;
  offgraph::peer::LogitsFile a, b;
  for (auto [f, p] : {std::pair{&a, argv[1]}, std::pair{&b, argv[2]}})
    if (std::string e = f->read(p); !e.empty()) return std::fprintf(stderr, "%s\n", e.c_str()), 2;
  const double tol = std::atof(argv[3]);
  if (a.n_vocab != b.n_vocab || a.n_prompt != b.n_prompt || a.n_rows() != b.n_rows() ||
      a.n_rows() == 0)
    return std::fprintf(stderr, "shapes differ: vocab %u/%u, prompt %u/%u, rows %u/%u\n", a.n_vocab,
                        b.n_vocab, a.n_prompt, b.n_prompt, a.n_rows(), b.n_rows()),
           1;
  // Relative error of row r, and its largest difference.
  auto row_error = [&](uint32_t r, double *max_diff) {
    double num = 0, den = 0, most = 0;
    for (uint32_t v = 0; v < a.n_vocab; ++v) {
      const double x = a.logits[size_t(r) * a.n_vocab + v], y = b.logits[size_t(r) * a.n_vocab + v];
      num += (x - y) * (x - y);
      den += y * y;
      most = std::max(most, std::abs(x - y));
    }
    if (max_diff) *max_diff = most;
    return std::isfinite(num) && den > 0 ? std::sqrt(num / den) : INFINITY;
  };
  int bad = 0;
  uint32_t rows = a.n_rows(); // compared
  std::string greedy = "identical";
  for (size_t i = 0; i < a.tokens.size() && i < b.tokens.size(); ++i) {
    if (a.tokens[i] == b.tokens[i]) continue;
    constexpr size_t kIdenticalPicksFirst = 8;
    if (near_ties && i >= a.n_prompt + kIdenticalPicksFirst && i - 1 < a.n_rows()) {
      const uint32_t r = uint32_t(i - 1); // the row that picked token i
      double max_diff = 0;
      const double err = row_error(r, &max_diff);
      const auto logit = [&](const offgraph::peer::LogitsFile &f, uint32_t t) {
        return double(f.logits[size_t(r) * f.n_vocab + t]);
      };
      const double gap_a = logit(a, a.tokens[i]) - logit(a, b.tokens[i]);
      const double gap_b = logit(b, b.tokens[i]) - logit(b, a.tokens[i]);
      if (err <= tol && gap_a <= max_diff && gap_b <= max_diff) {
        rows = r + 1;
        greedy = "parts at pick " + std::to_string(i - a.n_prompt + 1) + " of " +
                 std::to_string(a.tokens.size() - a.n_prompt) + " at a near tie (row " +
                 std::to_string(r) + ": gaps " + std::to_string(gap_a) + " and " +
                 std::to_string(gap_b) + ", largest difference " + std::to_string(max_diff) + ")";
        break;
      }
    }
    std::fprintf(stderr, "token %zu differs: %u vs %u (%s)\n", i, a.tokens[i], b.tokens[i],
                 i < a.n_prompt ? "prompt" : "greedy pick");
    ++bad;
    greedy = "DIFFERS";
    break;
  }
  double worst = 0;
  uint32_t worst_row = 0;
  for (uint32_t r = 0; r < rows; ++r)
    if (const double err = row_error(r, nullptr); !(err <= worst)) worst = err, worst_row = r;
  std::printf("%u rows (%u prompt, %zu greedy picks), %u compared, worst relative error %.3g at "
              "row %u (bound %g); greedy %s\n",
              a.n_rows(), a.n_prompt, a.tokens.size() - a.n_prompt, rows, worst, worst_row, tol,
              greedy.c_str());
  return (bad || !(worst <= tol)) ? 1 : 0;
}
