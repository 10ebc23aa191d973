#include "kv/step.h"

#include "ggml-backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace offgraph::kv {

using cache::CacheId;
using cache::StepPlan;

namespace {
std::string shape(const ggml_tensor *t) {
  return "[" + std::to_string(t->ne[0]) + ", " + std::to_string(t->ne[1]) + ", " +
         std::to_string(t->ne[2]) + ", " + std::to_string(t->ne[3]) + "]";
}
} // namespace

Step::~Step() {
  if (in_flight_) --store_.steps_in_flight_;
}

Result<int32_t> Step::add_span(Span span) {
  if (!in_flight_) {
    if (store_.steps_in_flight_ > 0)
      return Status::error("step: another step of this store is in flight (one at a time: its "
                           "storage could move under the other's graph)");
    ++store_.steps_in_flight_;
    in_flight_ = true;
  }
  auto added = declare(span);
  if (!added.ok() && spans_.empty()) { // nothing declared: leave the store free for another step
    --store_.steps_in_flight_;
    in_flight_ = false;
  }
  return added;
}

Result<int32_t> Step::declare(Span span) {
  cache::Sequence *seq = store_.sequence(span.seq);
  if (!seq) return Status::error("step: no sequence " + std::to_string(span.seq));
  for (const Span &s : spans_)
    if (s.seq == span.seq)
      return Status::error("step: sequence " + std::to_string(span.seq) +
                           " already has a span in this step");
  auto plan = seq->plan(0, span.position, span.n_tokens);
  if (!plan.ok())
    return Status::error("step: sequence " + std::to_string(span.seq) + ": " + plan.message());
  if (Status s = store_.reserve(span.seq, plan->end()); !s.ok())
    return Status::error(s.message(), StatusCode::kResourceExhausted); // Forward::failed_span
  spans_.push_back(span);
  commit_plans_.push_back(*plan);
  return int32_t(spans_.size() - 1);
}

ggml_tensor *Step::input(ggml_context *ctx, ggml_type type, int64_t ne0, int64_t ne1,
                         std::vector<uint8_t> bytes) {
  ggml_tensor *t = ggml_new_tensor_2d(ctx, type, ne0, ne1);
  ggml_set_input(t);
  pending_.push_back({t, std::move(bytes)});
  return t;
}

ggml_tensor *Step::write_indices(ggml_context *ctx, int32_t span, const StepPlan &plan) {
  // Flat caches write at their positions, rings at positions mod R; key on R (0 for flat).
  const int32_t ring_rows =
      store_.layout().cache(plan.cache).ring() ? store_.layout().cache(plan.cache).max_rows : 0;
  auto key = std::pair{span, ring_rows};
  if (auto it = indices_.find(key); it != indices_.end()) return it->second;
  std::vector<uint8_t> bytes(size_t(plan.n_tokens) * sizeof(int64_t));
  int64_t *rows = reinterpret_cast<int64_t *>(bytes.data());
  int32_t i = 0;
  // A flat cache's row is its position, found through the page table.
  const cache::PageTable *table = ring_rows ? nullptr : store_.page_table(spans_[size_t(span)].seq);
  for (const cache::Run &r : plan.write)
    for (int32_t row = r.start; row < r.end(); ++row)
      rows[i++] = table ? table->pool_row(row, store_.page_rows()) : row;
  ggml_tensor *t = input(ctx, GGML_TYPE_I64, plan.n_tokens, 1, std::move(bytes));
  ggml_format_name(t, "kv_rows_s%d_r%d", span, ring_rows);
  indices_.emplace(key, t);
  return t;
}

ggml_tensor *Step::identity_indices(ggml_context *ctx, int32_t n) {
  auto key = std::pair{-1, n};
  if (auto it = indices_.find(key); it != indices_.end()) return it->second;
  std::vector<uint8_t> bytes(size_t(n) * sizeof(int64_t));
  int64_t *rows = reinterpret_cast<int64_t *>(bytes.data());
  for (int32_t i = 0; i < n; ++i) rows[i] = i;
  ggml_tensor *t = input(ctx, GGML_TYPE_I64, n, 1, std::move(bytes));
  ggml_format_name(t, "kv_rows_identity_%d", n);
  indices_.emplace(key, t);
  return t;
}

