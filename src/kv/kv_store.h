// KvStore: the bytes behind the cache core. For each sequence it owns K and V storage per cache
// id in ggml backend buffers (shared layers own none), grows flat storage by transactional
// doubling, copies prefixes for forks, saves and restores ring snapshots, and accounts for every
// byte against the theoretical minimum. The graph side lives in step.h.
#pragma once

#include "base/status.h"
#include "cache/layout.h"
#include "cache/sequence.h"
#include "kv/storage_types.h"

#include "ggml-backend.h"
#include "ggml-cpp.h"

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string_view>
#include <vector>

namespace offgraph::kv {

using SeqId = int32_t;

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

// Bytes of K/V storage. `held` counts rows allocated times their row bytes; `minimum` what the
// current lengths need at the least (cache::Layout::min_rows); `buffers` what the backend
// buffers take, alignment included.
struct MemoryUse {
  int64_t snapshots = 0; // buffers of live snapshots (store-wide figure only)
  int64_t held = 0;
  int64_t minimum = 0;
  int64_t buffers = 0;
  int64_t flat = 0, ring = 0; // held, by cache kind
  int64_t k = 0, v = 0;       // held, by tensor (in the K and V storage types)

  MemoryUse &operator+=(const MemoryUse &o);
};

// One backend buffer holding the K and V tensors of a set of caches: the flat ones (all with the
// same row count, which grows) or the rings (each with its own ring size, fixed).
struct Pool {
  ggml_context_ptr ctx;
  ggml_backend_buffer_ptr buffer;
  int32_t rows = 0;                // flat pools: rows of every tensor
  std::vector<ggml_tensor *> k, v; // by cache id; null where the cache lives in the other pool

  int64_t buffer_bytes() const;
};

// Saved ring rows of one sequence at some length, in a buffer of their own.
class Snapshot {
public:
  const cache::RingSnapshot &spec() const { return spec_; }
  int32_t length() const { return spec_.length; }
  int64_t bytes() const;
  ~Snapshot();

private:
  friend class KvStore;
  std::shared_ptr<std::atomic<int64_t>> live_bytes_; // the store's tally of snapshot bytes
  cache::RingSnapshot spec_;
  Pool rows_; // rows_.k[i], rows_.v[i]: the rows of spec_.rows[i], runs concatenated
};

class KvStore {
public:
  // `buft` is where storage lives (the CPU buffer type now). Types are checked against the layout.
  static Result<std::unique_ptr<KvStore>> create(std::shared_ptr<const cache::Layout> layout,
                                                 StorageTypes types,
                                                 ggml_backend_buffer_type_t buft);

  const cache::Layout &layout() const { return *layout_; }
  std::shared_ptr<const cache::Layout> shared_layout() const { return layout_; }
  StorageTypes types() const { return types_; }
  // Bytes of storage all sequences may hold together (0 = no limit). Growth past it is refused.
  void set_memory_budget(int64_t bytes) { budget_ = bytes; }
  // Logical order joins rows with ggml_concat, which takes f32, f16 and bf16 storage only.
  Status set_ring_order(RingOrder order);
  RingOrder ring_order() const { return ring_order_; }
  void set_attention_kernel(AttentionKernel kernel) { attention_kernel_ = kernel; }
  AttentionKernel attention_kernel() const { return attention_kernel_; }

  // A new empty sequence: rings allocated in full, flat caches at the initial size. Ids are the
  // lowest unused.
  Result<SeqId> create_sequence();
  Status remove_sequence(SeqId id);
  std::vector<SeqId> sequence_ids() const;
  // The core's control face (length, rewind, clear, ...). Null for an unknown id.
  cache::Sequence *sequence(SeqId id);
  const cache::Sequence *sequence(SeqId id) const;

  // Grows the flat storage of `id` so that positions [0, end) fit: doubling, clamped to the
  // capacity, copying the live rows. All or nothing: on failure the sequence is untouched.
  Status reserve(SeqId id, int32_t end);

  // A new sequence holding the first n positions of `src` (refused per the core's fork rule).
  Result<SeqId> fork(SeqId src, int32_t n);
  // Saves the ring rows that let restore() return `id` to its current length later.
  Result<std::unique_ptr<Snapshot>> snapshot(SeqId id);
  Status restore(SeqId id, const Snapshot &snapshot);

  // Per sequence (snapshots not included), and for the whole store (snapshots included).
  MemoryUse memory(SeqId id) const;
  // The most one sequence holds on its way to `length` positions: rings in full, flat storage
  // as grown by doubling, plus the old flat storage that lives on during the last growth's copy.
  // What admission sets aside for a request.
  int64_t peak_bytes_at_length(int32_t length) const;
  MemoryUse memory() const;

  // Storage of one cache of one sequence, for the graph fragment.
  ggml_tensor *k_storage(SeqId id, cache::CacheId c) const;
  ggml_tensor *v_storage(SeqId id, cache::CacheId c) const;
  int32_t storage_rows(SeqId id, cache::CacheId c) const;

private:
  struct Entry {
    explicit Entry(std::shared_ptr<const cache::Layout> l) : seq(std::move(l)) {}
    cache::Sequence seq;
    Pool flat, ring;
  };

  KvStore(std::shared_ptr<const cache::Layout> layout, StorageTypes types,
          ggml_backend_buffer_type_t buft);
  // A pool of the ring caches (each at its ring size) or of the flat caches at flat_rows rows.
  Result<Pool> make_pool(bool ring, int32_t flat_rows, int64_t extra_bytes_in_use);
  int32_t pool_rows(cache::CacheId c, bool ring, int32_t flat_rows) const;
  int64_t pool_bytes(bool ring, int32_t flat_rows) const;
  int32_t flat_initial_rows() const;
  const Entry *find(SeqId id) const;
  Entry *find(SeqId id);
  Result<SeqId> insert(Entry entry);
  std::string unknown(SeqId id) const;

  std::shared_ptr<const cache::Layout> layout_;
  StorageTypes types_;
  ggml_backend_buffer_type_t buft_;
  int64_t budget_ = 0;
  // Bytes held by live snapshots; shared with them so that dropping one updates the tally.
  std::shared_ptr<std::atomic<int64_t>> snapshot_bytes_ = std::make_shared<std::atomic<int64_t>>(0);
  int steps_in_flight_ = 0;
  friend class Step;
  RingOrder ring_order_ = RingOrder::Physical;
  AttentionKernel attention_kernel_ = AttentionKernel::Grouped;
  std::map<SeqId, std::unique_ptr<Entry>> entries_;
};

// Copies rows [src_row, src_row + n) of `src` into rows [dst_row, dst_row + n) of `dst` (2-D
// tensors of the same type and row size) through the backend.
void copy_rows(ggml_tensor *src, int32_t src_row, ggml_tensor *dst, int32_t dst_row, int32_t n);

} // namespace offgraph::kv
