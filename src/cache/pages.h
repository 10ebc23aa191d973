// Pages: the bookkeeping of paged flat storage, tensor-free. A flat cache's rows live in fixed-size
// pages of `page_rows` rows drawn from one store-wide pool; a sequence's page table maps its
// logical row r (= position r) to pool row table[r / page_rows] * page_rows + r % page_rows. One
// table serves every flat cache of a sequence (they share its length, so their page boundaries
// coincide); page id i names the same slot in each flat cache's pool tensor.
//
// Pages are reference-counted: a fork shares its parent's pages, and a write into a page that
// another table also holds copies it first (copy on write), so a shared page is never written.
//
// Invariants (checked by tests/cache/pages_test.cpp against a naive model):
// - refs(p) equals the number of table entries naming p, over every live table;
// - a page is on the free list iff refs(p) == 0; allocate() never returns a page in use;
// - in_use() + free pages == pages ever handed out <= max_pages();
// - take_cold hands out only free pages holding memory, and afterwards at most `keep` of them do.
#pragma once

#include "base/status.h"

#include <cstdint>
#include <optional>
#include <vector>

namespace offgraph::cache {

using PageId = int32_t;

class PageAllocator {
public:
  explicit PageAllocator(int32_t max_pages) : max_pages_(max_pages) {}

  int32_t max_pages() const { return max_pages_; }
  // Pages with at least one holder, and with more than one.
  int32_t in_use() const { return in_use_; }
  int32_t shared() const { return shared_; }
  // Pages ever handed out: the pool's high-water mark (fresh pages come from above it).
  int32_t touched() const { return int32_t(refs_.size()); }
  int32_t refs(PageId p) const { return p >= 0 && p < touched() ? refs_[size_t(p)] : 0; }

  // A page with one holder: the most recently freed one (its memory is warm), else a fresh one;
  // nullopt when all max_pages are in use. A fresh one may throw std::bad_alloc (nothing
  // changed) unless reserve() made room for it.
  std::optional<PageId> allocate();
  // Another holder of a page in use.
  void retain(PageId p);
  // One holder fewer; at zero the page returns to the free list. True if it did. Allocates
  // nothing (the free list has room for every page handed out).
  bool release(PageId p);
  // Room for `n` more allocations: the next n allocate() calls allocate no memory of their own.
  // Throws std::bad_alloc, having changed nothing, where the room cannot be had.
  void reserve(int32_t n);

  // Free pages that still hold memory: every page freed since it was last taken by take_cold.
  int32_t free_warm() const { return int32_t(free_.size()) - cold_; }
  // The free pages past the `keep` most recently freed that still hold memory, least recently
  // freed first, from now on counted as holding none: the caller gives their memory back to the
  // OS. Allocation takes the most recently freed first, so these are the last reused. Amortized
  // O(1) per page: the free list's bottom part is the cold one.
  std::vector<PageId> take_cold(int32_t keep);

private:
  int32_t max_pages_;
  int32_t in_use_ = 0, shared_ = 0;
  std::vector<int32_t> refs_;
  std::vector<PageId> free_; // most recently freed last
  int32_t cold_ = 0;         // free_[0, cold_) hold no memory (given back)
};

// A sequence's pages, oldest first: page i holds positions [i * page_rows, (i + 1) * page_rows).
struct PageTable {
  std::vector<PageId> pages;

  // Pages needed for positions [0, end).
  static int32_t pages_for(int32_t end, int32_t page_rows) {
    return end <= 0 ? 0 : (end - 1) / page_rows + 1;
  }
  // The pool row holding position r.
  int64_t pool_row(int32_t r, int32_t page_rows) const {
    return int64_t(pages[size_t(r / page_rows)]) * page_rows + r % page_rows;
  }
};

} // namespace offgraph::cache