ggml_tensor *Step::gather_indices(ggml_context *ctx, int32_t span, int32_t first_page,
                                  int32_t end_page, int32_t n_rows, int32_t zero_row) {
  auto key = std::tuple{span, first_page, end_page, n_rows};
  if (auto it = gathers_.find(key); it != gathers_.end()) return it->second;
  const std::vector<int32_t> &pages = span_pages(span);
  const int32_t page_rows = store_.page_rows();
  std::vector<uint8_t> bytes(size_t(n_rows) * sizeof(int32_t));
  int32_t *rows = reinterpret_cast<int32_t *>(bytes.data());
  const int32_t n_own = (end_page - first_page) * page_rows;
  for (int32_t j = 0; j < n_rows; ++j)
    rows[j] = j < n_own ? pages[size_t(first_page + j / page_rows)] * page_rows + j % page_rows
                        : zero_row + (j - n_own) % kDeviceReadRowMultiple;
  ggml_tensor *t = input(ctx, GGML_TYPE_I32, n_rows, 1, std::move(bytes));
  ggml_format_name(t, "kv_gather_s%d", span);
  gathers_.emplace(key, t);
  return t;
}

ggml_tensor *Step::gather_rows(ggml_context *ctx, ggml_tensor *written, ggml_tensor *indices,
                               int32_t dim, int32_t n_kv_heads) {
  // get_rows gives f32 rows; back to the storage type, exactly (f16 and bf16 values are f32
  // values; a q8_0 block's dequantized values quantize to the same block).
  ggml_tensor *g = ggml_get_rows(ctx, written, indices);
  if (written->type != GGML_TYPE_F32)
    g = ggml_cpy(ctx, g, ggml_new_tensor_2d(ctx, written->type, written->ne[0], g->ne[1]));
  return ggml_view_3d(ctx, g, dim, g->ne[1], n_kv_heads, g->nb[1], ggml_row_size(g->type, dim), 0);
}

ggml_tensor *Step::mask(ggml_context *ctx, int32_t span, const StepPlan &plan,
                        const RowLabels &rows) {
  const int32_t window = store_.layout().cache(plan.cache).window();
  auto key = std::tuple{span,           rows.labels ? -1 : rows.ring_rows,
                        window,         rows.ring_rows ? rows.high_water : rows.first_label,
                        rows.first_row, rows.n_rows,
                        rows.tail_rows};
  if (auto it = masks_.find(key); it != masks_.end()) return it->second;
  ggml_tensor *t =
      ggml_new_tensor_2d(ctx, GGML_TYPE_F16, rows.n_rows + rows.tail_rows, plan.n_tokens);
  ggml_set_input(t);
  ggml_format_name(t, "kv_mask_s%d_r%d_w%d", span, rows.ring_rows, window);
  // Filled in set_inputs, straight into the allocated tensor: at depth the mask of a prefill chunk
  // is large ([16,896 x 512] f16 = 17 MB at depth 16K) and a staging copy would double its cost.
  pending_masks_.push_back({t, plan.position, plan.n_tokens, window, rows});
  masks_.emplace(key, t);
  return t;
}

