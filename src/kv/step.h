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

#include <climits>
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

  // The graph the fragments go into. Needed by a ring step longer than the ring's lead
  // (cache::StepPlan::deferred_write): its writes must follow the reads of the ring's older rows,
  // which no data dependency orders, so those reads go into the graph first, then the writes.
  void set_graph(ggml_cgraph *gf) { graph_ = gf; }

  // The graph fragment for one attention layer on one span. `ctx` is the graph's (no_alloc)
  // context. Writes k and v into the planned rows, then attends q over the planned read rows with
  // the mask derived from logical positions. A second call on the same cache id and span (a
  // shared layer re-serving its donor's cache) writes nothing and reads the same rows. On a ring
  // step longer than the ring's lead the order is the other way: q attends a copy of the ring's
  // older rows followed by the span's own (k and v in the storage type), and the span's rows are
  // written into the ring after that copy (every layer reading the cache attends the copy).
  Result<ggml_tensor *> update_and_attend(ggml_context *ctx, ggml_tensor *q, ggml_tensor *k,
                                          ggml_tensor *v, int32_t span, cache::CacheId id,
                                          float scale);

  // After the graph holding the fragments was allocated: uploads row indices and masks.
  void set_inputs();
  // After the graph computed successfully: every span's sequence advances by its tokens. Refuses
  // (advancing nothing) a step already committed or whose sequence is gone.
  Status commit();

  const std::vector<Span> &spans() const { return spans_; }
  // The cache's storage after each write of this step (set_rows results, and a deferred write's
  // copies into ring slots), in call order: a pass that wants no logits (a prompt chunk before
  // the last) computes only what these depend on.
  const std::vector<ggml_tensor *> &writes() const { return writes_; }

private:
  enum class Kernel { Grouped, Tiled, Ggml };
  struct Written { // the storage of one cache after the span's write, as views for attention
    ggml_tensor *k = nullptr, *v = nullptr, *mask = nullptr;
    Kernel kernel = Kernel::Ggml; // flat caches: the kernel the views were built for
    RowMap rows;                  // scattered pages read by offgraph's kernels
    bool mask_labels = false;     // scattered pages read by ggml's kernel as a masked range
    // A deferred write (cache::StepPlan::deferred_write): the span's rows in the storage type and
    // the ring slots they go to.
    ggml_tensor *k_staged = nullptr, *v_staged = nullptr;
    cache::Runs deferred_slots;
  };
  struct Pending {
    ggml_tensor *tensor;
    std::vector<uint8_t> bytes;
  };

  Result<int32_t> declare(Span span);
  ggml_tensor *input(ggml_context *ctx, ggml_type type, int64_t ne0, int64_t ne1,
                     std::vector<uint8_t> bytes);
  ggml_tensor *write_indices(ggml_context *ctx, int32_t span, const cache::StepPlan &plan);
  // Rows 0..n-1, for converting a span's rows into a tensor of the storage type.
  ggml_tensor *identity_indices(ggml_context *ctx, int32_t n);
  // Which kernel attends a span of T tokens with `group` query heads a KV head: offgraph's own
  // (custom ops, CPU only) where the storage is in host memory, ggml's stock ops elsewhere.
  Kernel choose_kernel(int64_t T, int64_t group, const cache::CacheSpec &spec, bool host) const;
  // The span's page table, copied when first used (the kernels read it while the graph computes).
  const std::vector<int32_t> &span_pages(int32_t span);
  // Which positions the rows read hold: ring slots labelled from the high-water mark
  // `high_water` (ring_rows > 0; labels >= hide_from are stale), one label per row (labels: pool
  // rows of paged storage that ggml's kernel reads as a range, -1 where a row is not the
  // sequence's), or consecutive positions from first_label. A deferred write's step reads
  // tail_rows more after them: the span's own, at its positions.
  struct RowLabels {
    int32_t ring_rows = 0, first_label = 0, first_row = 0, n_rows = 0;
    int32_t high_water = 0, hide_from = INT32_MAX, tail_rows = 0;
    std::shared_ptr<const std::vector<int32_t>> labels;
  };
  // Attention of q over the rows `w` holds, with the kernel its shapes choose.
  Result<ggml_tensor *> attend(ggml_context *ctx, ggml_tensor *q, const Written &w, int32_t span,
                               cache::CacheId id, float scale);
  // A deferred write's views: the ring's older rows, then the span's staged rows.
  void attend_before_write(ggml_context *ctx, const cache::StepPlan &plan, ggml_tensor *k_rows,
                           ggml_tensor *v_rows, ggml_tensor *k_store, ggml_tensor *v_store,
                           bool host, RowLabels &rows, Written &w);
  // The copies of a deferred write's staged rows into their ring slots, appended to the graph.
  void write_deferred(const Written &w, ggml_context *ctx, const Span &sp, cache::CacheId id);
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
    int32_t position, n_tokens, window;
    RowLabels rows;
  };
  static void fill_mask(const PendingMask &pm, ggml_fp16_t *out);

  KvStore &store_;
  std::vector<Span> spans_;
  std::vector<cache::StepPlan> commit_plans_; // one per span (any cache: the length is shared)
  std::map<std::pair<int32_t, cache::CacheId>, Written> written_;
  // Masks and index tensors depend only on the span and a few numbers, not on the layer: build
  // each once per step and share it across layers.
  std::map<std::tuple<int32_t, int32_t, int32_t, int32_t, int32_t, int32_t, int32_t>, ggml_tensor *>
      masks_;
  std::map<std::pair<int32_t, int32_t>, ggml_tensor *> indices_;
  std::map<std::tuple<int32_t, int32_t, int32_t, int32_t>, ggml_tensor *> gathers_;
  std::map<int32_t, std::vector<int32_t>> span_pages_;
  std::vector<Pending> pending_;
  std::vector<ggml_tensor *> writes_;
  std::vector<PendingMask> pending_masks_;
  // Read by the grouped attention ops while the graph computes (stable addresses).
  std::deque<GroupedAttentionParams> grouped_params_;
  std::deque<TiledAttentionParams> tiled_params_;
  ggml_cgraph *graph_ = nullptr;
  bool committed_ = false;
  // One step per store at a time: another step's growth would free storage this graph views.
  bool in_flight_ = false;
};

} // namespace offgraph::kv
