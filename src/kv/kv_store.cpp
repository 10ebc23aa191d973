#include "kv/kv_store.h"

#include "ggml-alloc.h"
#include "ggml-cpu.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <limits>
#include <string>

namespace offgraph::kv {

void add_bytes(BytesByBufferType &to, ggml_backend_buffer_type_t buft, int64_t bytes) {
  for (auto &[b, n] : to)
    if (b == buft) {
      n += bytes;
      return;
    }
  to.emplace_back(buft, bytes);
}

int64_t bytes_on(const BytesByBufferType &by, ggml_backend_buffer_type_t buft) {
  for (const auto &[b, n] : by)
    if (b == buft) return n;
  return 0;
}

void SnapshotTally::add(const Pool &rows, int64_t sign) {
  std::lock_guard lock(mutex);
  for (const Pool::Part &p : rows.parts)
    if (p.buffer) {
      const int64_t bytes = sign * int64_t(ggml_backend_buffer_get_size(p.buffer.get()));
      total += bytes;
      add_bytes(by_buffer_type, p.buft, bytes);
    }
}

namespace {
std::atomic<int64_t> g_device_buffer_frees{0};
} // namespace

int64_t device_buffer_frees() { return g_device_buffer_frees.load(); }

void CountingBufferFree::operator()(ggml_backend_buffer_t buffer) const {
  if (!ggml_backend_buffer_is_host(buffer)) ++g_device_buffer_frees;
  ggml_backend_buffer_free(buffer);
}

Result<AttentionKernel> parse_attention_kernel(std::string_view name) {
  if (name == "grouped") return AttentionKernel::Grouped;
  if (name == "grouped-decode") return AttentionKernel::GroupedDecodeOnly;
  if (name == "ggml") return AttentionKernel::Ggml;
  return Status::error("attention kernel '" + std::string(name) +
                       "': expected grouped, grouped-decode or ggml");
}

using cache::CacheId;
using cache::PageId;
using cache::PageTable;

int64_t Pool::buffer_bytes() const {
  int64_t bytes = 0;
  for (const Part &p : parts)
    if (p.buffer) bytes += int64_t(ggml_backend_buffer_get_size(p.buffer.get()));
  return bytes;
}

namespace {

// A tensor of a pool, made in the part of its buffer type.
struct NewTensor {
  ggml_tensor **slot;
  ggml_backend_buffer_type_t buft;
  ggml_type type;
  int64_t cols, rows;
  std::string name; // empty: unnamed
};

// One context per buffer type holding its tensors (not yet allocated).
Status make_parts(Pool &pool, const std::vector<NewTensor> &tensors) {
  pool.parts.clear();
  for (const NewTensor &t : tensors) {
    auto part = std::find_if(pool.parts.begin(), pool.parts.end(),
                             [&](const Pool::Part &p) { return p.buft == t.buft; });
    if (part == pool.parts.end()) {
      const size_t n = size_t(std::count_if(tensors.begin(), tensors.end(),
                                            [&](const NewTensor &o) { return o.buft == t.buft; }));
      ggml_init_params params = {n * ggml_tensor_overhead(), nullptr, true};
      pool.parts.push_back({t.buft, ggml_context_ptr(ggml_init(params)), nullptr});
      part = pool.parts.end() - 1;
      if (!part->ctx) return Status::error("kv store: could not create a ggml context");
    }
    *t.slot = ggml_new_tensor_2d(part->ctx.get(), t.type, t.cols, t.rows);
    if (!t.name.empty()) ggml_set_name(*t.slot, t.name.c_str());
  }
  return ok_status();
}

int64_t parts_size(const Pool &pool) {
  int64_t bytes = 0;
  for (const Pool::Part &p : pool.parts)
    bytes += int64_t(ggml_backend_alloc_ctx_tensors_from_buft_size(p.ctx.get(), p.buft));
  return bytes;
}

// Allocates every part not yet allocated; `clear`: to zero (cache storage: rows never written
// must hold finite values; attention skips masked rows, but a NaN in one would still poison a
// tiled kernel's sums). False when one could not be allocated.
bool alloc_parts(Pool &pool, bool clear) {
  for (Pool::Part &p : pool.parts) {
    if (p.buffer) continue;
    p.buffer.reset(ggml_backend_alloc_ctx_tensors_from_buft(p.ctx.get(), p.buft));
    if (!p.buffer) return false;
    if (clear) ggml_backend_buffer_clear(p.buffer.get(), 0);
  }
  return true;
}

} // namespace

int64_t Snapshot::bytes() const { return rows_.buffer_bytes(); }

Snapshot::~Snapshot() {
  if (live_bytes_) live_bytes_->add(rows_, -1);
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

void KvStore::Mapping::reset() {
  if (addr) munmap(addr, bytes);
  addr = nullptr, bytes = 0;
}

KvStore::KvStore(std::shared_ptr<const cache::Layout> layout, StorageTypes types,
                 std::vector<ggml_backend_buffer_type_t> bufts, int32_t max_pages)
    : layout_(std::move(layout)), types_(types), bufts_(std::move(bufts)), allocator_(max_pages) {}

KvStore::~KvStore() = default;

Result<std::unique_ptr<KvStore>> KvStore::create(std::shared_ptr<const cache::Layout> layout,
                                                 StorageTypes types,
                                                 ggml_backend_buffer_type_t buft,
                                                 int32_t max_pages) {
  if (!layout) return Status::error("kv store: no layout");
  const int32_t n = layout->n_caches();
  return create(std::move(layout), types, std::vector(size_t(n), buft), max_pages);
}

Result<std::unique_ptr<KvStore>> KvStore::create(std::shared_ptr<const cache::Layout> layout,
                                                 StorageTypes types,
                                                 std::vector<ggml_backend_buffer_type_t> bufts,
                                                 int32_t max_pages) {
  if (!layout) return Status::error("kv store: no layout");
  if (int32_t(bufts.size()) != layout->n_caches())
    return Status::error("kv store: " + std::to_string(bufts.size()) + " buffer types for " +
                         std::to_string(layout->n_caches()) + " caches");
  for (ggml_backend_buffer_type_t b : bufts)
    if (!b) return Status::error("kv store: no backend buffer type");
  if (max_pages < 0) return Status::error("kv store: max_pages must not be negative");
  if (Status s = check_storage_types(*layout, types); !s.ok()) return s;
  int64_t page_bytes = 0;
  std::map<ggml_backend_buffer_type_t, int64_t> device_page_bytes; // flat caches off the CPU
  for (CacheId c = 0; c < layout->n_caches(); ++c)
    if (!layout->cache(c).ring()) {
      const int64_t bytes = int64_t(layout->page_rows()) * int64_t(k_row_bytes(*layout, c, types) +
                                                                   v_row_bytes(*layout, c, types));
      page_bytes += bytes;
      if (is_device_storage(bufts[size_t(c)])) device_page_bytes[bufts[size_t(c)]] += bytes;
    }
  if (max_pages == 0 && page_bytes > 0) {
    const int64_t ram = int64_t(sysconf(_SC_PHYS_PAGES)) * int64_t(sysconf(_SC_PAGESIZE));
    max_pages = int32_t(std::clamp<int64_t>(ram / page_bytes, 1, 1 << 30));
    if (!device_page_bytes.empty())
      max_pages =
          std::min(max_pages, 4 * PageTable::pages_for(layout->capacity(), layout->page_rows()));
  }
  // A device's pool is allocated in full: at most half of what it has free.
  for (const auto &[buft, bytes] : device_page_bytes) {
    size_t free = 0, total = 0;
    if (ggml_backend_dev_t dev = ggml_backend_buft_get_device(buft))
      ggml_backend_dev_memory(dev, &free, &total);
    if (free > 0 && max_pages > 0)
      max_pages = int32_t(std::clamp<int64_t>(int64_t(free / 2) / bytes, 1, max_pages));
  }
  // Pool rows are int32 (ggml row indices, page tables): at most 2^31 - 1 of them.
  max_pages =
      std::min<int64_t>(max_pages, std::numeric_limits<int32_t>::max() / layout->page_rows());
  std::unique_ptr<KvStore> store(
      new KvStore(std::move(layout), types, std::move(bufts), max_pages));
  store->page_bytes_ = page_bytes;
  if (Status s = store->make_page_pool(); !s.ok()) return s;
  return store;
}

Status KvStore::make_page_pool() {
  const int32_t n = layout_->n_caches();
  pages_.k.assign(size_t(n), nullptr);
  pages_.v.assign(size_t(n), nullptr);
  if (page_bytes_ == 0) return ok_status(); // no flat caches
  ggml_backend_buffer_type_t cpu = ggml_backend_cpu_buffer_type();
  for (int32_t max_pages = allocator_.max_pages(); max_pages > 0; max_pages /= 2) {
    const int64_t rows = int64_t(max_pages) * layout_->page_rows();
    std::vector<NewTensor> tensors;
    for (CacheId c = 0; c < n; ++c) {
      if (layout_->cache(c).ring()) continue;
      const cache::CacheSpec &s = layout_->cache(c).spec;
      const std::string i = std::to_string(c);
      // On a device, kDeviceReadRowMultiple zero rows past the pages (never handed out): a
      // read padded past the pool's last page stays inside, and a gather pads with them (Step).
      const int64_t with_slack =
          rows + (is_device_storage(bufts_[size_t(c)]) ? kDeviceReadRowMultiple : 0);
      tensors.push_back({&pages_.k[size_t(c)], bufts_[size_t(c)], types_.k,
                         s.k_elements_per_token(), with_slack, "cache_k_" + i});
      tensors.push_back({&pages_.v[size_t(c)], bufts_[size_t(c)], types_.v,
                         s.v_elements_per_token(), with_slack, "cache_v_" + i});
    }
    if (Status s = make_parts(pages_, tensors); !s.ok()) return s;
    bool ok = true;
    for (Pool::Part &part : pages_.parts) {
      if (part.buft != cpu) continue;
      // Address space only: the OS backs a page of it when first written (anonymous memory reads
      // as zeros, so rows never written are finite, as the tiled kernel's sums need).
      constexpr size_t kAlign = 4096;
      size_t bytes = 0;
      for (ggml_tensor *t = ggml_get_first_tensor(part.ctx.get()); t;
           t = ggml_get_next_tensor(part.ctx.get(), t))
        bytes += GGML_PAD(ggml_nbytes(t), kAlign);
      void *addr = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (addr == MAP_FAILED) {
        ok = false;
        break;
      }
      // In 4 KiB pages even where THP is "always": a huge page would back 2 MiB for a page's
      // first row and keep it after release_free_memory gives a page's memory back.
      (void)madvise(addr, bytes, MADV_NOHUGEPAGE);
      mapping_.addr = addr, mapping_.bytes = bytes;
      part.buffer.reset(ggml_backend_cpu_buffer_from_ptr(addr, bytes));
      size_t at = 0;
      for (ggml_tensor *t = ggml_get_first_tensor(part.ctx.get()); t;
           t = ggml_get_next_tensor(part.ctx.get(), t)) {
        GGML_ASSERT(
            ggml_backend_tensor_alloc(part.buffer.get(), t, static_cast<char *>(addr) + at) ==
            GGML_STATUS_SUCCESS);
        at += GGML_PAD(ggml_nbytes(t), kAlign);
      }
    }
    if (ok && alloc_parts(pages_, true)) { // the devices' parts, in full
      allocator_ = cache::PageAllocator(max_pages);
      return ok_status();
    }
    // Too large for this machine's address space or a device: try half as many pages.
    pages_.parts.clear();
    mapping_.reset();
  }
  return Status::error("kv store: could not reserve a page pool of even one page (" +
                       std::to_string(page_bytes_) + " bytes)");
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

int32_t KvStore::ring_allocated_rows(CacheId c) const {
  // On a device, the ring is padded to the multiple of rows that the device's attention
  // prefers (rows never written: zeros, and masked, Step reads them as empty slots).
  const int32_t n = layout_->cache(c).max_rows;
  return is_device_storage(bufts_[size_t(c)]) ? int32_t(GGML_PAD(n, kDeviceReadRowMultiple)) : n;
}

Status KvStore::out_of_memory(std::string_view site) {
  // A throw before any change (what the store's calls are ordered for: room first, then the
  // changes) leaves the store as it was; the caller fails as for any storage it cannot have.
  return Status::error("kv store: out of memory in " + std::string(site),
                       StatusCode::kResourceExhausted);
}

Status KvStore::check_budget(int64_t more, const char *what) const {
  if (budget_ <= 0 || more <= 0) return ok_status();
  const int64_t in_use = bytes_in_use();
  if (in_use + more <= budget_) return ok_status();
  return Status::error("kv store: " + std::to_string(more) + " more bytes of " + what +
                       " would exceed the memory budget of " + std::to_string(budget_) +
                       " bytes (" + std::to_string(in_use) + " in use)");
}

Result<Pool> KvStore::make_ring_pool() {
  Pool pool;
  pool.k.assign(size_t(layout_->n_caches()), nullptr);
  pool.v.assign(size_t(layout_->n_caches()), nullptr);
  std::vector<NewTensor> tensors;
  for (CacheId c = 0; c < layout_->n_caches(); ++c) {
    if (!layout_->cache(c).ring()) continue;
    const cache::CacheSpec &s = layout_->cache(c).spec;
    const int32_t n = ring_allocated_rows(c);
    const std::string i = std::to_string(c);
    tensors.push_back({&pool.k[size_t(c)], bufts_[size_t(c)], types_.k, s.k_elements_per_token(), n,
                       "cache_k_" + i});
    tensors.push_back({&pool.v[size_t(c)], bufts_[size_t(c)], types_.v, s.v_elements_per_token(), n,
                       "cache_v_" + i});
  }
  if (tensors.empty()) return pool;
  if (Status s = check_budget(ring_pool_bytes(), "ring storage"); !s.ok()) return s;
  if (Status s = make_parts(pool, tensors); !s.ok()) return s;
  if (!alloc_parts(pool, true))
    return Status::error("kv store: could not allocate " + std::to_string(ring_pool_bytes()) +
                             " bytes of ring storage",
                         StatusCode::kInternal);
  return pool;
}

void KvStore::copy_page(PageId from, PageId to, int32_t n) {
  const int32_t p = layout_->page_rows();
  for (CacheId c = 0; c < layout_->n_caches(); ++c) {
    if (!pages_.k[size_t(c)]) continue;
    copy_rows(pages_.k[size_t(c)], from * p, pages_.k[size_t(c)], to * p, n);
    copy_rows(pages_.v[size_t(c)], from * p, pages_.v[size_t(c)], to * p, n);
  }
}

void KvStore::write_back(const Snapshot &snap, Pool &ring) {
  for (size_t i = 0; i < snap.spec_.rows.size(); ++i) {
    const cache::CacheRows &cr = snap.spec_.rows[i];
    int32_t at = 0;
    for (const cache::Run &r : cr.rows) {
      copy_rows(snap.rows_.k[i], at, ring.k[size_t(cr.cache)], r.start, r.len);
      copy_rows(snap.rows_.v[i], at, ring.v[size_t(cr.cache)], r.start, r.len);
      at += r.len;
    }
  }
}

void KvStore::release_pages(Entry &e, size_t keep) {
  while (e.table.pages.size() > keep) {
    count_page(e.table.pages.back(), e.role, -1);
    allocator_.release(e.table.pages.back());
    e.table.pages.pop_back();
  }
}

void KvStore::reserve_page_counts(int32_t pages) {
  if (active_refs_.size() >= size_t(pages)) return;
  // Doubling, and both at once: a throw leaves the counts as they were.
  const size_t n = std::max(size_t(pages), 2 * active_refs_.size());
  std::vector<int32_t> active(n, 0), kept(n, 0);
  std::copy(active_refs_.begin(), active_refs_.end(), active.begin());
  std::copy(kept_refs_.begin(), kept_refs_.end(), kept.begin());
  active_refs_.swap(active), kept_refs_.swap(kept);
}

void KvStore::count_page(PageId page, SeqRole role, int delta) {
  if (role == SeqRole::None) return;
  const size_t p = size_t(page);
  if (p >= active_refs_.size()) reserve_page_counts(int32_t(p) + 1);
  const bool was = kept_refs_[p] > 0 && active_refs_[p] == 0;
  (role == SeqRole::Active ? active_refs_ : kept_refs_)[p] += delta;
  const bool is = kept_refs_[p] > 0 && active_refs_[p] == 0;
  kept_only_pages_ += int32_t(is) - int32_t(was);
}

void KvStore::set_role(SeqId id, SeqRole role) {
  Entry *e = find(id);
  if (!e || e->role == role) return;
  reserve_page_counts(allocator_.touched()); // may throw, before any change
  for (PageId p : e->table.pages) count_page(p, e->role, -1);
  e->role = role;
  for (PageId p : e->table.pages) count_page(p, role, +1);
}

Result<SeqId> KvStore::insert(Entry entry) {
  // The pages the entry holds (child_of retained them) go back if it cannot be kept.
  std::unique_ptr<Entry> held;
  try {
    held = std::make_unique<Entry>(std::move(entry));
  } catch (const std::bad_alloc &) {
    release_pages(entry, 0);
    throw;
  }
  SeqId id = 0;
  while (entries_.count(id)) ++id;
  try {
    entries_.emplace(id, std::move(held));
  } catch (const std::bad_alloc &) {
    release_pages(*held, 0);
    throw;
  }
  return id;
}

Result<SeqId> KvStore::create_sequence() try {
  if (Status f = injected_fault("create_sequence", -1); !f.ok()) return f;
  Entry e(layout_);
  auto ring = make_ring_pool();
  if (!ring.ok()) return ring.status();
  e.ring = std::move(ring).value();
  return insert(std::move(e));
} catch (const std::bad_alloc &) {
  return out_of_memory("create_sequence");
}

Status KvStore::remove_sequence(SeqId id) {
  Entry *e = find(id);
  if (!e) return Status::error(unknown(id));
  release_pages(*e, 0);
  entries_.erase(id);
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

Status KvStore::reserve(SeqId id, int32_t end) try {
  if (Status s = injected_fault("reserve", id); !s.ok()) return s;
  Entry *e = find(id);
  if (!e) return Status::error(unknown(id));
  if (end > layout_->capacity())
    return Status::error("kv store: " + std::to_string(end) + " positions exceed the capacity " +
                         std::to_string(layout_->capacity()));
  if (page_bytes_ == 0) return ok_status();
  const int32_t p = layout_->page_rows(), length = e->seq.length();
  std::vector<PageId> &pages = e->table.pages;
  // Held pages from the one the first write lands in are written; shared ones are copied first.
  const size_t first = size_t(length / p), need = size_t(PageTable::pages_for(end, p));
  int32_t fresh = int32_t(need > pages.size() ? need - pages.size() : 0);
  for (size_t i = first; i < std::min(need, pages.size()); ++i)
    fresh += allocator_.refs(pages[i]) > 1;
  if (fresh == 0) return ok_status();
  if (Status s = check_budget(int64_t(fresh) * page_bytes_, "flat pages"); !s.ok()) return s;
  if (allocator_.in_use() + fresh > allocator_.max_pages())
    return Status::error(
        "kv store: the page pool is exhausted (" + std::to_string(allocator_.in_use()) + " of " +
        std::to_string(allocator_.max_pages()) + " pages of " + std::to_string(page_bytes_) +
        " bytes in use; " + std::to_string(fresh) + " more needed)");
  // Room first (what can throw std::bad_alloc), then the changes, which allocate nothing.
  allocator_.reserve(fresh);
  if (pages.capacity() < need) pages.reserve(std::max(need, 2 * pages.capacity())); // doubling
  reserve_page_counts(allocator_.touched() + fresh);
  for (size_t i = first; i < std::min(need, pages.size()); ++i) {
    if (allocator_.refs(pages[i]) < 2) continue;
    const PageId copy = *allocator_.allocate();
    copy_page(pages[i], copy, std::clamp<int32_t>(length - int32_t(i) * p, 0, p)); // live rows
    count_page(pages[i], e->role, -1);
    allocator_.release(pages[i]);
    pages[i] = copy;
    count_page(copy, e->role, +1);
  }
  while (pages.size() < need) {
    pages.push_back(*allocator_.allocate());
    count_page(pages.back(), e->role, +1);
  }
  return ok_status();
} catch (const std::bad_alloc &) {
  return out_of_memory("reserve");
}

Status KvStore::rewind(SeqId id, int32_t length) {
  Entry *e = find(id);
  if (!e) return Status::error(unknown(id));
  if (Status s = e->seq.rewind(length); !s.ok()) return s;
  release_pages(*e, size_t(PageTable::pages_for(length, layout_->page_rows())));
  return ok_status();
}

Result<KvStore::Entry> KvStore::child_of(const Entry &src, const cache::ForkPlan &plan) {
  Entry child(layout_);
  child.seq = src.seq.forked(plan);
  auto ring = make_ring_pool();
  if (!ring.ok()) return ring.status();
  child.ring = std::move(ring).value();
  const size_t shared =
      page_bytes_ > 0 ? size_t(PageTable::pages_for(plan.length, layout_->page_rows())) : 0;
  child.table.pages.reserve(shared); // the retains below then cannot be left half done
  for (size_t i = 0; i < shared; ++i) {
    allocator_.retain(src.table.pages[i]);
    child.table.pages.push_back(src.table.pages[i]);
  }
  return child;
}

Result<SeqId> KvStore::fork(SeqId src, int32_t n) try {
  if (Status f = injected_fault("fork", src); !f.ok()) return f;
  Entry *s = find(src);
  if (!s) return Status::error(unknown(src));
  auto plan = s->seq.plan_fork(n);
  if (!plan.ok()) return plan.status();
  auto child = child_of(*s, *plan);
  if (!child.ok()) return child.status();
  // Flat caches share the prefix's pages (child_of); rings get the rows the plan lists.
  try {
    for (const cache::CacheRows &cr : plan->copies) {
      if (!layout_->cache(cr.cache).ring()) continue;
      const size_t c = size_t(cr.cache);
      for (const cache::Run &r : cr.rows) {
        copy_rows(s->ring.k[c], r.start, child->ring.k[c], r.start, r.len);
        copy_rows(s->ring.v[c], r.start, child->ring.v[c], r.start, r.len);
      }
    }
  } catch (const std::bad_alloc &) { // a backend's copy (ggml-rpc's messages)
    release_pages(*child, 0);
    throw;
  }
  return insert(std::move(child).value());
} catch (const std::bad_alloc &) {
  return out_of_memory("fork");
}

Result<SeqId> KvStore::fork_at_snapshot(SeqId pages_from, const Snapshot &snap, int32_t at) try {
  if (Status f = injected_fault("fork_at_snapshot", pages_from); !f.ok()) return f;
  Entry *s = find(pages_from);
  if (!s) return Status::error(unknown(pages_from));
  const int32_t n = at < 0 ? snap.length() : at;
  if (!snap.spec().resumes_at(n))
    return Status::error("kv store: a snapshot at " + std::to_string(snap.length()) +
                         " reaches back only to " + std::to_string(snap.length() - snap.reach()) +
                         ", not " + std::to_string(n));
  if (n > s->seq.length())
    return Status::error("kv store: a snapshot at " + std::to_string(n) +
                         " needs the pages of as many positions; sequence " +
                         std::to_string(pages_from) + " holds " + std::to_string(s->seq.length()));
  auto child = child_of(*s, cache::ForkPlan{n, {}});
  if (!child.ok()) return child.status();
  // Every saved row goes back at its slot. The child's high-water mark n + lead labels the
  // slots of positions >= n, and of those older than the window before n, as positions >= n:
  // masked until rewritten, as in Sequence::restore.
  try {
    write_back(snap, child->ring);
  } catch (const std::bad_alloc &) {
    release_pages(*child, 0);
    throw;
  }
  return insert(std::move(child).value());
} catch (const std::bad_alloc &) {
  return out_of_memory("fork_at_snapshot");
}

Result<std::unique_ptr<Snapshot>> KvStore::snapshot(SeqId id, int32_t reach) try {
  Entry *e = find(id);
  if (!e) return Status::error(unknown(id));
  if (Status f = injected_fault("snapshot", id); !f.ok()) return f;
  auto snap = std::make_unique<Snapshot>();
  snap->spec_ = e->seq.describe_snapshot(reach);
  const size_t n = snap->spec_.rows.size();
  snap->rows_.k.assign(n, nullptr);
  snap->rows_.v.assign(n, nullptr);
  if (n == 0) return snap;
  std::vector<NewTensor> tensors; // beside the rings they save (on their device)
  for (size_t i = 0; i < n; ++i) {
    const cache::CacheRows &cr = snap->spec_.rows[i];
    const cache::CacheSpec &s = layout_->cache(cr.cache).spec;
    ggml_backend_buffer_type_t buft = bufts_[size_t(cr.cache)];
    tensors.push_back(
        {&snap->rows_.k[i], buft, types_.k, s.k_elements_per_token(), cr.rows.total(), ""});
    tensors.push_back(
        {&snap->rows_.v[i], buft, types_.v, s.v_elements_per_token(), cr.rows.total(), ""});
  }
  if (Status s = make_parts(snap->rows_, tensors); !s.ok()) return s;
  if (Status s = check_budget(parts_size(snap->rows_), "ring snapshot"); !s.ok()) return s;
  if (!alloc_parts(snap->rows_, false)) // every row is copied in below
    return Status::error("kv store: could not allocate a ring snapshot", StatusCode::kInternal);
  snap->live_bytes_ = snapshot_bytes_;
  snapshot_bytes_->add(snap->rows_, +1);
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
} catch (const std::bad_alloc &) {
  return out_of_memory("snapshot");
}

Status KvStore::restore(SeqId id, const Snapshot &snap, int32_t at) {
  Entry *e = find(id);
  if (!e) return Status::error(unknown(id));
  cache::Sequence probe = e->seq; // validate on a copy: nothing changes unless all succeeds
  if (Status s = probe.restore(snap.spec_, at); !s.ok()) return s;
  write_back(snap, e->ring);
  e->seq = std::move(probe);
  release_pages(*e, size_t(PageTable::pages_for(e->seq.length(), layout_->page_rows())));
  return ok_status();
}

ggml_tensor *KvStore::k_storage(SeqId id, CacheId c) const {
  const Entry *e = find(id);
  return e ? (layout_->cache(c).ring() ? e->ring : pages_).k[size_t(c)] : nullptr;
}
ggml_tensor *KvStore::v_storage(SeqId id, CacheId c) const {
  const Entry *e = find(id);
  return e ? (layout_->cache(c).ring() ? e->ring : pages_).v[size_t(c)] : nullptr;
}
int32_t KvStore::storage_rows(SeqId id, CacheId c) const {
  const Entry *e = find(id);
  if (!e) return 0;
  if (layout_->cache(c).ring()) return layout_->cache(c).max_rows;
  return int32_t(e->table.pages.size()) * layout_->page_rows();
}

const PageTable *KvStore::page_table(SeqId id) const {
  const Entry *e = find(id);
  return e ? &e->table : nullptr;
}

} // namespace offgraph::kv