void Step::fill_mask(const PendingMask &pm, ggml_fp16_t *m) {
  // Row j of the rows read holds logical position label(j): first_label + j for rows read in
  // logical order, or, for a ring read in physical order, the slot's position from the
  // high-water mark (rows at or past the queries, and empty slots, are masked). Query i at
  // position p sees label l iff l <= p and, with a window, p - l < w.
  const uint16_t visible = ggml_fp32_to_fp16(0.0f);
  const uint16_t hidden = ggml_fp32_to_fp16(-INFINITY);
  const RowLabels &rows = pm.rows;
  const size_t n = size_t(rows.n_rows); // then tail_rows more: the span's own, at its positions
  const size_t width = n + size_t(rows.tail_rows);
  // Labels come in runs (a page's rows hold consecutive positions; rows not the sequence's are
  // -1): each query row is then a few fills per run, not a test per element (a prefill chunk at
  // depth 32K on a device: 512 x 33K labels, 33 ms element by element).
  struct LabelRun {
    int32_t start, len, first; // first label, or -1 for a run of hidden rows
  };
  std::vector<LabelRun> runs;
  if (rows.labels) {
    const std::vector<int32_t> &lab = *rows.labels;
    for (int32_t j = 0; j < int32_t(n);) {
      int32_t e = j + 1;
      if (lab[size_t(j)] < 0)
        while (e < int32_t(n) && lab[size_t(e)] < 0) ++e;
      else
        while (e < int32_t(n) && lab[size_t(e)] == lab[size_t(e - 1)] + 1) ++e;
      runs.push_back({j, e - j, lab[size_t(j)] < 0 ? -1 : lab[size_t(j)]});
      j = e;
    }
  }
  for (int32_t i = 0; i < pm.n_tokens; ++i) {
    const int32_t p = pm.position + i;
    uint16_t *row = reinterpret_cast<uint16_t *>(m) + size_t(i) * width;
    if (rows.labels) {
      // Visible labels: [p - window + 1, p] (or [0, p]).
      const int64_t lo_label = pm.window ? int64_t(p) - pm.window + 1 : 0;
      for (const LabelRun &r : runs) {
        uint16_t *at = row + r.start;
        if (r.first < 0) {
          std::fill(at, at + r.len, hidden);
          continue;
        }
        const int64_t lo = std::clamp<int64_t>(lo_label - r.first, 0, r.len);
        const int64_t hi = std::clamp<int64_t>(int64_t(p) - r.first + 1, lo, r.len);
        std::fill(at, at + lo, hidden);
        std::fill(at + lo, at + hi, visible);
        std::fill(at + hi, at + r.len, hidden);
      }
      continue;
    }
    if (rows.ring_rows == 0) {
      // Consecutive labels: the visible rows are one run [lo, hi); fill three runs.
      const int64_t first = rows.first_label;
      const int64_t lo =
          std::clamp<int64_t>(pm.window ? p - pm.window + 1 - first : 0, 0, int64_t(n));
      const int64_t hi = std::clamp<int64_t>(int64_t(p) - first + 1, lo, int64_t(n));
      std::fill(row, row + lo, hidden);
      std::fill(row + lo, row + hi, visible);
      std::fill(row + hi, row + n, hidden);
      continue;
    }
    for (size_t j = 0; j < n; ++j) {
      // Slots past the ring's rows: a device's padding (kDeviceReadRowMultiple), never written.
      const int32_t slot = rows.first_row + int32_t(j);
      const int32_t l = slot >= rows.ring_rows
                            ? -1
                            : cache::ring_slot_position(rows.ring_rows, rows.high_water, slot);
      const bool see =
          l >= 0 && l < rows.hide_from && l <= p && (pm.window == 0 || p - l < pm.window);
      row[j] = see ? visible : hidden;
    }
    for (int32_t j = 0; j < rows.tail_rows; ++j) { // label pm.position + j
      const int32_t l = pm.position + j;
      row[n + size_t(j)] = l <= p && (pm.window == 0 || p - l < pm.window) ? visible : hidden;
    }
  }
}

