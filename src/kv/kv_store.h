// KvStore: the bytes behind the cache core. Flat caches live in pages of one store-wide pool
// (cache/pages.h): each sequence has a page table, growth appends pages (no copy), a fork shares
// every page of the prefix, and a write into a shared page copies it first. Rings stay per
// sequence (their size is fixed). The store also saves and restores ring snapshots and accounts
// for every byte against the theoretical minimum, shared pages counted once. The graph side lives
// in step.h.
#pragma once

#include "base/status.h"
#include "cache/layout.h"
#include "cache/pages.h"
#include "cache/sequence.h"
#include "kv/storage_types.h"

#include "ggml-backend.h"
#include "ggml-cpp.h"

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

namespace offgraph::kv {

using SeqId = int32_t;

// Rows of K/V that attention reads on a device (not host memory) come in multiples of this:
// ggml-cuda's fast decode kernels (the vector kernel, the GQA-batched one) need the KV row count a
// multiple of 256 (FATTN_KQ_STRIDE); other rows fall back to slower ones. Rings on devices are
// allocated padded to it, and flat reads are widened to it (the extra rows masked).
inline constexpr int32_t kDeviceReadRowMultiple = 256;
// Storage in this buffer type is a device's (not host memory): read with stock ops, padded as
// above. One test for the store and the step alike.
inline bool is_device_storage(ggml_backend_buffer_type_t buft) {
  return !ggml_backend_buft_is_host(buft);
}

// How attention reads a ring. Physical (the default): every written slot in slot order, masked by
// each slot's position; no copy. Logical: the window's rows oldest first, joined by a copy when
// they wrap; the summation order then matches an implementation whose cache has not wrapped
// (llama.cpp's), which matters for bit-level comparisons at reduced precision.
enum class RingOrder { Physical, Logical };

// Which kernels attend. Grouped (the default): offgraph's own, the grouped-query kernel for spans
// of a few tokens (kv/grouped_attention.h: each K/V row read once per KV head, f32 accumulation)
// and the tiled one for longer spans (kv/tiled_attention.h: prefill). GroupedDecodeOnly: the
// grouped kernel for decode, ggml's flash attention for prefill. Ggml: ggml's flash attention for
// every span, as llama.cpp does. The other two are for comparisons.
enum class AttentionKernel { Grouped, GroupedDecodeOnly, Ggml };
// "grouped", "grouped-decode" or "ggml"; an error naming the choices otherwise.
Result<AttentionKernel> parse_attention_kernel(std::string_view name);

// Bytes of K/V storage. `held` counts rows held times their row bytes (flat: whole pages);
// `minimum` what the current lengths need at the least (cache::Layout::min_rows); `buffers` what
// the ring buffers take, alignment included, plus the pages in use. Per sequence, every page it
// holds counts, shared or not; for the whole store a shared page counts once, and so does the
// minimum of a prefix that several sequences share (per page, the most rows any holder uses).
struct MemoryUse {
  int64_t snapshots = 0; // buffers of live snapshots (store-wide figure only)
  int64_t held = 0;
  int64_t minimum = 0;
  int64_t buffers = 0;
  int64_t flat = 0, ring = 0; // held, by cache kind
  int64_t k = 0, v = 0;       // held, by tensor (in the K and V storage types)
  int64_t pages = 0;          // flat pages held (store-wide: in use)
  int64_t shared_pages = 0;   // of those, pages another table also holds
};

// The ring caches of one sequence (each at its ring size, fixed), a snapshot's saved rows, or the
// page pool: one backend buffer per buffer type its caches live in (one per device).
// Buffers of storage outside host memory freed so far, by every store of the process. A device
// (a ggml-rpc server) may forget what it held for a graph when one of its buffers is freed, so a
// graph may be reused only while this stays the same (model::Forward).
int64_t device_buffer_frees();

// Frees a buffer, counting it in device_buffer_frees() when it is not in host memory.
struct CountingBufferFree {
  void operator()(ggml_backend_buffer_t buffer) const;
};

struct Pool {
  struct Part {
    ggml_backend_buffer_type_t buft = nullptr;
    ggml_context_ptr ctx;
    std::unique_ptr<ggml_backend_buffer, CountingBufferFree> buffer;
  };
  std::vector<Part> parts;
  std::vector<ggml_tensor *> k, v; // by cache id (snapshots: by entry); null for flat caches

