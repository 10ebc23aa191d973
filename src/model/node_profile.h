// NodeProfile: wall time per kind of graph node, summed over the nodes of many steps, for
// comparing where two engines spend a step (offgraph bench --profile-ops, and the same table from
// llama_peer_bench --profile-ops through libllama's eval callback). Header-only on ggml.h's public
// API so that both programs, linked against their own ggml, share one definition of "kind".
//
// Kind: a matrix product by its weight ("mul_mat attn_q", from the weight's GGUF name without
// "blk.N." and ".weight"), any other node by its op ("FLASH_ATTN_EXT", "RMS_NORM", ...).
#pragma once

#include "ggml.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace offgraph::model {

class NodeProfile {
public:
  static std::string kind(const ggml_tensor *node) {
    std::string op = ggml_op_desc(node);
    if (node->op != GGML_OP_MUL_MAT && node->op != GGML_OP_GET_ROWS) return op;
    const ggml_tensor *w = node->src[0];
    std::string name = w ? w->name : "";
    if (name.rfind("blk.", 0) == 0) name = name.substr(name.find('.', 4) + 1);
    if (const size_t dot = name.rfind(".weight"); dot != std::string::npos) name.resize(dot);
    const bool weight = w && w->buffer &&
                        (name.find("attn_") == 0 || name.find("ffn_") == 0 || name == "output" ||
                         name == "token_embd");
    return op + (weight ? " " + name : " (activations)");
  }

  void add(const ggml_tensor *node, double seconds) {
    Entry &e = entries_[kind(node)];
    e.calls += 1;
    e.seconds += seconds;
  }

  bool empty() const { return entries_.empty(); }

  // One line per kind, largest first: calls, total ms, ms per step, share of the total.
  void print(FILE *out, const char *title, int steps) const {
    double total = 0;
    for (const auto &[k, e] : entries_) total += e.seconds;
    std::vector<std::pair<std::string, Entry>> rows(entries_.begin(), entries_.end());
    std::sort(rows.begin(), rows.end(),
              [](const auto &a, const auto &b) { return a.second.seconds > b.second.seconds; });
    std::fprintf(out, "## %s: %d steps, %.1f ms of nodes\n", title, steps, total * 1e3);
    std::fprintf(out, "%-32s %8s %10s %10s %7s\n", "kind", "calls", "total ms", "ms/step", "share");
    for (const auto &[k, e] : rows)
      std::fprintf(out, "%-32s %8lld %10.2f %10.3f %6.1f%%\n", k.c_str(), e.calls, e.seconds * 1e3,
                   e.seconds * 1e3 / std::max(steps, 1),
                   total > 0 ? 100.0 * e.seconds / total : 0.0);
  }

private:
  struct Entry {
    long long calls = 0;
    double seconds = 0;
  };
  std::map<std::string, Entry> entries_;
};

} // namespace offgraph::model