Result<ggml_tensor *> Step::update_and_attend(ggml_context *ctx, ggml_tensor *q, ggml_tensor *k,
                                              ggml_tensor *v, int32_t span, CacheId id,
                                              float scale) {
  if (span < 0 || span >= int32_t(spans_.size()))
    return Status::error("update_and_attend: span " + std::to_string(span) + " was not declared");
  const cache::Layout &layout = store_.layout();
  if (id < 0 || id >= layout.n_caches())
    return Status::error("update_and_attend: cache id " + std::to_string(id) + " does not exist");
  const Span &sp = spans_[size_t(span)];
  const cache::CacheSpec &spec = layout.cache(id).spec;
  const int64_t T = sp.n_tokens;
  if (q->type != GGML_TYPE_F32 || k->type != GGML_TYPE_F32 || v->type != GGML_TYPE_F32)
    return Status::error("update_and_attend: q, k and v must be f32");
  if (k->ne[0] != spec.k_head_dim || k->ne[1] != spec.n_kv_heads || k->ne[2] != T ||
      v->ne[0] != spec.v_head_dim || v->ne[1] != spec.n_kv_heads || v->ne[2] != T ||
      q->ne[0] != spec.k_head_dim || q->ne[2] != T || q->ne[1] % spec.n_kv_heads != 0)
    return Status::error("update_and_attend: cache " + std::to_string(id) + " expects q [" +
                         std::to_string(spec.k_head_dim) + ", k*" +
                         std::to_string(spec.n_kv_heads) + ", " + std::to_string(T) + "], k [" +
                         std::to_string(spec.k_head_dim) + ", " + std::to_string(spec.n_kv_heads) +
                         ", " + std::to_string(T) + "], v [" + std::to_string(spec.v_head_dim) +
                         ", " + std::to_string(spec.n_kv_heads) + ", " + std::to_string(T) +
                         "]; got q " + shape(q) + ", k " + shape(k) + ", v " + shape(v));

  auto key = std::pair{span, id};
  auto found = written_.find(key);
  if (found == written_.end()) {
    const cache::Sequence *seq = store_.sequence(sp.seq);
    if (!seq)
      return Status::error("update_and_attend: sequence " + std::to_string(sp.seq) +
                           " was removed");
    auto plan = seq->plan(id, sp.position, sp.n_tokens);
    if (!plan.ok()) return plan.status();
    ggml_tensor *k_store = store_.k_storage(sp.seq, id);
    ggml_tensor *v_store = store_.v_storage(sp.seq, id);
    GGML_ASSERT(k_store && v_store); // add_span reserved the rows
    const bool host = ggml_backend_buffer_is_host(k_store->buffer);

    ggml_tensor *k_rows = ggml_reshape_2d(ctx, ggml_is_contiguous(k) ? k : ggml_cont(ctx, k),
                                          spec.k_elements_per_token(), T);
    ggml_tensor *v_rows = ggml_reshape_2d(ctx, ggml_is_contiguous(v) ? v : ggml_cont(ctx, v),
                                          spec.v_elements_per_token(), T);
    if (plan->deferred_write) {
      if (!graph_)
        return Status::error("update_and_attend: a step of " + std::to_string(T) +
                             " tokens on ring cache " + std::to_string(id) +
                             " writes after it reads, which needs the graph (Step::set_graph)");
      RowLabels rows;
      Written w;
      attend_before_write(ctx, *plan, k_rows, v_rows, k_store, v_store, host, rows, w);
      // Every read of the ring is in the copies w.k and w.v are (the older rows beside the span's,
      // attend_before_write), which all the layers reading the cache attend: once they are in the
      // graph, the span's rows can go into their slots.
      ggml_build_forward_expand(graph_, w.k);
      ggml_build_forward_expand(graph_, w.v);
      w.mask = mask(ctx, span, *plan, rows);
      found = written_.emplace(key, w).first;
      write_deferred(found->second, ctx, sp, id);
    } else {
      // (a) write the span's rows (both runs of a wrapping ring at once: set_rows takes indices).
      ggml_tensor *write_rows = write_indices(ctx, span, *plan);
      ggml_tensor *k_written = ggml_set_rows(ctx, k_store, k_rows, write_rows);
      ggml_tensor *v_written = ggml_set_rows(ctx, v_store, v_rows, write_rows);
      writes_.push_back(k_written);
      writes_.push_back(v_written);

      // (b) the rows to attend, as views of the written tensors (so attention depends on the
      // writes): a ring's slots in physical order (only those ever written), labelled by position
      // in the mask, with no copy; or, in logical ring order, the read runs oldest first (two runs
      // joined by a copy when the read wraps); a flat cache's read run through its page table
      // (offgraph's kernels), or, for ggml's kernel, the pool rows spanning the run's pages with
      // every row not in the run masked.
      // Outside host memory the rows read are whole rings and whole pages, the mask hiding what is
      // not the sequence's: the views' shapes then stay put from one decode step to the next (for
      // a page's worth of tokens), so the step's graph is the last one again and a device may
      // reuse it (ggml-rpc recomputes its stored copy instead of receiving the graph anew).
      const cache::CacheLayout &cl = layout.cache(id);
      auto rows_view = [&](ggml_tensor *written, ggml_tensor *store, int32_t dim, int32_t first,
                           int32_t n) {
        return ggml_view_3d(ctx, written, dim, n, spec.n_kv_heads, store->nb[1],
                            ggml_row_size(store->type, dim), size_t(first) * store->nb[1]);
      };
      const int64_t group = q->ne[1] / spec.n_kv_heads;
      RowLabels rows;
      Written w;
      if (cl.ring() && store_.ring_order() == RingOrder::Logical) {
        rows.first_label = plan->read_base_pos;
        rows.n_rows = plan->read.total();
        const cache::Run &a = plan->read.run[0];
        w.k = rows_view(k_written, k_store, spec.k_head_dim, a.start, a.len);
        w.v = rows_view(v_written, v_store, spec.v_head_dim, a.start, a.len);
        if (plan->read.count == 2) {
          const cache::Run &b = plan->read.run[1];
          w.k = ggml_concat(ctx, w.k,
                            rows_view(k_written, k_store, spec.k_head_dim, b.start, b.len), 1);
          w.v = ggml_concat(ctx, w.v,
                            rows_view(v_written, v_store, spec.v_head_dim, b.start, b.len), 1);
        }
      } else if (cl.ring()) {
        rows.ring_rows = cl.max_rows;
        rows.high_water = plan->high_water_after;
        // On a device, the whole (padded) ring: the shape stays put from step to step.
        rows.n_rows =
            host ? std::min(cl.max_rows, plan->high_water_after) : int32_t(k_store->ne[1]);
        w.k = rows_view(k_written, k_store, spec.k_head_dim, 0, rows.n_rows);
        w.v = rows_view(v_written, v_store, spec.v_head_dim, 0, rows.n_rows);
      } else {
        const cache::Run &read = plan->read.run[0];
        const std::vector<int32_t> &pages = span_pages(span);
        const int32_t page_rows = store_.page_rows();
        const int32_t first_page = read.start / page_rows;
        const int32_t end_page = cache::PageTable::pages_for(read.end(), page_rows);
        bool consecutive = true;
        for (int32_t i = first_page + 1; i < end_page && consecutive; ++i)
          consecutive = pages[size_t(i)] == pages[size_t(i - 1)] + 1;
        w.kernel = choose_kernel(T, group, spec, host);
        rows.first_label = read.start;
        rows.n_rows = read.len;
        if (!host) {
          // A device reads the sequence's own pages only, from the first its read touches, padded
          // to kDeviceReadRowMultiple rows (masked: their positions are past every query): a view
          // where the pages are consecutive, else a gather of them with the pool's zero rows as
          // the padding. Same rows, same order, same count either way, whatever other sequences'
          // pages lie between: its results depend on the sequence alone.
          const int32_t n_own = (end_page - first_page) * page_rows;
          rows.first_label = first_page * page_rows;
          rows.n_rows = int32_t(GGML_PAD(n_own, kDeviceReadRowMultiple));
          if (consecutive) {
            rows.first_row = pages[size_t(first_page)] * page_rows;
            w.k = rows_view(k_written, k_store, spec.k_head_dim, rows.first_row, rows.n_rows);
            w.v = rows_view(v_written, v_store, spec.v_head_dim, rows.first_row, rows.n_rows);
          } else {
            ggml_tensor *idx = gather_indices(ctx, span, first_page, end_page, rows.n_rows,
                                              int32_t(k_store->ne[1]) - kDeviceReadRowMultiple);
            w.k = gather_rows(ctx, k_written, idx, spec.k_head_dim, spec.n_kv_heads);
            w.v = gather_rows(ctx, v_written, idx, spec.v_head_dim, spec.n_kv_heads);
          }
        } else {
          if (consecutive) { // one run of pool rows: a plain view, as contiguous storage
            rows.first_row = pages[size_t(first_page)] * page_rows + read.start % page_rows;
          } else if (w.kernel != Kernel::Ggml) {
            w.rows = {pages.data(), page_rows, read.start};
          } else { // ggml's kernel on the CPU: the pool rows spanning the pages, the others masked
            int32_t lo = pages[size_t(first_page)], hi = lo;
            for (int32_t i = first_page; i < end_page; ++i)
              lo = std::min(lo, pages[size_t(i)]), hi = std::max(hi, pages[size_t(i)]);
            auto labels =
                std::make_shared<std::vector<int32_t>>(size_t(hi - lo + 1) * page_rows, -1);
            for (int32_t r = read.start; r < read.end(); ++r)
              (*labels)[size_t((pages[size_t(r / page_rows)] - lo) * page_rows + r % page_rows)] =
                  r;
            rows.first_row = lo * page_rows;
            rows.n_rows = int32_t(labels->size());
            rows.labels = std::move(labels);
          }
          w.k = rows_view(k_written, k_store, spec.k_head_dim, rows.first_row, rows.n_rows);
          w.v = rows_view(v_written, v_store, spec.v_head_dim, rows.first_row, rows.n_rows);
        }
      }
      // (c) the mask; a single decode token on a full-attention flat cache sees every row read
      // (unless ggml's kernel reads pool rows that are not the sequence's).
      const bool all_visible = !cl.ring() && spec.attention.window == 0 && T == 1 && !rows.labels &&
                               rows.first_label + rows.n_rows == plan->read.run[0].end();
      w.mask = all_visible ? nullptr : mask(ctx, span, *plan, rows);
      w.mask_labels = rows.labels != nullptr;
      found = written_.emplace(key, w).first;
    }
  }
  Written &w = found->second;
  return attend(ctx, q, w, span, id, scale);
}

