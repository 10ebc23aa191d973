#include "cache/sequence.h"

#include <algorithm>
#include <atomic>

namespace offgraph::cache {

namespace {

uint64_t next_uid() {
  static std::atomic<uint64_t> counter{0};
  return ++counter;
}

std::string str(int64_t v) { return std::to_string(v); }

} // namespace

bool RingSnapshot::resumes_at(int32_t at) const { return at >= length - reach && at <= length; }

int64_t RingSnapshot::total_rows() const {
  int64_t n = 0;
  for (const CacheRows &r : rows) n += r.rows.total();
  return n;
}

Sequence::Sequence(std::shared_ptr<const Layout> layout)
    : layout_(std::move(layout)), uid_(next_uid()) {}

// A ring constrains rewinds once it has wrapped, unless its window is 1: then a step needs no
// older row at all.
bool Sequence::ring_limits_rewind(CacheId id) const {
  const CacheLayout &c = layout_->cache(id);
  return c.ring() && c.window() > 1 && high_water_ > c.max_rows;
}

int32_t Sequence::rewind_floor() const {
  for (CacheId id = 0; id < layout_->n_caches(); ++id)
    if (ring_limits_rewind(id)) return std::min(high_water_ - layout_->ring_lead(), length_);
  return 0;
}

int32_t Sequence::max_draft_tokens() const {
  const int32_t lead = layout_->ring_lead();
  int32_t k = std::min(layout_->max_write(), capacity() - length_) - 1;
  for (CacheId id = 0; id < layout_->n_caches(); ++id) {
    const CacheLayout &c = layout_->cache(id);
    if (!c.ring() || c.window() <= 1) continue;
    if (high_water_ > length_ + 1 + lead) return 0; // even the kept token's step could not go back
    k = std::min(k, lead);
  }
  return std::max(k, 0);
}

Status Sequence::rewind(int32_t new_length) {
  if (new_length < 0)
    return Status::error("rewind to " + str(new_length) + ": a length cannot be negative");
  if (new_length > length_)
    return Status::error("rewind to " + str(new_length) + ": the sequence holds only " +
                         str(length_) + " positions, and rewind cannot grow it");
  if (new_length == 0) {
    clear();
    return ok_status();
  }
  if (new_length == length_) return ok_status();
  for (CacheId id = 0; id < layout_->n_caches(); ++id) {
    const CacheLayout &c = layout_->cache(id);
    if (!ring_limits_rewind(id)) continue;
    const int32_t floor = high_water_ - layout_->ring_lead();
    if (new_length >= floor) continue;
    return Status::error(
        "rewind to " + str(new_length) + " refused: cache " + str(id) + " (layer " +
        str(c.spec.owner_layer) + ", " + c.spec.attention.describe() + ") is a ring of " +
        str(c.max_rows) + " rows that was written up to position " + str(high_water_ - 1) +
        ", so it holds only positions " + str(high_water_ - c.max_rows) + ".." +
        str(high_water_ - 1) + ", while a step at " + str(new_length) + " needs positions from " +
        str(std::max(0, new_length - c.window() + 1)) + "; the lowest reachable length is " +
        str(floor) + " (restore a snapshot to go further back)");
  }
  record_truncation(new_length);
  length_ = new_length;
  last_step_position_ = -1;
  // Keep hw <= length + lead, which slot labelling needs (a slot's label must be the position the
  // next step writes there). Wherever a ring limits rewinds this changes nothing, since the rule
  // already demands new_length >= hw - lead; it lowers hw only past rings that never wrapped or
  // have a window of 1, whose older rows nobody reads.
  high_water_ = std::min(high_water_, new_length + layout_->ring_lead());
  return ok_status();
}

void Sequence::clear() {
  record_truncation(0);
  length_ = 0;
  high_water_ = 0;
  last_step_position_ = -1;
}

Result<StepPlan> Sequence::plan(CacheId id, int32_t position, int32_t n_tokens) const {
  if (id < 0 || id >= layout_->n_caches())
    return Status::error("plan: cache id " + str(id) + " does not exist (the layout has " +
                         str(layout_->n_caches()) + " caches)");
  if (n_tokens < 1)
    return Status::error("plan: a step must write at least one token, got " + str(n_tokens));
  if (n_tokens > layout_->max_write())
    return Status::error("plan: a step of " + str(n_tokens) + " tokens exceeds max_write " +
                         str(layout_->max_write()) + "; chunk it");
  if (position != length_)
    return Status::error("plan: the step starts at position " + str(position) +
                         " but the sequence's length is " + str(length_) +
                         "; positions must continue the sequence (rewind first to write below it)");
  if (n_tokens > capacity() - position)
    return Status::error("plan: positions " + str(position) + ".." + str(position + n_tokens - 1) +
                         " exceed the capacity of " + str(capacity()) + " positions");

  const CacheLayout &c = layout_->cache(id);
  StepPlan p;
  p.cache = id;
  p.position = position;
  p.n_tokens = n_tokens;
  p.high_water_after = std::max(high_water_, p.end());
  const int32_t read_start =
      c.spec.attention.sliding() ? std::max(0, position - c.window() + 1) : 0;
  p.read_base_pos = read_start;
  p.high_water_before = high_water_;
  if (c.ring() && n_tokens > c.max_rows - c.window() + 1) {
    // Writing first would overwrite slots the step's first queries read: read the older rows as
    // they are, then write the step's last R positions (the rest would be overwritten at once).
    const int32_t kept = std::min(n_tokens, c.max_rows);
    p.deferred_write = true;
    p.write = split_ring(p.end() - kept, kept, c.max_rows);
    p.read = split_ring(read_start, position - read_start, c.max_rows);
  } else if (c.ring()) {
    p.write = split_ring(position, n_tokens, c.max_rows);
    p.read = split_ring(read_start, p.end() - read_start, c.max_rows);
  } else {
    p.write.run[0] = {position, n_tokens};
    p.write.count = 1;
    p.read.run[0] = {read_start, p.end() - read_start};
    p.read.count = 1;
  }
  return p;
}

Status Sequence::commit(const StepPlan &p) {
  if (p.cache < 0 || p.cache >= layout_->n_caches() || p.n_tokens < 1 || p.end() > capacity() ||
      p.n_tokens > layout_->max_write())
    return Status::error("commit: the plan does not belong to this sequence's layout");
  if (p.position == length_) {
    last_step_position_ = p.position;
    length_ = p.end();
    high_water_ = std::max(high_water_, length_);
    return ok_status();
  }
  if (p.position == last_step_position_ && p.end() == length_) return ok_status(); // repeat
  return Status::error("commit: the plan covers positions " + str(p.position) + ".." +
                       str(p.end() - 1) + " but the sequence's length is " + str(length_) +
                       " (a plan made before a rewind or another step is stale)");
}

std::vector<CacheRows> Sequence::ring_window_rows(int32_t from, int32_t end) const {
  std::vector<CacheRows> rows;
  for (CacheId id = 0; id < layout_->n_caches(); ++id) {
    const CacheLayout &c = layout_->cache(id);
    if (!c.ring() || c.window() <= 1) continue; // a window of 1 reads only the step's rows
    const int32_t start = std::max(0, from - c.window() + 1);
    if (end > start) rows.push_back({id, split_ring(start, end - start, c.max_rows)});
  }
  return rows;
}

void Sequence::materialize_at(int32_t end) {
  length_ = end;
  last_step_position_ = -1;
  // Only the window [end - w + 1, end) was copied into the rings' fresh storage. Naming the
  // high-water mark end + lead labels every other slot with a position in [end, end + lead):
  // later than any query, hence masked (a deferred write's step hides labels >= its position),
  // and each is overwritten before a query could see it. It also makes `end` the rewind floor,
  // which is exact: nothing older was copied.
  high_water_ = layout_->has_ring() ? end + layout_->ring_lead() : end;
}

void Sequence::record_truncation(int32_t new_length) {
  ++stamp_;
  while (!truncations_.empty() && truncations_.back().second >= new_length) truncations_.pop_back();
  truncations_.emplace_back(stamp_, new_length);
}

Result<ForkPlan> Sequence::plan_fork(int32_t n) const {
  if (n < 0 || n > length_)
    return Status::error("fork at " + str(n) + ": the source sequence holds " + str(length_) +
                         " positions");
  ForkPlan f;
  f.length = n;
  if (n == 0) return f;
  if (const int32_t floor = rewind_floor(); n < floor)
    return Status::error("fork at " + str(n) +
                         " refused: the source's rings no longer hold the "
                         "window before " +
                         str(n) + " (they hold it for lengths >= " + str(floor) +
                         "); restore a snapshot first");
  for (CacheId id = 0; id < layout_->n_caches(); ++id) {
    if (layout_->cache(id).ring()) continue;
    CacheRows r{id, {}};
    r.rows.run[0] = {0, n};
    r.rows.count = 1;
    f.copies.push_back(r);
  }
  for (const CacheRows &r : ring_window_rows(n, n)) f.copies.push_back(r);
  std::sort(f.copies.begin(), f.copies.end(),
            [](const CacheRows &a, const CacheRows &b) { return a.cache < b.cache; });
  return f;
}

Sequence Sequence::forked(const ForkPlan &plan) const {
  Sequence child(layout_);
  if (plan.length > 0) child.materialize_at(plan.length);
  return child;
}

RingSnapshot Sequence::describe_snapshot(int32_t reach) {
  RingSnapshot s;
  s.sequence_uid = uid_;
  s.taken_at = ++stamp_;
  s.length = length_;
  // A ring of R = window + lead - 1 slots holds positions [hw - R, hw); going back r positions
  // needs [length - r - window + 1, length), so r <= length + lead - hw.
  int32_t held = length_;
  for (CacheId id = 0; id < layout_->n_caches(); ++id)
    if (ring_limits_rewind(id)) held = std::min(held, length_ + layout_->ring_lead() - high_water_);
  s.reach = std::clamp(reach, 0, std::max(0, held));
  s.rows = ring_window_rows(length_ - s.reach, length_);
  return s;
}

Status Sequence::check_snapshot(const RingSnapshot &s, int32_t at) const {
  if (s.sequence_uid != uid_)
    return Status::error("restore: the snapshot belongs to another sequence");
  if (!s.resumes_at(at))
    return Status::error("restore at " + str(at) + ": the snapshot at " + str(s.length) +
                         " reaches back only to " + str(s.length - s.reach));
  if (at > length_)
    return Status::error("restore at " + str(at) + " but the sequence holds only " + str(length_) +
                         " positions, so its flat caches lack the rows between");
  auto later = std::upper_bound(
      truncations_.begin(), truncations_.end(), s.taken_at,
      [](uint64_t t, const std::pair<uint64_t, int32_t> &e) { return t < e.first; });
  if (later != truncations_.end() && later->second < at)
    return Status::error("restore: the sequence was rewound to " + str(later->second) +
                         " after the snapshot at " + str(s.length) +
                         " was taken, so the positions before " + str(at) +
                         " may have been rewritten");
  return ok_status();
}

Status Sequence::restore(const RingSnapshot &s, int32_t at) {
  if (at < 0) at = s.length;
  if (Status st = check_snapshot(s, at); !st.ok()) return st;
  if (at == 0) {
    clear();
    return ok_status();
  }
  record_truncation(at);
  length_ = at;
  last_step_position_ = -1;
  // The saved positions [B - reach - window + 1, B) (B the snapshot's length) are back at their
  // slots. Slots are labelled from the high-water mark, and restored position p is labelled p only
  // if hw <= p + R: lowering hw to B - reach + lead relabels the newer rows in between as
  // positions >= at (masked until rewritten) and makes B - reach the rewind floor. Where hw was
  // already within it (it is >= B: truncations since were >= at >= B - reach), every slot keeps
  // its true label and older rows that survived stay reachable by rewind.
  // A snapshot taken before its rings wrapped may reach back further than the lead; then the
  // bound is `at` itself: every slot is labelled below it, and only the restored window is near
  // enough for a query to see (hw never drops below the length: a step reads the slots under it).
  if (layout_->has_ring()) {
    const int32_t hi = s.length - s.reach + layout_->ring_lead();
    high_water_ = std::max(at, std::clamp(high_water_, std::min(s.length, hi), hi));
  } else
    high_water_ = std::min(high_water_, at + layout_->max_write());
  return ok_status();
}

} // namespace offgraph::cache
