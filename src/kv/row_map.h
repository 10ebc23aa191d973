// RowMap: which storage row holds row j of a cache view, for the attention kernels.
#pragma once

#include <cstdint>

namespace offgraph::kv {

// Where row j of a cache view lives: row j itself, or, for paged flat storage (cache/pages.h),
// pool row pages[r / page_rows] * page_rows + r % page_rows with r = first + j. The kernels look
// rows up one at a time (they convert each to f32 anyway), so pages need no gather and any page
// size works.
struct RowMap {
  const int32_t *pages = nullptr;
  int32_t page_rows = 0;
  int32_t first = 0;

  int64_t operator()(int64_t j) const {
    if (!pages) return j;
    const int64_t r = first + j;
    return int64_t(pages[r / page_rows]) * page_rows + r % page_rows;
  }
};

} // namespace offgraph::kv