Result<ggml_tensor *> Step::attend(ggml_context *ctx, ggml_tensor *q, const Written &w,
                                   int32_t span, CacheId id, float scale) {
  const Span &sp = spans_[size_t(span)];
  const cache::Layout &layout = store_.layout();
  const cache::CacheSpec &spec = layout.cache(id).spec;
  const int64_t T = sp.n_tokens;
  // A shared layer may have another group size, hence another kernel; the views built for the
  // first call suit every kernel except on paged storage, where ggml's reads a masked range.
  const bool host = ggml_backend_buffer_is_host(store_.k_storage(sp.seq, id)->buffer);
  const Kernel kernel = choose_kernel(T, q->ne[1] / spec.n_kv_heads, spec, host);
  if (!layout.cache(id).ring() && (w.rows.pages || w.mask_labels) &&
      (kernel == Kernel::Ggml) != (w.kernel == Kernel::Ggml))
    return Status::error("update_and_attend: cache " + std::to_string(id) +
                         " is read by layers whose query head counts need different kernels");
  switch (kernel) {
  case Kernel::Grouped:
    grouped_params_.push_back({scale, 256, w.rows});
    return grouped_attention(ctx, q, w.k, w.v, w.mask, &grouped_params_.back());
  case Kernel::Tiled:
    tiled_params_.push_back({scale, w.rows});
    return tiled_attention(ctx, q, w.k, w.v, w.mask, &tiled_params_.back());
  case Kernel::Ggml:
    break;
  }
  ggml_tensor *qp = ggml_permute(ctx, q, 0, 2, 1, 3); // [D_k, T, H_q]
  if (!host && w.k->type == GGML_TYPE_F32 && w.v->type == GGML_TYPE_F32) {
    // f32 storage on a device: products and a softmax, not flash attention (ggml-cuda's converts
    // f32 K/V to f16 and rounds Q through it). The products are f32 for spans of up to 3 tokens
    // (ggml-cuda's vector kernels); longer spans get its TF32 tensor-core products, as the
    // model's own f32 weights do (docs/gpu.md): f32 storage is as exact as the device allows.
    ggml_tensor *kq = ggml_mul_mat(ctx, w.k, qp); // [n_kv, T, H_q]
    ggml_prec_set_acc(kq, GGML_PREC_F32);
    kq = ggml_soft_max_ext(ctx, kq, w.mask, scale, 0.0f);
    ggml_tensor *vt = ggml_cont(ctx, ggml_permute(ctx, w.v, 1, 0, 2, 3)); // [n_kv, D_v, H_kv]
    ggml_tensor *kqv = ggml_mul_mat(ctx, vt, kq);                         // [D_v, T, H_q]
    ggml_prec_set_acc(kqv, GGML_PREC_F32);
    ggml_tensor *out = ggml_cont(ctx, ggml_permute(ctx, kqv, 0, 2, 1, 3)); // [D_v, H_q, T]
    ggml_set_name(out, "attention_f32");
    return out;
  }
  ggml_tensor *out = ggml_flash_attn_ext(ctx, qp, w.k, w.v, w.mask, scale, 0.0f, 0.0f);
  return out; // [D_v, H_q, T]
}

