// Step: one forward pass's view of the cache. The runner declares the spans of the pass (one per
// sequence); the model then calls update_and_attend once per attention layer and span; once the
// graph is allocated, set_inputs() fills the index and mask tensors; once it has computed,
// commit() advances the sequences. A failed pass leaves every sequence as it was.
//
// Tensor layouts (f32, T = the span's tokens):
//   q   [D_k, H_q,  T]   queries, RoPE applied (H_q a multiple of H_kv; head h reads KV head
//                        h / (H_q / H_kv))
//   k   [D_k, H_kv, T]   the span's new keys, RoPE applied
//   v   [D_v, H_kv, T]   the span's new values (D_v may differ from D_k)
//   out [D_v, H_q,  T]   f32 whatever the storage types; reshape to [D_v * H_q, T] for the output
//                        projection
#pragma once

#include "base/status.h"
#include "kv/grouped_attention.h"
#include "kv/kv_store.h"
#include "kv/tiled_attention.h"

#include "ggml.h"

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

namespace offgraph::kv {

struct Span {
  SeqId seq = 0;
  int32_t position = 0; // must be the sequence's length
  int32_t n_tokens = 0;
};

class Step {
public:
  explicit Step(KvStore &store) : store_(store) {}
  ~Step();
  Step(const Step &) = delete;
  Step &operator=(const Step &) = delete;

  // Declares a span; returns its index for update_and_attend. Checks that the positions continue
  // the sequence, fit max_write and the capacity, and grows flat storage to hold them (so graph
  // views stay valid). A sequence may appear once per step.
  Result<int32_t> add_span(Span span);

  // The graph fragment for one attention layer on one span. `ctx` is the graph's (no_alloc)
  // context. Writes k and v into the planned rows, then attends q over the planned read rows with
  // the mask derived from logical positions. A second call on the same cache id and span (a
  // shared layer re-serving its donor's cache) writes nothing and reads the same rows.
  Result<ggml_tensor *> update_and_attend(ggml_context *ctx, ggml_tensor *q, ggml_tensor *k,
                                          ggml_tensor *v, int32_t span, cache::CacheId id,
                                          float scale);

  // After the graph holding the fragments was allocated: uploads row indices and masks.
  void set_inputs();
  // After the graph computed successfully: every span's sequence advances by its tokens.
  Status commit();

  const std::vector<Span> &spans() const { return spans_; }
  // The cache's storage after each write of this step (set_rows results), in call order: a pass
  // that wants no logits (a prompt chunk before the last) computes only what these depend on.
  const std::vector<ggml_tensor *> &writes() const { return writes_; }

private:
  enum class Kernel { Grouped, Tiled, Ggml };
  struct Written { // the storage of one cache after the span's write, as views for attention
    ggml_tensor *k = nullptr, *v = nullptr, *mask = nullptr;
    Kernel kernel = Kernel::Ggml; // flat caches: the kernel the views were built for
    RowMap rows;                  // scattered pages read by offgraph's kernels
    bool mask_labels = false;     // scattered pages read by ggml's kernel as a masked range
  };
  struct Pending {
    ggml_tensor *tensor;
    std::vector<uint8_t> bytes;
  };

  Result<int32_t> declare(Span span);
  ggml_tensor *input(ggml_context *ctx, ggml_type type, int64_t ne0, int64_t ne1,
                     std::vector<uint8_t> bytes);
  ggml_tensor *write_indices(ggml_context *ctx, int32_t span, const cache::StepPlan &plan);
  // Which kernel attends a span of T tokens with `group` query heads a KV head: offgraph's own
  // (custom ops, CPU only) where the storage is in host memory, ggml's stock ops elsewhere.
  Kernel choose_kernel(int64_t T, int64_t group, const cache::CacheSpec &spec, bool host) const;
  // The span's page table, copied when first used (the kernels read it while the graph computes).
  const std::vector<int32_t> &span_pages(int32_t span);
  // Which positions the rows read hold: ring slots labelled from the high-water mark
  // (ring_rows > 0), one label per row (labels: pool rows of paged storage that ggml's kernel
  // reads as a range, -1 where a row is not the sequence's), or consecutive positions from
  // first_label.
  struct RowLabels {
    int32_t ring_rows = 0, first_label = 0, first_row = 0, n_rows = 0;
    std::shared_ptr<const std::vector<int32_t>> labels;
  };
  ggml_tensor *mask(ggml_context *ctx, int32_t span, const cache::StepPlan &plan,
                    const RowLabels &rows);
  // A device's read of a sequence's pages that are not consecutive: the pool rows of pages
  // [first_page, end_page) in order, then the pool's zero rows up to n_rows (an input shared by
  // every layer of the span), and the rows gathered into a tensor of the storage's type.
  ggml_tensor *gather_indices(ggml_context *ctx, int32_t span, int32_t first_page, int32_t end_page,
                              int32_t n_rows, int32_t zero_row);
  static ggml_tensor *gather_rows(ggml_context *ctx, ggml_tensor *written, ggml_tensor *indices,
                                  int32_t dim, int32_t n_kv_heads);
  struct PendingMask { // what a mask tensor must hold, written once the graph is allocated
    ggml_tensor *tensor;
    int32_t position, n_tokens, high_water_after, window;
    RowLabels rows;
  };
  static void fill_mask(const PendingMask &pm, ggml_fp16_t *out);

  KvStore &store_;
  std::vector<Span> spans_;
  std::vector<cache::StepPlan> commit_plans_; // one per span (any cache: the length is shared)
  std::map<std::pair<int32_t, cache::CacheId>, Written> written_;
  // Masks and index tensors depend only on the span and a few numbers, not on the layer: build
  // each once per step and share it across layers.
  std::map<std::tuple<int32_t, int32_t, int32_t, int32_t, int32_t, int32_t>, ggml_tensor *> masks_;
  std::map<std::pair<int32_t, int32_t>, ggml_tensor *> indices_;
  std::map<std::tuple<int32_t, int32_t, int32_t, int32_t>, ggml_tensor *> gathers_;
  std::map<int32_t, std::vector<int32_t>> span_pages_;
  std::vector<Pending> pending_;
  std::vector<ggml_tensor *> writes_;
  std::vector<PendingMask> pending_masks_;
  // Read by the grouped attention ops while the graph computes (stable addresses).
  std::deque<GroupedAttentionParams> grouped_params_;
  std::deque<TiledAttentionParams> tiled_params_;
  bool committed_ = false;
  // One step per store at a time: another step's growth would free storage this graph views.
  bool in_flight_ = false;
};

} // namespace offgraph::kv
