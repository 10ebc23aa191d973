// NodeProfile: wall time per kind of graph node, summed over the nodes of many steps, for
// comparing where two engines spend a step (offgraph bench --profile-ops, and the same table from
// llama_peer_bench --profile-ops through libllama's eval callback). Header-only on ggml's public
// API so that both programs, linked against their own ggml, share one definition of "kind".
//
// Kind: a matrix product by its weight ("MUL_MAT attn_q", from the weight's GGUF name without
// "blk.N." and ".weight"; offgraph's own matrix kernels, custom ops named "*_mul_mat", count as
// MUL_MAT), any other node by its op ("FLASH_ATTN_EXT", "RMS_NORM", ...). Each kind also counts
// the weight bytes its nodes read (a product reads its whole weight, a row lookup the rows it
// takes): per decode step, the bytes that bound its speed by the memory's.
#pragma once

#include "ggml-backend.h"
#include "ggml.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace offgraph::model {

class NodeProfile {
public:
  static bool is_matrix_product(const ggml_tensor *node) {
    if (node->op == GGML_OP_MUL_MAT) return true;
    const std::string name = node->name;
    return node->op == GGML_OP_CUSTOM && name.size() > 8 &&
           name.compare(name.size() - 8, 8, "_mul_mat") == 0;
  }

  static std::string kind(const ggml_tensor *node) {
    std::string op = is_matrix_product(node) ? "MUL_MAT" : ggml_op_desc(node);
    if (!is_matrix_product(node) && node->op != GGML_OP_GET_ROWS) return op;
    const ggml_tensor *w = node->src[0];
    std::string name = w ? w->name : "";
    if (name.rfind("blk.", 0) == 0) name = name.substr(name.find('.', 4) + 1);
    if (const size_t dot = name.rfind(".weight"); dot != std::string::npos) name.resize(dot);
    const bool weight = w && w->buffer &&
                        (name.find("attn_") == 0 || name.find("ffn_") == 0 || name == "output" ||
                         name == "token_embd");
    return op + (weight ? " " + name : " (activations)");
  }

  // Bytes of weights (tensors of a weights buffer, as both engines mark theirs) the node reads.
  static long long weight_bytes(const ggml_tensor *node) {
    const ggml_tensor *w = node->src[0];
    if (!w) return 0;
    ggml_backend_buffer_t buffer = w->view_src ? w->view_src->buffer : w->buffer;
    if (!buffer || ggml_backend_buffer_get_usage(buffer) != GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
      return 0;
    if (is_matrix_product(node)) return (long long)ggml_nbytes(w);
    if (node->op == GGML_OP_GET_ROWS && node->src[1])
      return (long long)(ggml_nelements(node->src[1]) * (int64_t)w->nb[1]);
    return 0;
  }

  void add(const ggml_tensor *node, double seconds) {
    Entry &e = entries_[kind(node)];
    e.calls += 1;
    e.seconds += seconds;
    e.bytes += weight_bytes(node);
  }

  bool empty() const { return entries_.empty(); }

  // One line per kind, largest first: calls, total ms, ms per step, share of the total.
  void print(FILE *out, const char *title, int steps) const {
    double total = 0;
    for (const auto &[k, e] : entries_) total += e.seconds;
    std::vector<std::pair<std::string, Entry>> rows(entries_.begin(), entries_.end());
    std::sort(rows.begin(), rows.end(),
              [](const auto &a, const auto &b) { return a.second.seconds > b.second.seconds; });
    long long bytes = 0;
    for (const auto &[k, e] : entries_) bytes += e.bytes;
    const int per = std::max(steps, 1);
    std::fprintf(out, "## %s: %d steps, %.1f ms of nodes\n", title, steps, total * 1e3);
    std::fprintf(out, "%-32s %8s %10s %10s %7s %10s\n", "kind", "calls", "total ms", "ms/step",
                 "share", "MB/step");
    for (const auto &[k, e] : rows)
      std::fprintf(out, "%-32s %8lld %10.2f %10.3f %6.1f%% %10.3f\n", k.c_str(), e.calls,
                   e.seconds * 1e3, e.seconds * 1e3 / per,
                   total > 0 ? 100.0 * e.seconds / total : 0.0, double(e.bytes) / 1e6 / per);
    std::fprintf(out, "weight bytes per step: %lld\n", bytes / per);
  }

private:
  struct Entry {
    long long calls = 0;
    double seconds = 0;
    long long bytes = 0;
  };
  std::map<std::string, Entry> entries_;
};

} // namespace offgraph::model