void Step::attend_before_write(ggml_context *ctx, const StepPlan &plan, ggml_tensor *k_rows,
                               ggml_tensor *v_rows, ggml_tensor *k_store, ggml_tensor *v_store,
                               bool host, RowLabels &rows, Written &w) {
  const cache::CacheLayout &cl = store_.layout().cache(plan.cache);
  const cache::CacheSpec &spec = cl.spec;
  const int64_t T = plan.n_tokens;
  // The span's rows in the storage type (the bytes the ring will hold: its later reads see what
  // this step's queries saw). Converted by set_rows, as every other write of the cache is: ggml's
  // copy converts f32 to f16 by another routine whose last bits differ (a ring read in logical
  // order then no longer sums exactly what a full cache does). The copy is only the destination:
  // a node computed beside its source, where a bare new tensor would be a leaf that a backend
  // scheduler places by rules of its own. Its conversion (one pass over T rows) is overwritten.
  auto stage = [&](ggml_tensor *rows_f32, ggml_tensor *store) {
    if (store->type == GGML_TYPE_F32) return rows_f32;
    ggml_tensor *room = ggml_cpy(
        ctx, rows_f32, ggml_new_tensor_2d(ctx, store->type, rows_f32->ne[0], rows_f32->ne[1]));
    return ggml_set_rows(ctx, room, rows_f32, identity_indices(ctx, int32_t(T)));
  };
  w.k_staged = stage(k_rows, k_store);
  w.v_staged = stage(v_rows, v_store);
  w.deferred_slots = plan.write;
  auto view = [&](ggml_tensor *t, int32_t dim, int64_t first, int64_t n) {
    return ggml_view_3d(ctx, t, dim, n, spec.n_kv_heads, t->nb[1], ggml_row_size(t->type, dim),
                        size_t(first) * t->nb[1]);
  };
  auto join = [&](ggml_tensor *a, ggml_tensor *b) { return a ? ggml_concat(ctx, a, b, 1) : b; };
  ggml_tensor *k_read = nullptr, *v_read = nullptr;
  if (store_.ring_order() == RingOrder::Logical) {
    // The older rows oldest first, then the span's: consecutive positions from read_base_pos.
    rows.first_label = plan.read_base_pos;
    rows.n_rows = plan.read.total() + int32_t(T);
    for (const cache::Run &r : plan.read) {
      k_read = join(k_read, view(k_store, spec.k_head_dim, r.start, r.len));
      v_read = join(v_read, view(v_store, spec.v_head_dim, r.start, r.len));
    }
  } else {
    // The slots in physical order as labelled before the step (a device reads the whole padded
    // ring), labels at or past the span's position stale; then the span's rows.
    rows.ring_rows = cl.max_rows;
    rows.high_water = plan.high_water_before;
    rows.hide_from = plan.position;
    rows.tail_rows = int32_t(T);
    rows.n_rows = host ? std::min(cl.max_rows, plan.high_water_before) : int32_t(k_store->ne[1]);
    if (rows.n_rows > 0) {
      k_read = view(k_store, spec.k_head_dim, 0, rows.n_rows);
      v_read = view(v_store, spec.v_head_dim, 0, rows.n_rows);
    }
  }
  // A copy of the older rows beside the span's (a few hundred rows per layer and chunk, next to
  // the chunk's products over them), so that every kernel reads one tensor.
  w.k = join(k_read, view(w.k_staged, spec.k_head_dim, 0, T));
  w.v = join(v_read, view(w.v_staged, spec.v_head_dim, 0, T));
}

