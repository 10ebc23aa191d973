#include "kv/kv_store.h"

#include "ggml-alloc.h"

#include <algorithm>

namespace offgraph::kv {

Result<AttentionKernel> parse_attention_kernel(std::string_view name) {
  if (name == "grouped") return AttentionKernel::Grouped;
  if (name == "grouped-decode") return AttentionKernel::GroupedDecodeOnly;
  if (name == "ggml") return AttentionKernel::Ggml;
  return Status::error("attention kernel '" + std::string(name) +
                       "': expected grouped, grouped-decode or ggml");
}

using cache::CacheId;

MemoryUse &MemoryUse::operator+=(const MemoryUse &o) {
  held += o.held;
  minimum += o.minimum;
  buffers += o.buffers;
  flat += o.flat;
  ring += o.ring;
  k += o.k;
  v += o.v;
  return *this;
}

int64_t Pool::buffer_bytes() const {
  return buffer ? int64_t(ggml_backend_buffer_get_size(buffer.get())) : 0;
}

int64_t Snapshot::bytes() const { return rows_.buffer_bytes(); }

Snapshot::~Snapshot() {
  if (live_bytes_) *live_bytes_ -= bytes();
}

void copy_rows(ggml_tensor *src, int32_t src_row, ggml_tensor *dst, int32_t dst_row, int32_t n) {
  GGML_ASSERT(src->type == dst->type && src->ne[0] == dst->ne[0] && n >= 0);
  GGML_ASSERT(src_row + n <= src->ne[1] && dst_row + n <= dst->ne[1]);
  if (n == 0) return;
  // Views of the two row ranges, bound to their buffers, copied by the backend (a memcpy on the
  // CPU, a device copy elsewhere).
  ggml_init_params params = {2 * ggml_tensor_overhead(), nullptr, true};
  ggml_context_ptr ctx(ggml_init(params));
  ggml_tensor *from =
      ggml_view_2d(ctx.get(), src, src->ne[0], n, src->nb[1], size_t(src_row) * src->nb[1]);
  ggml_tensor *to =
      ggml_view_2d(ctx.get(), dst, dst->ne[0], n, dst->nb[1], size_t(dst_row) * dst->nb[1]);
  GGML_ASSERT(ggml_backend_view_init(from) == GGML_STATUS_SUCCESS);
  GGML_ASSERT(ggml_backend_view_init(to) == GGML_STATUS_SUCCESS);
  ggml_backend_tensor_copy(from, to);
}

KvStore::KvStore(std::shared_ptr<const cache::Layout> layout, StorageTypes types,
                 ggml_backend_buffer_type_t buft)
    : layout_(std::move(layout)), types_(types), buft_(buft) {}

Result<std::unique_ptr<KvStore>> KvStore::create(std::shared_ptr<const cache::Layout> layout,
                                                 StorageTypes types,
                                                 ggml_backend_buffer_type_t buft) {
  if (!layout) return Status::error("kv store: no layout");
  if (!buft) return Status::error("kv store: no backend buffer type");
  if (Status s = check_storage_types(*layout, types); !s.ok()) return s;
  return std::unique_ptr<KvStore>(new KvStore(std::move(layout), types, buft));
}

Status KvStore::set_ring_order(RingOrder order) {
  if (order == RingOrder::Logical)
    for (ggml_type t : {types_.k, types_.v})
      if (t != GGML_TYPE_F32 && t != GGML_TYPE_F16 && t != GGML_TYPE_BF16)
        return Status::error(
            std::string("kv store: logical ring order needs f32, f16 or bf16 storage, not ") +
            ggml_type_name(t));
  ring_order_ = order;
  return ok_status();
}

int32_t KvStore::pool_rows(CacheId c, bool ring, int32_t flat_rows) const {
  return ring ? layout_->cache(c).max_rows : flat_rows;
}

int64_t KvStore::pool_bytes(bool ring, int32_t flat_rows) const {
  int64_t bytes = 0;
  for (CacheId c = 0; c < layout_->n_caches(); ++c)
    if (layout_->cache(c).ring() == ring)
      bytes += int64_t(pool_rows(c, ring, flat_rows)) *
               int64_t(k_row_bytes(*layout_, c, types_) + v_row_bytes(*layout_, c, types_));
  return bytes;
}

Result<Pool> KvStore::make_pool(bool ring, int32_t rows, int64_t extra_bytes_in_use) {
  Pool pool;
  pool.rows = ring ? 0 : rows;
  pool.k.assign(size_t(layout_->n_caches()), nullptr);
  pool.v.assign(size_t(layout_->n_caches()), nullptr);
  int n_tensors = 0;
  for (CacheId c = 0; c < layout_->n_caches(); ++c)
    n_tensors += 2 * (layout_->cache(c).ring() == ring);
  if ((!ring && rows == 0) || n_tensors == 0) return pool;

  const int64_t need = pool_bytes(ring, rows);
  if (budget_ > 0 && memory().buffers + memory().snapshots + extra_bytes_in_use + need > budget_)
    return Status::error("kv store: " + std::to_string(need) + " more bytes of " +
                         (ring ? "ring" : "flat") + " storage would exceed the memory budget of " +
                         std::to_string(budget_) + " bytes (" + std::to_string(memory().buffers) +
                         " in use)");
  ggml_init_params params = {size_t(n_tensors) * ggml_tensor_overhead(), nullptr, true};
  pool.ctx.reset(ggml_init(params));
  if (!pool.ctx) return Status::error("kv store: could not create a ggml context");
  for (CacheId c = 0; c < layout_->n_caches(); ++c) {
    if (layout_->cache(c).ring() != ring) continue;
    const cache::CacheSpec &s = layout_->cache(c).spec;
    const int32_t n = pool_rows(c, ring, rows);
    pool.k[size_t(c)] = ggml_new_tensor_2d(pool.ctx.get(), types_.k, s.k_elements_per_token(), n);
    pool.v[size_t(c)] = ggml_new_tensor_2d(pool.ctx.get(), types_.v, s.v_elements_per_token(), n);
    ggml_format_name(pool.k[size_t(c)], "cache_k_%d", c);
    ggml_format_name(pool.v[size_t(c)], "cache_v_%d", c);
  }
  pool.buffer.reset(ggml_backend_alloc_ctx_tensors_from_buft(pool.ctx.get(), buft_));
  if (!pool.buffer)
    return Status::error("kv store: could not allocate " + std::to_string(need) + " bytes of " +
                         (ring ? "ring" : "flat") + " storage");
  // Rows never written must hold finite values: attention skips masked rows, but a NaN in one
  // would still poison a tiled kernel's sums.
  ggml_backend_buffer_clear(pool.buffer.get(), 0);
  return pool;
}

Result<SeqId> KvStore::insert(Entry entry) {
  SeqId id = 0;
  while (entries_.count(id)) ++id;
  entries_.emplace(id, std::make_unique<Entry>(std::move(entry)));
  return id;
}

Result<SeqId> KvStore::create_sequence() {
  Entry e(layout_);
  auto ring = make_pool(true, 0, 0);
  if (!ring.ok()) return ring.status();
  auto flat = make_pool(false, flat_initial_rows(), ring->buffer_bytes());
  if (!flat.ok()) return flat.status();
  e.ring = std::move(ring).value();
  e.flat = std::move(flat).value();
  return insert(std::move(e));
}

Status KvStore::remove_sequence(SeqId id) {
  if (!entries_.erase(id)) return Status::error(unknown(id));
  return ok_status();
}

std::vector<SeqId> KvStore::sequence_ids() const {
  std::vector<SeqId> ids;
  for (const auto &[id, e] : entries_) ids.push_back(id);
  return ids;
}

const KvStore::Entry *KvStore::find(SeqId id) const {
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : it->second.get();
}
KvStore::Entry *KvStore::find(SeqId id) {
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : it->second.get();
}

std::string KvStore::unknown(SeqId id) const {
  return "kv store: no sequence " + std::to_string(id) + " (" + std::to_string(entries_.size()) +
         " live)";
}

cache::Sequence *KvStore::sequence(SeqId id) {
  Entry *e = find(id);
  return e ? &e->seq : nullptr;
}
const cache::Sequence *KvStore::sequence(SeqId id) const {
  const Entry *e = find(id);
  return e ? &e->seq : nullptr;
}

Status KvStore::reserve(SeqId id, int32_t end) {
  Entry *e = find(id);
  if (!e) return Status::error(unknown(id));
  if (end > layout_->capacity())
    return Status::error("kv store: " + std::to_string(end) + " positions exceed the capacity " +
                         std::to_string(layout_->capacity()));
  const int32_t rows = layout_->grown_rows(e->flat.rows, end);
  if (rows == e->flat.rows) return ok_status();
  auto grown = make_pool(false, rows, 0);
  if (!grown.ok()) return grown.status();
  // Rows at or above the length hold nothing anyone will read again, so only the live prefix
  // moves. Flat rows are indexed by position: growth is append-only.
  const int32_t live = std::min(e->seq.length(), e->flat.rows);
  for (CacheId c = 0; c < layout_->n_caches(); ++c) {
    if (!e->flat.k[size_t(c)]) continue;
    copy_rows(e->flat.k[size_t(c)], 0, grown->k[size_t(c)], 0, live);
    copy_rows(e->flat.v[size_t(c)], 0, grown->v[size_t(c)], 0, live);
  }
  e->flat = std::move(grown).value(); // the old buffer is freed only now, after every copy
  return ok_status();
}

Result<SeqId> KvStore::fork(SeqId src, int32_t n) {
  Entry *s = find(src);
  if (!s) return Status::error(unknown(src));
  auto plan = s->seq.plan_fork(n);
  if (!plan.ok()) return plan.status();
  Entry child(layout_);
  child.seq = s->seq.forked(*plan);
  auto ring = make_pool(true, 0, 0);
  if (!ring.ok()) return ring.status();
  auto flat = make_pool(false, layout_->grown_rows(flat_initial_rows(), n), ring->buffer_bytes());
  if (!flat.ok()) return flat.status();
  child.ring = std::move(ring).value();
  child.flat = std::move(flat).value();
  for (const cache::CacheRows &cr : plan->copies) {
    const size_t c = size_t(cr.cache);
    Pool &from = layout_->cache(cr.cache).ring() ? s->ring : s->flat;
    Pool &to = layout_->cache(cr.cache).ring() ? child.ring : child.flat;
    for (const cache::Run &r : cr.rows) {
      copy_rows(from.k[c], r.start, to.k[c], r.start, r.len);
      copy_rows(from.v[c], r.start, to.v[c], r.start, r.len);
    }
  }
  return insert(std::move(child));
}

Result<std::unique_ptr<Snapshot>> KvStore::snapshot(SeqId id) {
  Entry *e = find(id);
  if (!e) return Status::error(unknown(id));
  auto snap = std::make_unique<Snapshot>();
  snap->spec_ = e->seq.describe_snapshot();
  const size_t n = snap->spec_.rows.size();
  snap->rows_.k.assign(n, nullptr);
  snap->rows_.v.assign(n, nullptr);
  if (n == 0) return snap;
  ggml_init_params params = {2 * n * ggml_tensor_overhead(), nullptr, true};
  snap->rows_.ctx.reset(ggml_init(params));
  if (!snap->rows_.ctx)
    return Status::error("kv store: could not create a ggml context for a snapshot");
  for (size_t i = 0; i < n; ++i) {
    const cache::CacheRows &cr = snap->spec_.rows[i];
    const cache::CacheSpec &s = layout_->cache(cr.cache).spec;
    snap->rows_.k[i] = ggml_new_tensor_2d(snap->rows_.ctx.get(), types_.k, s.k_elements_per_token(),
                                          cr.rows.total());
    snap->rows_.v[i] = ggml_new_tensor_2d(snap->rows_.ctx.get(), types_.v, s.v_elements_per_token(),
                                          cr.rows.total());
  }
  const int64_t need =
      int64_t(ggml_backend_alloc_ctx_tensors_from_buft_size(snap->rows_.ctx.get(), buft_));
  if (budget_ > 0 && memory().buffers + memory().snapshots + need > budget_)
    return Status::error("kv store: a snapshot of " + std::to_string(need) +
                         " bytes would exceed the memory budget of " + std::to_string(budget_) +
                         " bytes");
  snap->rows_.buffer.reset(ggml_backend_alloc_ctx_tensors_from_buft(snap->rows_.ctx.get(), buft_));
  if (!snap->rows_.buffer) return Status::error("kv store: could not allocate a ring snapshot");
  snap->live_bytes_ = snapshot_bytes_;
  *snapshot_bytes_ += snap->bytes();
  for (size_t i = 0; i < n; ++i) {
    const cache::CacheRows &cr = snap->spec_.rows[i];
    int32_t at = 0;
    for (const cache::Run &r : cr.rows) {
      copy_rows(e->ring.k[size_t(cr.cache)], r.start, snap->rows_.k[i], at, r.len);
      copy_rows(e->ring.v[size_t(cr.cache)], r.start, snap->rows_.v[i], at, r.len);
      at += r.len;
    }
  }
  return snap;
}

Status KvStore::restore(SeqId id, const Snapshot &snap) {
  Entry *e = find(id);
  if (!e) return Status::error(unknown(id));
  cache::Sequence probe = e->seq; // validate on a copy: nothing changes unless all succeeds
  if (Status s = probe.restore(snap.spec_); !s.ok()) return s;
  for (size_t i = 0; i < snap.spec_.rows.size(); ++i) {
    const cache::CacheRows &cr = snap.spec_.rows[i];
    int32_t at = 0;
    for (const cache::Run &r : cr.rows) {
      copy_rows(snap.rows_.k[i], at, e->ring.k[size_t(cr.cache)], r.start, r.len);
      copy_rows(snap.rows_.v[i], at, e->ring.v[size_t(cr.cache)], r.start, r.len);
      at += r.len;
    }
  }
  e->seq = std::move(probe);
  return ok_status();
}

MemoryUse KvStore::memory(SeqId id) const {
  MemoryUse m;
  const Entry *e = find(id);
  if (!e) return m;
  for (CacheId c = 0; c < layout_->n_caches(); ++c) {
    const bool ring = layout_->cache(c).ring();
    const int64_t rows = storage_rows(id, c);
    const int64_t kb = int64_t(k_row_bytes(*layout_, c, types_));
    const int64_t vb = int64_t(v_row_bytes(*layout_, c, types_));
    m.k += rows * kb;
    m.v += rows * vb;
    (ring ? m.ring : m.flat) += rows * (kb + vb);
    m.minimum += layout_->min_rows(c, e->seq.length()) * (kb + vb);
  }
  m.held = m.k + m.v;
  m.buffers = e->flat.buffer_bytes() + e->ring.buffer_bytes();
  return m;
}

MemoryUse KvStore::memory() const {
  MemoryUse m;
  for (const auto &[id, e] : entries_) m += memory(id);
  m.snapshots = *snapshot_bytes_;
  return m;
}

ggml_tensor *KvStore::k_storage(SeqId id, CacheId c) const {
  const Entry *e = find(id);
  return e ? (layout_->cache(c).ring() ? e->ring : e->flat).k[size_t(c)] : nullptr;
}
ggml_tensor *KvStore::v_storage(SeqId id, CacheId c) const {
  const Entry *e = find(id);
  return e ? (layout_->cache(c).ring() ? e->ring : e->flat).v[size_t(c)] : nullptr;
}
int32_t KvStore::storage_rows(SeqId id, CacheId c) const {
  const ggml_tensor *k = k_storage(id, c);
  return k ? int32_t(k->ne[1]) : 0;
}

int64_t KvStore::peak_bytes_at_length(int32_t length) const {
  const int32_t initial = flat_initial_rows();
  const int32_t rows = layout_->grown_rows(initial, std::min(length, layout_->capacity()));
  const int32_t before = rows > initial ? std::max(initial, rows / 2) : 0;
  return pool_bytes(true, 0) + pool_bytes(false, rows) + (before ? pool_bytes(false, before) : 0);
}

int32_t KvStore::flat_initial_rows() const {
  return std::min(layout_->policy().initial_rows, layout_->capacity());
}

} // namespace offgraph::kv
