// Sequence: one token history's bookkeeping across every cache of a Layout. It has two faces:
// control (length, capacity, admission, rewind, clear) for the runner, and the planner (pure
// plan, idempotent commit) for the byte layer. It also decides forks and describes ring snapshots.
//
// Invariants (CACHE_CONTRACT.md §4-5, §12):
// - One logical length shared by all caches. A step writes positions [length, length + T).
// - plan() is pure; commit() is a max, so repeated plans and commits (shared layers) are no-ops.
// - The high-water mark hw is one past the highest position written. A ring of
//   R = window + lead - 1 slots (lead = Layout::ring_lead) physically holds positions
//   [hw - R, hw), so a rewind to p is exact iff the next step's first query finds its window
//   there: hw <= R or p >= hw - lead (or the window is 1, so nothing older is read). Where a ring
//   depends on it, a rewind never lowers hw; elsewhere it may, keeping hw <= length + lead so that
//   slot labels (ring_slot_position) stay true.
#pragma once

#include "base/status.h"
#include "cache/layout.h"
#include "cache/plan.h"

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace offgraph::cache {

// Physical rows of one cache (the same row indices in the source and the destination storage).
struct CacheRows {
  CacheId cache = 0;
  Runs rows;
};

// How a new sequence starts as a copy of another's first `length` positions: the rows to copy,
// per cache. Flat caches copy [0, length); rings copy the slots of the last window - 1 positions,
// which is all the next step needs.
struct ForkPlan {
  int32_t length = 0;
  std::vector<CacheRows> copies;
};

// The ring rows to save at some length B so that a later restore() makes the sequence exactly as
// it was at B, even after its rings have wrapped past B. Flat caches need nothing: truncation is
// exact for them. Only rings that can wrap within the capacity are listed.
// With a reach r it also holds the rows before the window, back to length - r - window + 1, so that
// a restore may land at any length in [length - r, length]: a prompt's end snapshot then also
// serves a request that diverges inside the prompt's last few tokens (a chat template's generation
// prompt, which the next turn renders differently).
struct RingSnapshot {
  uint64_t sequence_uid = 0;
  uint64_t taken_at = 0; // the sequence's event stamp when taken
  int32_t length = 0;
  int32_t reach = 0;
  std::vector<CacheRows> rows;

  int64_t total_rows() const;
  bool resumes_at(int32_t at) const; // at in [length - reach, length]
};

class Sequence {
public:
  explicit Sequence(std::shared_ptr<const Layout> layout);

  const Layout &layout() const { return *layout_; }
  std::shared_ptr<const Layout> shared_layout() const { return layout_; }
  // Unique per process; a fork gets a new one.
  uint64_t uid() const { return uid_; }

  // --- control face -----------------------------------------------------------------------
  int32_t length() const { return length_; }
  int32_t capacity() const { return layout_->capacity(); }
  int32_t high_water() const { return high_water_; }
  bool can_extend(int32_t n = 1) const { return n >= 0 && n <= capacity() - length_; }
  // The lowest length rewind() accepts (besides 0, which is a clear).
  int32_t rewind_floor() const;
  // Truncates the logical length to new_length. Refuses, saying why, a length above the current
  // one, or one whose window a ring no longer holds. Rewinding to 0 is clear().
  Status rewind(int32_t new_length);
  // Speculative decoding's rule (CACHE_CONTRACT.md §5 applied to a verify step): the most drafted
  // tokens k that one step at the current length L may write after the token it must keep, as a
  // span of 1 + k, such that a rewind to any length in [L + 1, L + 1 + k] is then exact. On a
  // ring (window > 1) that needs L + 1 >= max(hw, L + 1 + k) - lead, i.e. k <= lead and
  // hw <= L + 1 + lead; and a span is at most max_write and within the capacity. So
  // min(lead, max_write - 1) wherever the capacity allows (0: no draft fits).
  int32_t max_draft_tokens() const;
  // Length 0 and nothing resident; storage is kept by the byte layer.
  void clear();

  // --- planner face -----------------------------------------------------------------------
  // Where the n_tokens rows at [position, position + n_tokens) go on cache `id` and which rows
  // the step reads. Pure. Refuses an unknown cache, an empty step, a step longer than max_write,
  // one past the capacity, and positions that do not continue the sequence (position must be the
  // current length).
  Result<StepPlan> plan(CacheId id, int32_t position, int32_t n_tokens) const;
  // Advances the length to the plan's end (a max: committing twice, or one plan per cache of the
  // same step, is harmless). Refuses a plan that does not continue this sequence.
  Status commit(const StepPlan &plan);

  // --- forks and snapshots ----------------------------------------------------------------
  // Whether a new sequence may start as a copy of this one's first n positions, and which rows to
  // copy. Flat caches allow any n <= length; rings only while the window before n is resident.
  Result<ForkPlan> plan_fork(int32_t n) const;
  // The child's bookkeeping once the byte layer copied plan.copies.
  Sequence forked(const ForkPlan &plan) const;
  // Which ring rows to save now so that restore() can return to the current length later, or to
  // any of the `reach` lengths before it. The reach is cut to what the rings still hold (at most
  // the ring lead past a step's end; the length itself on a model without rings).
  RingSnapshot describe_snapshot(int32_t reach = 0);
  // After the byte layer wrote the snapshot's rows back at their slots: the length becomes `at`
  // (-1: the snapshot's length) and the rings' window before it is resident again (so that length
  // is the new rewind floor). Refuses a snapshot of another sequence, an `at` outside its reach or
  // above the current length, and a snapshot whose first `at` positions have been rewound and
  // rewritten since it was taken.
  Status restore(const RingSnapshot &snapshot, int32_t at = -1);

private:
  // Rows of positions [max(0, from - window + 1), end) on each ring: with from == end, what a step
  // at `end` reads besides its own rows.
  std::vector<CacheRows> ring_window_rows(int32_t from, int32_t end) const;
  // Bookkeeping of a fresh sequence into which the rows of ForkPlan were copied.
  void materialize_at(int32_t end);
  void record_truncation(int32_t new_length);
  bool ring_limits_rewind(CacheId id) const;
  Status check_snapshot(const RingSnapshot &s, int32_t at) const;

  std::shared_ptr<const Layout> layout_;
  uint64_t uid_ = 0;
  int32_t length_ = 0;
  int32_t high_water_ = 0;
  // Event stamps, for snapshot validity: each truncation pushes (stamp, new length); a snapshot
  // at B taken at stamp t stays valid while every truncation after t kept length >= B. Kept as a
  // stack with lengths strictly increasing upward (a later, lower truncation hides earlier,
  // higher ones), so it holds at most one entry per distinct length.
  uint64_t stamp_ = 0;
  // The last committed step, so that committing it again is a no-op rather than an error.
  int32_t last_step_position_ = -1;
  std::vector<std::pair<uint64_t, int32_t>> truncations_;
};

} // namespace offgraph::cache