void Step::write_deferred(const Written &w, ggml_context *ctx, const Span &sp, CacheId id) {
  ggml_tensor *k_store = store_.k_storage(sp.seq, id);
  ggml_tensor *v_store = store_.v_storage(sp.seq, id);
  int64_t from = sp.n_tokens - w.deferred_slots.total(); // the staged row of the first slot
  for (const cache::Run &r : w.deferred_slots) {
    for (auto [staged, store] : {std::pair{w.k_staged, k_store}, std::pair{w.v_staged, v_store}}) {
      ggml_tensor *src = ggml_view_2d(ctx, staged, staged->ne[0], r.len, staged->nb[1],
                                      size_t(from) * staged->nb[1]);
      ggml_tensor *dst = ggml_view_2d(ctx, store, store->ne[0], r.len, store->nb[1],
                                      size_t(r.start) * store->nb[1]);
      ggml_tensor *written = ggml_cpy(ctx, src, dst);
      ggml_build_forward_expand(graph_, written);
      writes_.push_back(written);
    }
    from += r.len;
  }
}

Step::Kernel Step::choose_kernel(int64_t T, int64_t group, const cache::CacheSpec &spec,
                                 bool host) const {
  // The choice depends on shapes and the device only, never on where pages lie: a sequence's
  // results must not depend on what other sequences did to the pool.
  if (!host) return Kernel::Ggml;
  const AttentionKernel kernel = store_.attention_kernel();
  if (kernel != AttentionKernel::Ggml && grouped_attention_applies(T, group))
    return Kernel::Grouped;
  if (kernel == AttentionKernel::Grouped && T > kGroupedAttentionMaxTokens &&
      tiled_attention_applies(group, spec.k_head_dim, spec.v_head_dim, store_.types().k,
                              store_.types().v))
    return Kernel::Tiled;
  return Kernel::Ggml;
}