  int64_t buffer_bytes() const;
};

// Bytes by the buffer type they live in (one per device), in first-seen order.
using BytesByBufferType = std::vector<std::pair<ggml_backend_buffer_type_t, int64_t>>;
void add_bytes(BytesByBufferType &to, ggml_backend_buffer_type_t buft, int64_t bytes);
// The bytes `by` holds on `buft` (0: none).
int64_t bytes_on(const BytesByBufferType &by, ggml_backend_buffer_type_t buft);

// Bytes of a store's live snapshots, in all and by buffer type; shared with the snapshots so that
// one that goes subtracts its own.
struct SnapshotTally {
  std::atomic<int64_t> total{0};
  mutable std::mutex mutex;
  BytesByBufferType by_buffer_type; // under mutex
  void add(const Pool &rows, int64_t sign);
};

// Saved ring rows of one sequence at some length, in a buffer of their own.
class Snapshot {
public:
  const cache::RingSnapshot &spec() const { return spec_; }
  int32_t length() const { return spec_.length; }
  int32_t reach() const { return spec_.reach; } // restores land in [length - reach, length]
  int64_t bytes() const;
  ~Snapshot();

private:
  friend class KvStore;
  std::shared_ptr<SnapshotTally> live_bytes_; // the store's tally of snapshot bytes
  cache::RingSnapshot spec_;
  Pool rows_; // rows_.k[i], rows_.v[i]: the rows of spec_.rows[i], runs concatenated
};

enum class SeqRole : uint8_t { None, Active, Kept };

class KvStore {
public:
  // `bufts[c]` is where cache c's storage lives (its layer's device), or one `buft` for all.
  // Types are checked against the layout. The page pool holds up to `max_pages` pages (0: as
  // many as physical memory can hold, or, with flat caches on other devices, the pages of four
  // sequences at full capacity), and never more than half of what a device holding a flat cache
  // reports free. On the CPU buffer type it is reserved address space that the OS backs only
  // where pages are written, so an unused reservation costs nothing; on other buffer types it is
  // allocated in full (and cleared), so callers that know their sequences should say.
  static Result<std::unique_ptr<KvStore>> create(std::shared_ptr<const cache::Layout> layout,
                                                 StorageTypes types,
                                                 std::vector<ggml_backend_buffer_type_t> bufts,
                                                 int32_t max_pages = 0);
  static Result<std::unique_ptr<KvStore>> create(std::shared_ptr<const cache::Layout> layout,
                                                 StorageTypes types,
                                                 ggml_backend_buffer_type_t buft,
                                                 int32_t max_pages = 0);
  ~KvStore();

  const cache::Layout &layout() const { return *layout_; }
  std::shared_ptr<const cache::Layout> shared_layout() const { return layout_; }
  StorageTypes types() const { return types_; }
  // Bytes of storage all sequences may hold together (0 = no limit). Growth past it is refused.
  void set_memory_budget(int64_t bytes) { budget_ = bytes; }
  int64_t memory_budget() const { return budget_; }
  // Logical order joins rows with ggml_concat, which takes f32, f16 and bf16 storage only.
  Status set_ring_order(RingOrder order);
  RingOrder ring_order() const { return ring_order_; }
  void set_attention_kernel(AttentionKernel kernel) { attention_kernel_ = kernel; }
  AttentionKernel attention_kernel() const { return attention_kernel_; }

  // A new empty sequence: rings allocated in full, no pages yet. Ids are the lowest unused.
  Result<SeqId> create_sequence();
  Status remove_sequence(SeqId id);
  std::vector<SeqId> sequence_ids() const;
  // The core's control face (length, rewind, clear, ...). Null for an unknown id.
  cache::Sequence *sequence(SeqId id);
  const cache::Sequence *sequence(SeqId id) const;

