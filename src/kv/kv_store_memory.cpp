// KvStore's memory: what it holds (in all, per sequence, by device), the most a sequence can
// hold, and free pages given back to the OS (docs/kv-paging.md).
#include "kv/kv_store.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <limits>

namespace offgraph::kv {

using cache::CacheId;
using cache::PageId;
using cache::PageTable;

int64_t KvStore::ring_pool_bytes() const {
  int64_t bytes = 0;
  for (CacheId c = 0; c < layout_->n_caches(); ++c)
    if (layout_->cache(c).ring())
      bytes += int64_t(ring_allocated_rows(c)) *
               int64_t(k_row_bytes(*layout_, c, types_) + v_row_bytes(*layout_, c, types_));
  return bytes;
}

int64_t KvStore::bytes_in_use() const {
  int64_t bytes = int64_t(allocator_.in_use()) * page_bytes_ + snapshot_bytes_->total;
  for (const auto &[id, e] : entries_) bytes += e->ring.buffer_bytes();
  return bytes;
}

BytesByBufferType KvStore::bytes_in_use_by_buffer_type() const {
  BytesByBufferType by;
  const int64_t pages = int64_t(allocator_.in_use()) * layout_->page_rows();
  for (CacheId c = 0; c < layout_->n_caches(); ++c)
    if (!layout_->cache(c).ring())
      add_bytes(by, bufts_[size_t(c)],
                pages *
                    int64_t(k_row_bytes(*layout_, c, types_) + v_row_bytes(*layout_, c, types_)));
  for (const auto &[id, e] : entries_)
    for (const Pool::Part &p : e->ring.parts)
      if (p.buffer) add_bytes(by, p.buft, int64_t(ggml_backend_buffer_get_size(p.buffer.get())));
  std::lock_guard lock(snapshot_bytes_->mutex);
  for (const auto &[buft, bytes] : snapshot_bytes_->by_buffer_type) add_bytes(by, buft, bytes);
  return by;
}

int64_t KvStore::release_free_memory(int64_t keep_bytes) {
  if (!mapping_.addr || page_bytes_ <= 0) return 0;
  const int64_t keep = std::min<int64_t>(std::max<int64_t>(keep_bytes, 0) / page_bytes_,
                                         std::numeric_limits<int32_t>::max());
  std::vector<PageId> cold = allocator_.take_cold(int32_t(keep));
  if (cold.empty()) return 0;
  // Consecutive pages are consecutive rows of each tensor: one call a run, not one a page.
  std::sort(cold.begin(), cold.end());
  const uintptr_t os_page = uintptr_t(sysconf(_SC_PAGESIZE));
  const auto *lo = static_cast<const char *>(mapping_.addr);
  const char *hi = lo + mapping_.bytes;
  const int64_t rows = layout_->page_rows();
  int64_t given = 0;
  for (size_t i = 0; i < cold.size();) {
    size_t j = i + 1;
    while (j < cold.size() && cold[j] == cold[j - 1] + 1) ++j;
    const int64_t first_page = cold[i], n_pages = int64_t(j - i);
    for (CacheId c = 0; c < layout_->n_caches(); ++c)
      for (ggml_tensor *t : {pages_.k[size_t(c)], pages_.v[size_t(c)]}) {
        if (!t || static_cast<const char *>(t->data) < lo ||
            static_cast<const char *>(t->data) >= hi)
          continue; // a flat cache on a device, or a ring
        const uintptr_t begin = uintptr_t(t->data) + uintptr_t(first_page * rows) * t->nb[1];
        const uintptr_t end = begin + uintptr_t(n_pages * rows) * t->nb[1];
        const uintptr_t first = (begin + os_page - 1) / os_page * os_page,
                        last = end / os_page * os_page;
        if (first >= last) continue;
        // Reads as zeros afterwards (anonymous memory), as the pool's rows never written do.
        if (madvise(reinterpret_cast<void *>(first), last - first, MADV_DONTNEED) == 0)
          given += int64_t(last - first);
      }
    i = j;
  }
  return given;
}

int64_t KvStore::resident_pool_bytes() const {
  if (!mapping_.addr) return 0;
  const size_t os_page = size_t(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in((mapping_.bytes + os_page - 1) / os_page);
  if (mincore(mapping_.addr, mapping_.bytes, in.data()) != 0) return -1;
  int64_t n = 0;
  for (unsigned char b : in) n += b & 1;
  return n * int64_t(os_page);
}

int64_t KvStore::ring_bytes(SeqId id) const {
  if (!find(id)) return 0;
  int64_t bytes = 0; // as memory(id).ring counts them
  for (CacheId c = 0; c < layout_->n_caches(); ++c)
    if (layout_->cache(c).ring())
      bytes += int64_t(storage_rows(id, c)) *
               int64_t(k_row_bytes(*layout_, c, types_) + v_row_bytes(*layout_, c, types_));
  return bytes;
}

MemoryUse KvStore::memory(SeqId id) const {
  MemoryUse m;
  const Entry *e = find(id);
  if (!e) return m;
  for (CacheId c = 0; c < layout_->n_caches(); ++c) {
    const int64_t rows = storage_rows(id, c);
    const int64_t kb = int64_t(k_row_bytes(*layout_, c, types_));
    const int64_t vb = int64_t(v_row_bytes(*layout_, c, types_));
    m.k += rows * kb;
    m.v += rows * vb;
    (layout_->cache(c).ring() ? m.ring : m.flat) += rows * (kb + vb);
    m.minimum += layout_->min_rows(c, e->seq.length()) * (kb + vb);
  }
  m.held = m.k + m.v;
  m.pages = int64_t(e->table.pages.size());
  for (PageId page : e->table.pages) m.shared_pages += allocator_.refs(page) > 1;
  m.buffers = e->ring.buffer_bytes() + m.pages * page_bytes_;
  return m;
}

MemoryUse KvStore::memory() const {
  MemoryUse m;
  const int32_t p = layout_->page_rows();
  int64_t flat_row_k = 0, flat_row_v = 0;
  for (CacheId c = 0; c < layout_->n_caches(); ++c)
    if (!layout_->cache(c).ring()) {
      flat_row_k += int64_t(k_row_bytes(*layout_, c, types_));
      flat_row_v += int64_t(v_row_bytes(*layout_, c, types_));
    }
  // Rings per sequence; each flat page once, with the most rows any holder uses of it (a flat
  // array by page id: the server reads this after every step).
  std::vector<int32_t> used(size_t(allocator_.touched()), 0);
  for (const auto &[id, e] : entries_) {
    const MemoryUse one = memory(id);
    m.ring += one.ring;
    m.buffers += e->ring.buffer_bytes();
    for (CacheId c = 0; c < layout_->n_caches(); ++c)
      if (layout_->cache(c).ring())
        m.minimum += layout_->min_rows(c, e->seq.length()) *
                     int64_t(k_row_bytes(*layout_, c, types_) + v_row_bytes(*layout_, c, types_));
    const int32_t length = e->seq.length();
    for (size_t i = 0; i < e->table.pages.size(); ++i) {
      int32_t &rows = used[size_t(e->table.pages[i])];
      rows = std::max(rows, std::clamp(length - int32_t(i) * p, 0, p));
    }
  }
  for (int32_t rows : used) m.minimum += int64_t(rows) * (flat_row_k + flat_row_v);
  m.pages = allocator_.in_use();
  m.shared_pages = allocator_.shared();
  m.flat = m.pages * page_bytes_;
  m.k = m.pages * p * flat_row_k;
  m.v = m.pages * p * flat_row_v;
  for (CacheId c = 0; c < layout_->n_caches(); ++c)
    if (layout_->cache(c).ring()) {
      const int64_t seqs = int64_t(entries_.size()) * ring_allocated_rows(c);
      m.k += seqs * int64_t(k_row_bytes(*layout_, c, types_));
      m.v += seqs * int64_t(v_row_bytes(*layout_, c, types_));
    }
  m.held = m.flat + m.ring;
  m.buffers += m.flat;
  m.snapshots = snapshot_bytes_->total;
  return m;
}

int64_t KvStore::peak_bytes_at_length(int32_t length) const {
  const int32_t rows = std::min(length, layout_->capacity());
  return ring_pool_bytes() +
         int64_t(PageTable::pages_for(rows, layout_->page_rows())) * page_bytes_;
}

BytesByBufferType KvStore::peak_bytes_at_length_by_buffer_type(int32_t length) const {
  const int32_t rows = std::min(length, layout_->capacity());
  const int64_t page_rows =
      int64_t(PageTable::pages_for(rows, layout_->page_rows())) * layout_->page_rows();
  BytesByBufferType by;
  for (CacheId c = 0; c < layout_->n_caches(); ++c) {
    const int64_t row =
        int64_t(k_row_bytes(*layout_, c, types_) + v_row_bytes(*layout_, c, types_));
    add_bytes(by, bufts_[size_t(c)],
              row * (layout_->cache(c).ring() ? int64_t(ring_allocated_rows(c)) : page_rows));
  }
  return by;
}

BytesByBufferType KvStore::device_pool_bytes() const {
  BytesByBufferType by;
  for (const Pool::Part &p : pages_.parts)
    if (p.buffer && is_device_storage(p.buft))
      add_bytes(by, p.buft, int64_t(ggml_backend_buffer_get_size(p.buffer.get())));
  return by;
}

} // namespace offgraph::kv
