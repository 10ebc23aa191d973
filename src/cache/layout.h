// Layout: the model's Geometry resolved against the runtime's Policy. It decides, per cache, how
// rows are stored (a flat pool indexed by position, or a ring of window + reach slots)
// and does the size arithmetic every other layer relies on. Immutable once made; sequences share
// it.
#pragma once

#include "base/status.h"
#include "cache/geometry.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace offgraph::cache {

// Runtime choices, validated against the geometry by Layout::make.
struct Policy {
  int32_t capacity = 0;  // hard logical bound on one sequence's length (positions)
  int32_t max_write = 0; // most tokens one step may write (prefill is chunked to this)
  // Rows of one page of flat storage (cache/pages.h); clamped to the capacity. 64: the tiled
  // kernel's tile, and a fork or prefix match shares all but at most 63 rows (docs/kv-paging.md).
  int32_t page_rows = 64;
  // Positions a ring keeps beyond its window (clamped to max_write - 1): how far a rewind, a
  // rejected draft or a snapshot's reach may go back once it wrapped. A step longer than the
  // reach + 1 attends its own rows from the step's tensors and writes the ring after its last read
  // (StepPlan::deferred_write), so rings need no room for a whole prefill chunk. 32: drafts of up
  // to 32 tokens and the engine's snapshot reach (16) fit, and the rings stay within 1.03x of the
  // window for windows of 1024 (docs/gemma4-bench.md).
  int32_t ring_reach = 32;
};

enum class Storage : uint8_t { Flat = 0, Ring = 1 };

struct CacheLayout {
  CacheSpec spec;
  Storage storage = Storage::Flat;
  // Rows storage may ever hold: the ring size R for rings (allocated in full when a sequence
  // starts), the capacity for flat caches (which grow a page at a time).
  int32_t max_rows = 0;

  int32_t window() const { return spec.attention.window; }
  bool ring() const { return storage == Storage::Ring; }
};

class Layout {
public:
  // Validates the policy (and its fit with the geometry) and resolves each cache's storage. A
  // sliding cache is a ring of R = window + lead - 1 slots, lead = ring_lead(): a step of up to
  // `lead` tokens writes its rows before attending while its first query still needs window - 1
  // older ones; a longer step attends before it writes. When R would not be smaller than the
  // capacity, the ring could never wrap, so the cache is stored flat and grows lazily instead;
  // its window then only narrows reads and the mask.
  static Result<std::shared_ptr<const Layout>> make(Geometry geometry, Policy policy);

  const Geometry &geometry() const { return geometry_; }
  const Policy &policy() const { return policy_; }
  int32_t capacity() const { return policy_.capacity; }
  int32_t max_write() const { return policy_.max_write; }
  int32_t page_rows() const { return policy_.page_rows; }
  // How far a ring's high-water mark may run ahead of the sequence's length with the window before
  // the length still resident: min(ring_reach, max_write - 1) + 1 (R - window + 1 on every ring).
  // A rewind goes back at most this far from the high-water mark, a draft may hold this many
  // tokens, and a step of at most this many tokens writes before it reads.
  int32_t ring_lead() const { return std::min(policy_.ring_reach, policy_.max_write - 1) + 1; }
  int32_t n_caches() const { return int32_t(caches_.size()); }
  const CacheLayout &cache(CacheId id) const { return caches_.at(size_t(id)); }
  bool has_ring() const { return has_ring_; }

  // Storage rows cache `id` must hold so that positions [0, end) can be written and read.
  int32_t rows_required(CacheId id, int32_t end) const;
  // The fewest rows any cache could hold and still serve a sequence of `length` tokens: all of
  // them on a full-attention layer, the window on a sliding one (a decode step writes its row and
  // attends it with the window - 1 before it). The floor our memory is measured against.
  int64_t min_rows(CacheId id, int32_t length) const;

  std::string describe() const;

private:
  Geometry geometry_;
  Policy policy_;
  std::vector<CacheLayout> caches_;
  bool has_ring_ = false;
};

} // namespace offgraph::cache
