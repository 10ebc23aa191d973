// Compares two logits files (logits_file.h): the same prompt, the same greedy picks, and every
// row within a relative error bound (||a - b|| / ||b||). Exits 0 when they agree.
//
//   compare_logits OURS THEIRS TOLERANCE
#include "logits_file.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

int main(int argc, char **argv) {
  if (argc != 4) return std::fprintf(stderr, "usage: compare_logits OURS THEIRS TOLERANCE\n"), 2;
  offgraph::peer::LogitsFile a, b;
  for (auto [f, p] : {std::pair{&a, argv[1]}, std::pair{&b, argv[2]}})
    if (std::string e = f->read(p); !e.empty()) return std::fprintf(stderr, "%s\n", e.c_str()), 2;
  const double tol = std::atof(argv[3]);
  if (a.n_vocab != b.n_vocab || a.n_prompt != b.n_prompt || a.n_rows() != b.n_rows() ||
      a.n_rows() == 0)
    return std::fprintf(stderr, "shapes differ: vocab %u/%u, prompt %u/%u, rows %u/%u\n", a.n_vocab,
                        b.n_vocab, a.n_prompt, b.n_prompt, a.n_rows(), b.n_rows()),
           1;
  int bad = 0;
  for (size_t i = 0; i < a.tokens.size() && i < b.tokens.size(); ++i)
    if (a.tokens[i] != b.tokens[i]) {
      std::fprintf(stderr, "token %zu differs: %u vs %u (%s)\n", i, a.tokens[i], b.tokens[i],
                   i < a.n_prompt ? "prompt" : "greedy pick");
      ++bad;
      break;
    }
  double worst = 0;
  uint32_t worst_row = 0;
  for (uint32_t r = 0; r < a.n_rows(); ++r) {
    double num = 0, den = 0;
    for (uint32_t v = 0; v < a.n_vocab; ++v) {
      const double x = a.logits[size_t(r) * a.n_vocab + v], y = b.logits[size_t(r) * a.n_vocab + v];
      num += (x - y) * (x - y);
      den += y * y;
    }
    const double err = std::isfinite(num) && den > 0 ? std::sqrt(num / den) : INFINITY;
    if (!(err <= worst)) worst = err, worst_row = r;
  }
  std::printf("%u rows (%u prompt, %zu greedy picks), worst relative error %.3g at row %u (bound "
              "%g); greedy %s\n",
              a.n_rows(), a.n_prompt, a.tokens.size() - a.n_prompt, worst, worst_row, tol,
              bad ? "DIFFERS" : "identical");
  return (bad || !(worst <= tol)) ? 1 : 0;
}
