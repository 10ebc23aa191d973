// What a step does to one cache's storage, as plain numbers: the physical rows it writes and the
// physical rows it reads. The byte layer turns a plan into tensor views; nothing here knows of
// tensors.
#pragma once

#include "cache/geometry.h"

#include <array>
#include <cstdint>

namespace offgraph::cache {

// Contiguous physical rows [start, start + len) of one cache's storage.
struct Run {
  int32_t start = 0;
  int32_t len = 0;
  int32_t end() const { return start + len; }
  bool operator==(const Run &) const = default;
};

// At most two runs (a ring range that wraps splits in two), in logical order, oldest first.
struct Runs {
  std::array<Run, 2> run{};
  int32_t count = 0;

  int32_t total() const { return count == 0 ? 0 : run[0].len + (count == 2 ? run[1].len : 0); }
  const Run *begin() const { return run.data(); }
  const Run *end() const { return run.data() + count; }
  bool operator==(const Runs &o) const {
    if (count != o.count) return false;
    for (int32_t i = 0; i < count; ++i)
      if (!(run[size_t(i)] == o.run[size_t(i)])) return false;
    return true;
  }
};

// Logical positions [start, start + len) mapped onto `rows` physical rows, where position p lives
// at row p mod rows. Requires 0 <= len <= rows.
inline Runs split_ring(int32_t start, int32_t len, int32_t rows) {
  Runs r;
  if (len <= 0) return r;
  const int32_t first = start % rows;
  const int32_t head = len < rows - first ? len : rows - first;
  r.run[0] = {first, head};
  r.count = 1;
  if (head < len) {
    r.run[1] = {0, len - head};
    r.count = 2;
  }
  return r;
}

// The logical position a ring slot holds, given the high-water mark (one past the highest
// position ever written): the largest p < high_water with p mod rows == slot, or -1 if none.
// Between a rewind and the next writes, slots at positions >= the length hold abandoned rows;
// their positions are later than any query's, so a causal mask already hides them. This is what
// lets the byte layer attend a whole ring in physical order with no gather.
inline int32_t ring_slot_position(int32_t rows, int32_t high_water, int32_t slot) {
  if (slot >= high_water) return -1;
  const int32_t last = high_water - 1;
  return last - ((last - slot) % rows);
}

// One step of one sequence on one cache: n_tokens new rows at logical positions
// [position, position + n_tokens). Rows are written before they are read, except on a ring too
// small to hold the step's rows beside the window before them (deferred_write).
struct StepPlan {
  CacheId cache = 0;
  int32_t position = 0;
  int32_t n_tokens = 0;
  Runs write;
  Runs read;
  // Logical position of the first row read; read row i (counting through the runs) holds
  // position read_base_pos + i. Queries mask against it: causal (lower-right) and, on a sliding
  // cache, the window band.
  int32_t read_base_pos = 0;
  // One past the highest position ever written once this step's rows are in (for ring slot
  // positions; see ring_slot_position).
  int32_t high_water_after = 0;
  // A ring step longer than the ring's lead (Layout::ring_lead): its rows would overwrite slots
  // its first queries still read. Then `read` holds only the older rows [read_base_pos, position)
  // (the slots as labelled by high_water_before, where labels >= position are stale), the step's
  // own rows are attended from the step's tensors after them, and `write` (the step's last
  // min(n_tokens, R) positions) happens after every read of the cache in the step.
  bool deferred_write = false;
  // One past the highest position written before this step (labels the slots a deferred write's
  // step reads).
  int32_t high_water_before = 0;

  int32_t end() const { return position + n_tokens; }
};

} // namespace offgraph::cache
