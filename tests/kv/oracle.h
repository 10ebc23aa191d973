// The reference for update_and_attend: plain C++ in double precision. It keeps the whole history
// of every cache of every sequence (no rings, no storage types) and computes softmax attention
// with the exact window rule: a query at position p on a cache with window w sees keys
// [max(0, p - w + 1), p]; w = 0 sees [0, p].
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <vector>

namespace offgraph::kv::testing {

struct OracleCache {
  int32_t window = 0, n_kv_heads = 1, k_dim = 1, v_dim = 1;
};

class Oracle {
public:
  explicit Oracle(std::vector<OracleCache> caches) : caches_(std::move(caches)) {}

  // Rows of a new sequence (or a copy of another's first n positions).
  void create(int32_t seq) { history_[seq] = History(caches_.size()); }
  void fork(int32_t src, int32_t n, int32_t dst) {
    History h = history_.at(src);
    for (auto &c : h) {
      c.k.resize(size_t(n));
      c.v.resize(size_t(n));
    }
    history_[dst] = std::move(h);
  }
  void truncate(int32_t seq, int32_t n) {
    for (auto &c : history_.at(seq)) {
      c.k.resize(size_t(n));
      c.v.resize(size_t(n));
    }
  }
  void erase(int32_t seq) { history_.erase(seq); }
  int32_t length(int32_t seq) const { return int32_t(history_.at(seq)[0].k.size()); }

  // Appends T tokens' keys [T][H_kv][D_k] and values [T][H_kv][D_v] (flattened) to one cache.
  void append(int32_t seq, int32_t cache, const std::vector<float> &k,
              const std::vector<float> &v) {
    const OracleCache &c = caches_[size_t(cache)];
    auto &h = history_.at(seq)[size_t(cache)];
    const size_t ke = size_t(c.n_kv_heads * c.k_dim), ve = size_t(c.n_kv_heads * c.v_dim);
    for (size_t t = 0; t < k.size() / ke; ++t) {
      h.k.emplace_back(k.begin() + long(t * ke), k.begin() + long((t + 1) * ke));
      h.v.emplace_back(v.begin() + long(t * ve), v.begin() + long((t + 1) * ve));
    }
  }

  // Attention of queries q [T][H_q][D_k] at positions [position, position + T) over the cache's
  // history (which must already include the T new rows). Returns [T][H_q][D_v].
  std::vector<double> attend(int32_t seq, int32_t cache, int32_t position, int32_t T,
                             int32_t n_q_heads, const std::vector<float> &q, double scale) const {
    const OracleCache &c = caches_[size_t(cache)];
    const auto &h = history_.at(seq)[size_t(cache)];
    const int32_t group = n_q_heads / c.n_kv_heads;
    std::vector<double> out(size_t(T) * size_t(n_q_heads) * size_t(c.v_dim), 0.0);
    std::vector<double> w;
    for (int32_t t = 0; t < T; ++t) {
      const int32_t p = position + t;
      const int32_t lo = c.window > 0 ? std::max(0, p - c.window + 1) : 0;
      for (int32_t hq = 0; hq < n_q_heads; ++hq) {
        const int32_t g = hq / group;
        const float *qv = &q[(size_t(t) * size_t(n_q_heads) + size_t(hq)) * size_t(c.k_dim)];
        w.assign(size_t(p - lo + 1), 0.0);
        double mx = -INFINITY;
        for (int32_t j = lo; j <= p; ++j) {
          const float *kv = &h.k[size_t(j)][size_t(g) * size_t(c.k_dim)];
          double s = 0;
          for (int32_t d = 0; d < c.k_dim; ++d) s += double(qv[d]) * double(kv[d]);
          w[size_t(j - lo)] = s * scale;
          mx = std::max(mx, w[size_t(j - lo)]);
        }
        double sum = 0;
        for (double &x : w) sum += (x = std::exp(x - mx));
        double *o = &out[(size_t(t) * size_t(n_q_heads) + size_t(hq)) * size_t(c.v_dim)];
        for (int32_t j = lo; j <= p; ++j) {
          const float *vv = &h.v[size_t(j)][size_t(g) * size_t(c.v_dim)];
          const double a = w[size_t(j - lo)] / sum;
          for (int32_t d = 0; d < c.v_dim; ++d) o[d] += a * double(vv[d]);
        }
      }
    }
    return out;
  }

private:
  struct CacheHistory {
    std::vector<std::vector<float>> k, v; // [position][H_kv * dim]
  };
  using History = std::vector<CacheHistory>;
  std::vector<OracleCache> caches_;
  std::map<int32_t, History> history_;
};

// ||a - b|| / ||b||; NaN or infinity anywhere gives infinity, so it never passes.
inline double relative_error(const std::vector<float> &a, const std::vector<double> &b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += b[i] * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

} // namespace offgraph::kv::testing