const std::vector<int32_t> &Step::span_pages(int32_t span) {
  auto it = span_pages_.find(span);
  if (it == span_pages_.end())
    it = span_pages_.emplace(span, store_.page_table(spans_[size_t(span)].seq)->pages).first;
  return it->second;
}

void Step::set_inputs() {
  // An input of nodes the graph left out (a pass that wants no logits skips the last attention)
  // was never allocated.
  for (const Pending &p : pending_)
    if (p.tensor->buffer) ggml_backend_tensor_set(p.tensor, p.bytes.data(), 0, p.bytes.size());
  for (const PendingMask &pm : pending_masks_) {
    if (!pm.tensor->buffer) continue;
    if (ggml_backend_buffer_is_host(pm.tensor->buffer)) {
      fill_mask(pm, static_cast<ggml_fp16_t *>(pm.tensor->data));
      continue;
    }
    std::vector<ggml_fp16_t> staged(size_t(ggml_nelements(pm.tensor)));
    fill_mask(pm, staged.data());
    ggml_backend_tensor_set(pm.tensor, staged.data(), 0, ggml_nbytes(pm.tensor));
  }
}

Status Step::commit() {
  if (committed_) return Status::error("step: already committed");
  for (size_t i = 0; i < spans_.size(); ++i) {
    cache::Sequence *seq = store_.sequence(spans_[i].seq);
    if (!seq) return Status::error("step: sequence " + std::to_string(spans_[i].seq) + " vanished");
    if (Status s = seq->commit(commit_plans_[i]); !s.ok()) return s;
  }
  committed_ = true;
  return ok_status();
}

} // namespace offgraph::kv