  // Makes positions [length, end) of `id` writable: appends the pages they need and copies every
  // page they touch that another table also holds (copy on write: its rows before the length).
  // All or nothing: on failure (budget, pool exhausted, capacity) the sequence is untouched.
  Status reserve(SeqId id, int32_t end);
  // Fault injection for tests: called first in reserve ("reserve"), fork ("fork"),
  // fork_at_snapshot ("fork_at_snapshot"), create_sequence ("create_sequence", id -1) and
  // snapshot ("snapshot") with the site and the sequence acted on; an error it returns is that
  // call's (as if its memory could not be had), and std::bad_alloc it throws is caught there as
  // an allocation inside the call would be (out_of_memory).
  using Fault = std::function<Status(std::string_view site, SeqId id)>;
  void set_fault(Fault fault) { fault_ = std::move(fault); }
  Status injected_fault(std::string_view site, SeqId id) const {
    return fault_ ? fault_(site, id) : Status();
  }
  // The core's rewind (refusals and all), then the pages wholly past the new length go back.
  Status rewind(SeqId id, int32_t length);

  // A new sequence holding the first n positions of `src` (refused per the core's fork rule): its
  // page table shares every page of the prefix (the last one is copied only when either side
  // writes into it); ring rows are copied.
  Result<SeqId> fork(SeqId src, int32_t n);
  // A new sequence at length `at` (-1: the snapshot's; else within its reach) whose pages are
  // those of `pages_from`'s first `at` positions (shared) and whose rings are the snapshot's. The
  // caller vouches that those positions of `pages_from` hold the first `at` tokens the snapshot
  // was taken after (the prefix tree does); refused when `pages_from` is shorter.
  Result<SeqId> fork_at_snapshot(SeqId pages_from, const Snapshot &snapshot, int32_t at = -1);
  // Saves the ring rows that let restore() return `id` to its current length later, or to any of
  // the `reach` lengths before it (cut to what the rings hold: cache::Sequence::describe_snapshot).
  Result<std::unique_ptr<Snapshot>> snapshot(SeqId id, int32_t reach = 0);
  // Restores a snapshot of `id` at length `at` (-1: the snapshot's; the core's rules); pages past
  // that length go back.
  Status restore(SeqId id, const Snapshot &snapshot, int32_t at = -1);

  // Per sequence (snapshots not included), and for the whole store (snapshots included).
  MemoryUse memory(SeqId id) const;
  // The most one sequence holds on its way to `length` positions: rings in full and the pages of
  // `length` rows. What admission sets aside for a request.
  int64_t peak_bytes_at_length(int32_t length) const;
  // The same by the buffer type it lives in (each device's share of a sequence: which caches it
  // holds); the figures add up to peak_bytes_at_length(length).
  BytesByBufferType peak_bytes_at_length_by_buffer_type(int32_t length) const;
  // The page pool's memory allocated up front, by buffer type: a device's pool is allocated in
  // full at create (the host's is reserved, its pages resident once written: none here).
  BytesByBufferType device_pool_bytes() const;
  MemoryUse memory() const;

  // Storage of one cache of one sequence, for the graph fragment: a ring's own tensors, or, for a
  // flat cache, the pool's (the page table says which rows are the sequence's).
  ggml_tensor *k_storage(SeqId id, cache::CacheId c) const;
  ggml_tensor *v_storage(SeqId id, cache::CacheId c) const;
  // Rows held: the ring size, or the pages' rows.
  int32_t storage_rows(SeqId id, cache::CacheId c) const;
  // The flat caches' page table of `id` (null for an unknown id).
  const cache::PageTable *page_table(SeqId id) const;
  int32_t page_rows() const { return layout_->page_rows(); }
  // Bytes of one page: page_rows rows of every flat cache, K and V.
  int64_t page_bytes() const { return page_bytes_; }
  const cache::PageAllocator &pages() const { return allocator_; }
  // Gives the memory of free pages back to the OS, all but the most recently freed `keep_bytes`
  // worth (which a burst reuses first): MADV_DONTNEED on the pool's reserved address space, whole
  // OS pages inside each page's rows; a device's pool keeps its memory. So after a burst the
  // process's resident memory returns to what its sequences hold. Returns the bytes given back.
  int64_t release_free_memory(int64_t keep_bytes);
  // Bytes of the CPU pool's address space the OS backs now (mincore): what it costs in RSS.
  int64_t resident_pool_bytes() const;
  // What counts against set_memory_budget: pages in use, every sequence's rings, live snapshots.
  int64_t bytes_in_use() const;
  // What a sequence is to its owner: held for a request (Active), kept for reuse (Kept), or
  // neither (None, where every new sequence starts). The store counts per page the Active and the
  // Kept tables that hold it as pages join and leave them, so that the pages only kept sequences
  // hold (what the engine's cache of conversations costs) are known without walking the tables.
  void set_role(SeqId id, SeqRole role);
  // Bytes of one sequence's ring rows (memory(id).ring; 0 for an unknown id), without memory(id)'s
  // walk of the page table.
  int64_t ring_bytes(SeqId id) const;
  // Pages some Kept sequence holds and no Active one does.
  int32_t kept_only_pages() const { return kept_only_pages_; }
  // The same by the buffer type it lives in (one per device: the ledger's per-device KV rows);
  // the figures add up to bytes_in_use().
  BytesByBufferType bytes_in_use_by_buffer_type() const;

private:
  struct Entry {
    explicit Entry(std::shared_ptr<const cache::Layout> l) : seq(std::move(l)) {}
    cache::Sequence seq;
    Pool ring;
    cache::PageTable table;
    SeqRole role = SeqRole::None;
  };
  // A page joins or leaves a table whose sequence has `role` (the role counters).
  void count_page(cache::PageId page, SeqRole role, int delta);
  // Room in the per-page counts for page ids below `pages` (count_page then allocates nothing).
  void reserve_page_counts(int32_t pages);
  // The error of a store call that met std::bad_alloc (caught there: no call throws it).
  static Status out_of_memory(std::string_view site);
  // The pool's memory when it is reserved address space (CPU): unmapped after the buffer is gone.
  struct Mapping {
    void *addr = nullptr;
    size_t bytes = 0;
    void reset(); // unmaps
    ~Mapping() { reset(); }
  };

