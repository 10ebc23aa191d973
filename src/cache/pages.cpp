#include "cache/pages.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace offgraph::cache {

namespace {
// Retaining or releasing a page nobody holds is a bookkeeping bug that would hand one page to two
// sequences; stop at once rather than corrupt K/V.
void require_held(int32_t refs, PageId p) {
  if (refs > 0) return;
  std::fprintf(stderr, "offgraph: page %d is not in use (refs %d)\n", p, refs);
  std::abort();
}
} // namespace

std::optional<PageId> PageAllocator::allocate() {
  PageId p;
  if (!free_.empty()) {
    p = free_.back();
    free_.pop_back();
    if (cold_ > int32_t(free_.size()))
      cold_ = int32_t(free_.size()); // it holds memory once written
  } else if (touched() < max_pages_) {
    p = touched();
    reserve(1); // the free list keeps room for every page handed out: release() never allocates
    refs_.push_back(0);
  } else {
    return std::nullopt;
  }
  refs_[size_t(p)] = 1;
  ++in_use_;
  return p;
}

void PageAllocator::reserve(int32_t n) {
  const size_t want = size_t(touched()) + size_t(std::max(n, 0));
  // Doubling: one page at a time stays amortized O(1).
  const auto grow = [want](auto &v) {
    if (v.capacity() < want) v.reserve(std::max(want, 2 * v.capacity()));
  };
  grow(refs_);
  grow(free_);
}

void PageAllocator::retain(PageId p) {
  require_held(refs(p), p);
  if (++refs_[size_t(p)] == 2) ++shared_;
}

bool PageAllocator::release(PageId p) {
  require_held(refs(p), p);
  const int32_t left = --refs_[size_t(p)];
  if (left == 1) --shared_;
  if (left > 0) return false;
  --in_use_;
  free_.push_back(p);
  return true;
}

std::vector<PageId> PageAllocator::take_cold(int32_t keep) {
  std::vector<PageId> cold;
  while (free_warm() > std::max(keep, 0)) cold.push_back(free_[size_t(cold_++)]);
  return cold;
}

} // namespace offgraph::cache
