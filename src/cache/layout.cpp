#include "cache/layout.h"

#include <algorithm>

namespace offgraph::cache {

namespace {
// Keeps every sum of positions, windows and max_write (e.g. length + max_write) inside int32.
constexpr int32_t kMaxCapacity = 1 << 29;
} // namespace

Result<std::shared_ptr<const Layout>> Layout::make(Geometry geometry, Policy policy) {
  const std::string where = "cache policy: ";
  if (policy.capacity < 1)
    return Status::error(where + "capacity " + std::to_string(policy.capacity) +
                         " must be at least 1 position");
  if (policy.capacity > kMaxCapacity)
    return Status::error(where + "capacity " + std::to_string(policy.capacity) +
                         " exceeds the supported maximum " + std::to_string(kMaxCapacity));
  if (policy.max_write < 1)
    return Status::error(where + "max_write " + std::to_string(policy.max_write) +
                         " must be at least 1 token per step");
  if (policy.max_write > policy.capacity)
    return Status::error(where + "max_write " + std::to_string(policy.max_write) +
                         " exceeds the capacity " + std::to_string(policy.capacity) +
                         " (a step can never write more than a sequence holds)");
  if (policy.ring_reach < 0)
    return Status::error(where + "ring_reach " + std::to_string(policy.ring_reach) +
                         " must not be negative");
  if (policy.page_rows < 1)
    return Status::error(where + "page_rows " + std::to_string(policy.page_rows) +
                         " must be at least 1 row");
  policy.page_rows = std::min(policy.page_rows, policy.capacity);

  auto layout = std::make_shared<Layout>();
  for (const CacheSpec &spec : geometry.caches()) {
    CacheLayout c;
    c.spec = spec;
    const int64_t ring_rows =
        int64_t(spec.attention.window) + std::min(policy.ring_reach, policy.max_write - 1);
    if (spec.attention.sliding() && ring_rows < policy.capacity) {
      c.storage = Storage::Ring;
      c.max_rows = int32_t(ring_rows);
      layout->has_ring_ = true;
    } else {
      c.storage = Storage::Flat;
      c.max_rows = policy.capacity;
    }
    layout->caches_.push_back(c);
  }
  layout->geometry_ = std::move(geometry);
  layout->policy_ = policy;
  return std::shared_ptr<const Layout>(std::move(layout));
}

int32_t Layout::rows_required(CacheId id, int32_t end) const {
  const CacheLayout &c = cache(id);
  return c.ring() ? c.max_rows : std::min(end, c.max_rows);
}

int64_t Layout::min_rows(CacheId id, int32_t length) const {
  const CacheLayout &c = cache(id);
  if (!c.spec.attention.sliding()) return length;
  return std::min<int64_t>(length, c.window());
}

std::string Layout::describe() const {
  std::string s = "capacity " + std::to_string(policy_.capacity) + ", max_write " +
                  std::to_string(policy_.max_write) + ", ring lead " + std::to_string(ring_lead()) +
                  ", " + std::to_string(caches_.size()) + " caches, pages of " +
                  std::to_string(policy_.page_rows) + " rows:";
  for (size_t i = 0; i < caches_.size(); ++i) {
    const CacheLayout &c = caches_[i];
    s += "\n  cache " + std::to_string(i) + " (layer " + std::to_string(c.spec.owner_layer) +
         "): " + c.spec.attention.describe() + ", " + (c.ring() ? "ring of " : "flat up to ") +
         std::to_string(c.max_rows) + " rows";
  }
  return s;
}

} // namespace offgraph::cache
