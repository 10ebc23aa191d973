// What the engine's files share (not part of the engine's interface).
#pragma once

#include "engine/engine.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

namespace offgraph::engine {

// Snapshots kept near one message start: the chunks before, holding and after it cover it when
// chunks are long; short ones (a busy step's budget) would take one each.
inline constexpr int32_t kSnapshotsPerStart = 3;

// Each buffer type of `store` as kv_budget_from_memory reads it: its largest part of the store
// (sequences of up to `context` positions), the pool held there, what its device may still take.
// With a draft model's store, whose budget is `draft_share` of the KV budget, its parts (times
// that share) add to the buffer types they live in: the budget then bounds both stores on every
// device.
std::vector<KvDeviceMemory> kv_device_memory(const kv::KvStore &store, int32_t context,
                                             const kv::KvStore *draft = nullptr,
                                             double draft_share = 0);
// The most of `budget` each of `store`'s buffer types can hold (its part; none for 0).
std::vector<Engine::Load::DeviceBytes>
budget_parts_by_device(const kv::KvStore &store, int32_t context, int64_t budget, const char *use);

// How many leading tokens a and b share.
inline size_t shared_prefix(std::span<const int32_t> a, std::span<const int32_t> b) {
  const size_t n = std::min(a.size(), b.size());
  return size_t(std::mismatch(a.begin(), a.begin() + long(n), b.begin()).first - a.begin());
}

} // namespace offgraph::engine