  KvStore(std::shared_ptr<const cache::Layout> layout, StorageTypes types,
          std::vector<ggml_backend_buffer_type_t> bufts, int32_t max_pages);
  Status make_page_pool();
  // A new entry at plan.length: its rings allocated (not yet filled), the pages of those
  // positions shared with `src`.
  Result<Entry> child_of(const Entry &src, const cache::ForkPlan &plan);
  // The ring caches of one sequence, each at its ring size.
  Result<Pool> make_ring_pool();
  int64_t ring_pool_bytes() const;
  // Rows allocated for ring cache c: max_rows, padded to kDeviceReadRowMultiple on a device.
  int32_t ring_allocated_rows(cache::CacheId c) const;
  // Refuses `more` bytes beyond what is in use when they would pass the budget.
  Status check_budget(int64_t more, const char *what) const;
  // Copies rows [0, n) of page `from` into page `to`, on every flat cache.
  void copy_page(cache::PageId from, cache::PageId to, int32_t n);
  void release_pages(Entry &e, size_t keep);
  // Writes a snapshot's saved rows back at their slots of `ring`.
  void write_back(const Snapshot &snap, Pool &ring);
  const Entry *find(SeqId id) const;
  Entry *find(SeqId id);
  Result<SeqId> insert(Entry entry);
  std::string unknown(SeqId id) const;

  std::shared_ptr<const cache::Layout> layout_;
  StorageTypes types_;
  std::vector<ggml_backend_buffer_type_t> bufts_; // by cache id
  int64_t budget_ = 0;
  // The page pool: per flat cache one K and one V tensor of max_pages * page_rows rows.
  cache::PageAllocator allocator_;
  int64_t page_bytes_ = 0;
  Mapping mapping_; // declared before the buffer, so destroyed after it
  Pool pages_;
  // Per page: the Active and the Kept tables that hold it (by page id), and the pages held by Kept
  // tables alone.
  std::vector<int32_t> active_refs_, kept_refs_;
  int32_t kept_only_pages_ = 0;
  // Bytes held by live snapshots; shared with them so that dropping one updates the tally.
  std::shared_ptr<SnapshotTally> snapshot_bytes_ = std::make_shared<SnapshotTally>();
  int steps_in_flight_ = 0;
  friend class Step;
  RingOrder ring_order_ = RingOrder::Physical;
  Fault fault_;
  AttentionKernel attention_kernel_ = AttentionKernel::Grouped;
  std::map<SeqId, std::unique_ptr<Entry>> entries_;
};

// Copies rows [src_row, src_row + n) of `src` into rows [dst_row, dst_row + n) of `dst` (2-D
// tensors of the same type and row size) through the backend.
void copy_rows(ggml_tensor *src, int32_t src_row, ggml_tensor *dst, int32_t dst_row, int32_t n);

} // namespace offgraph::kv
