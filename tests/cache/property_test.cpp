// Property test of the cache core against a naive model that keeps the whole history.
//
// Thousands of random operations (prefill chunks, decodes, rewinds, clears, forks, snapshots,
// restores, and invalid requests) run on random geometries with small windows. Beside each
// Sequence, the test simulates the physical storage the byte layer would hold: every cell records
// which logical position it holds and a unique tag for that write. Reading a plan's rows through
// this simulation must give exactly the window each query needs, with the tags of the current
// history; a step's writes must never land on a row its own queries still read; and every
// refusal (rewind, fork) must happen exactly when the simulated storage no longer holds the rows
// the next step would need.
#include "cache/sequence.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <random>
#include <set>

namespace offgraph::cache {
namespace {

struct Cell {
  int32_t pos = -1;
  uint64_t tag = 0;
  bool operator==(const Cell &) const = default;
};

struct Model {
  Sequence seq;
  std::vector<uint64_t> history;        // tag of each position's current token
  std::vector<std::vector<Cell>> store; // per cache: simulated physical rows
};

struct SavedSnapshot {
  size_t owner; // index into the model pool
  RingSnapshot spec;
  std::vector<uint64_t> history_prefix; // the history [0, length) when taken
  std::vector<std::vector<Cell>> saved; // per entry of spec.rows: the saved cells, in run order
};

// How often each outcome happened, so the test can insist that every path was exercised.
struct Tally {
  int64_t steps = 0, rewinds_ok = 0, rewinds_refused = 0, forks_ok = 0, forks_refused = 0,
          snapshots = 0, restores_ok = 0, restores_refused = 0, wrapped_writes = 0,
          wrapped_reads = 0, shared_replans = 0, deferred_writes = 0;
};

class Harness {
public:
  Harness(uint64_t seed, Tally &tally) : rng_(seed), tally_(tally) {}

  int64_t run_geometry(int n_ops);
  // The same operations on a given layer list: `shared` last layers read donors. Returns the
  // operations done (0 when the geometry is refused).
  int64_t run_layers(const std::vector<LayerSpec> &layers, int32_t shared, int n_ops);

private:
  int64_t run_on(Geometry geo, int n_ops);
  int32_t uniform(int32_t lo, int32_t hi) {
    return std::uniform_int_distribution<int32_t>(lo, hi)(rng_);
  }
  bool chance(double p) { return std::bernoulli_distribution(p)(rng_); }

  Model fresh_model() const {
    Model m{Sequence(layout_), {}, {}};
    for (CacheId c = 0; c < layout_->n_caches(); ++c)
      m.store.emplace_back(size_t(layout_->cache(c).max_rows));
    return m;
  }
  int32_t window(CacheId c) const { return layout_->cache(c).window(); }
  bool resident(const Model &m, CacheId c, int32_t p) const {
    const CacheLayout &cl = layout_->cache(c);
    const Cell &cell = m.store[size_t(c)][size_t(cl.ring() ? p % cl.max_rows : p)];
    return cell.pos == p && cell.tag == m.history[size_t(p)];
  }
  // Positions a step at `at` reads besides its own rows, on cache c.
  int32_t needed_from(CacheId c, int32_t at) const {
    return window(c) > 0 ? std::max(0, at - window(c) + 1) : 0;
  }
  // The truth the core must agree with: can a step at length `at` find what it needs?
  bool naive_can_continue_at(const Model &m, int32_t at) const {
    if (at == 0) return true;
    for (CacheId c = 0; c < layout_->n_caches(); ++c)
      for (int32_t p = needed_from(c, at); p < at; ++p)
        if (!resident(m, c, p)) return false;
    return true;
  }

  void op_step(Model &m, int32_t n);
  void op_rewind(Model &m);
  void op_fork(size_t src);
  void op_snapshot(size_t owner);
  void op_restore();
  void op_invalid(Model &m);
  void check_floor(const Model &m);

  std::mt19937_64 rng_;
  Tally &tally_;
  std::shared_ptr<const Layout> layout_;
  std::vector<Model> pool_;
  std::vector<SavedSnapshot> snapshots_;
  uint64_t next_tag_ = 1;
};

void Harness::op_step(Model &m, int32_t n) {
  const int32_t at = m.seq.length();
  const Geometry &geo = layout_->geometry();
  std::vector<std::optional<StepPlan>> plans(size_t(layout_->n_caches()));
  std::vector<uint64_t> tags;
  for (int32_t i = 0; i < n; ++i) tags.push_back(next_tag_++);

  // Plan per layer, as a model would call update_and_attend; shared layers re-plan their donor.
  for (int32_t layer = 0; layer < geo.n_layers(); ++layer) {
    const CacheId c = geo.cache_of_layer(layer);
    auto p = m.seq.plan(c, at, n);
    ASSERT_TRUE(p.ok()) << p.message();
    if (plans[size_t(c)]) {
      EXPECT_EQ(p->write, plans[size_t(c)]->write) << "re-plan of a shared cache differs";
      EXPECT_EQ(p->read, plans[size_t(c)]->read);
      EXPECT_EQ(p->read_base_pos, plans[size_t(c)]->read_base_pos);
      EXPECT_EQ(p->deferred_write, plans[size_t(c)]->deferred_write);
      ++tally_.shared_replans;
      continue;
    }
    plans[size_t(c)] = *p;
  }

  for (CacheId c = 0; c < layout_->n_caches(); ++c) {
    const StepPlan &p = *plans[size_t(c)];
    const CacheLayout &cl = layout_->cache(c);
    std::vector<Cell> &store = m.store[size_t(c)];
    const int32_t from = needed_from(c, at);
    // A ring step longer than the ring's lead reads its older rows, attends its own from the
    // step, and then writes its last R positions; every other step writes first.
    const bool deferred = cl.ring() && n > cl.max_rows - window(c) + 1;
    ASSERT_EQ(p.deferred_write, deferred);
    ASSERT_EQ(p.read_base_pos, from);
    ASSERT_EQ(p.read.total(), (deferred ? at : at + n) - from);
    const int32_t kept = deferred ? std::min(n, cl.max_rows) : n;
    ASSERT_EQ(p.write.total(), kept);
    tally_.deferred_writes += deferred;
    tally_.wrapped_writes += p.write.count == 2;
    tally_.wrapped_reads += p.read.count == 2;
    // Rows read in order, each with the logical position it must hold.
    std::vector<std::pair<int32_t, int32_t>> read_rows; // (row, position)
    int32_t pos = p.read_base_pos;
    for (const Run &r : p.read) {
      ASSERT_GE(r.start, 0);
      ASSERT_LE(r.end(), cl.max_rows);
      for (int32_t row = r.start; row < r.end(); ++row) read_rows.emplace_back(row, pos++);
    }
    // Before the write: every older row the step reads is the history's, and no write lands on
    // one of them.
    std::set<int32_t> old_rows;
    for (auto [row, q] : read_rows)
      if (q < at) {
        ASSERT_EQ(store[size_t(row)], (Cell{q, m.history[size_t(q)]}))
            << "cache " << c << " row " << row << " should hold position " << q;
        old_rows.insert(row);
      }
    auto write = [&] {
      int32_t wpos = at + n - kept;
      for (const Run &r : p.write) {
        ASSERT_GE(r.start, 0);
        ASSERT_LE(r.end(), cl.max_rows);
        for (int32_t row = r.start; row < r.end(); ++row, ++wpos) {
          ASSERT_TRUE(deferred || old_rows.count(row) == 0)
              << "the step overwrites row " << row << " it reads";
          store[size_t(row)] = Cell{wpos, tags[size_t(wpos - at)]};
        }
      }
      ASSERT_EQ(wpos, at + n);
    };
    if (!deferred) write();
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    // Each query's visible rows are exactly its window, with the right tags: after the write, or,
    // deferred, the older rows before it and the step's own rows from the step.
    for (int32_t q = at; q < at + n; ++q) {
      const int32_t lo = window(c) > 0 ? std::max(0, q - window(c) + 1) : 0;
      int32_t seen = 0;
      for (auto [row, kp] : read_rows) {
        const bool visible = kp <= q && (window(c) == 0 || q - kp < window(c));
        if (!visible) continue;
        ++seen;
        const uint64_t want = kp < at ? m.history[size_t(kp)] : tags[size_t(kp - at)];
        ASSERT_EQ(store[size_t(row)], (Cell{kp, want}));
      }
      if (deferred) seen += q - std::max(at, lo) + 1;
      ASSERT_EQ(seen, q - lo + 1) << "query " << q << " on cache " << c;
    }
    // Deferred, in physical order: the slots labelled from the high-water mark before the step,
    // labels at or past the step's position hidden, then the step's own rows.
    if (deferred) {
      for (int32_t q = at; q < at + n; ++q) {
        int32_t seen = 0;
        for (int32_t slot = 0; slot < std::min(cl.max_rows, p.high_water_before); ++slot) {
          const int32_t label = ring_slot_position(cl.max_rows, p.high_water_before, slot);
          if (label < 0 || label >= at || label > q || q - label >= window(c)) continue;
          ++seen;
          ASSERT_EQ(store[size_t(slot)], (Cell{label, m.history[size_t(label)]}))
              << "slot " << slot << " q " << q;
        }
        seen += q - std::max(at, q - window(c) + 1) + 1;
        ASSERT_EQ(seen, q - std::max(0, q - window(c) + 1) + 1)
            << "at " << at << " n " << n << " hw before " << p.high_water_before << " R "
            << cl.max_rows << " window " << window(c) << " lead " << layout_->ring_lead();
      }
      write();
      ASSERT_FALSE(::testing::Test::HasFatalFailure());
    }
    // Physical-order addressing: attending the whole ring with slot labels from the high-water
    // mark sees exactly the same rows.
    if (cl.ring() && !deferred) {
      for (int32_t q = at; q < at + n; ++q) {
        int32_t seen = 0;
        for (int32_t slot = 0; slot < cl.max_rows; ++slot) {
          const int32_t label = ring_slot_position(cl.max_rows, p.high_water_after, slot);
          if (label < 0 || label > q || q - label >= window(c)) continue;
          ++seen;
          const uint64_t want = label < at ? m.history[size_t(label)] : tags[size_t(label - at)];
          ASSERT_EQ(store[size_t(slot)], (Cell{label, want})) << "slot " << slot << " q " << q;
        }
        ASSERT_EQ(seen, q - std::max(0, q - window(c) + 1) + 1);
      }
    }
  }
  for (CacheId c = 0; c < layout_->n_caches(); ++c) {
    ASSERT_TRUE(m.seq.commit(*plans[size_t(c)]).ok());
    ASSERT_TRUE(m.seq.commit(*plans[size_t(c)]).ok()); // idempotent
  }
  m.history.insert(m.history.end(), tags.begin(), tags.end());
  ASSERT_EQ(m.seq.length(), int32_t(m.history.size()));
  ++tally_.steps;
}

void Harness::op_rewind(Model &m) {
  const int32_t to = uniform(0, m.seq.length());
  const bool expect = naive_can_continue_at(m, to);
  Status st = m.seq.rewind(to);
  ASSERT_EQ(st.ok(), expect) << "rewind " << m.seq.length() << " -> " << to << ": " << st.message();
  if (st.ok()) m.history.resize(size_t(to));
  ++(st.ok() ? tally_.rewinds_ok : tally_.rewinds_refused);
  ASSERT_EQ(m.seq.length(), int32_t(m.history.size()));
}

void Harness::op_fork(size_t src) {
  Model &m = pool_[src];
  const int32_t n = uniform(0, m.seq.length());
  const bool expect = naive_can_continue_at(m, n);
  auto plan = m.seq.plan_fork(n);
  ASSERT_EQ(plan.ok(), expect) << "fork at " << n << " of " << m.seq.length() << ": "
                               << plan.message();
  ++(plan.ok() ? tally_.forks_ok : tally_.forks_refused);
  if (!plan.ok()) return;
  Model child = fresh_model();
  child.seq = m.seq.forked(*plan);
  child.history.assign(m.history.begin(), m.history.begin() + n);
  int64_t copied = 0, minimum = 0;
  for (const CacheRows &cr : plan->copies)
    for (const Run &r : cr.rows)
      for (int32_t row = r.start; row < r.end(); ++row, ++copied)
        child.store[size_t(cr.cache)][size_t(row)] = m.store[size_t(cr.cache)][size_t(row)];
  for (CacheId c = 0; c < layout_->n_caches(); ++c)
    minimum += layout_->cache(c).ring() ? n - needed_from(c, n) : n;
  ASSERT_EQ(copied, minimum) << "a fork copies exactly what the child can use";
  ASSERT_EQ(child.seq.length(), n);
  ASSERT_TRUE(naive_can_continue_at(child, n));
  if (pool_.size() < 4)
    pool_.push_back(std::move(child));
  else
    pool_[size_t(uniform(0, 3))] = std::move(child);
  // Snapshots of a replaced sequence can no longer be restored anywhere; drop them.
  std::erase_if(snapshots_, [&](const SavedSnapshot &s) {
    return std::none_of(pool_.begin(), pool_.end(),
                        [&](const Model &x) { return x.seq.uid() == s.spec.sequence_uid; });
  });
}

void Harness::op_snapshot(size_t owner) {
  Model &m = pool_[owner];
  const int32_t asked = chance(0.5) ? 0 : uniform(1, 2 * layout_->max_write());
  SavedSnapshot s{owner, m.seq.describe_snapshot(asked), m.history, {}};
  // The reach is what was asked, cut to what is resident: every position it resumes must be.
  ASSERT_LE(s.spec.reach, asked);
  for (int32_t at = s.spec.length - s.spec.reach; at <= s.spec.length; ++at)
    ASSERT_TRUE(naive_can_continue_at(m, at)) << "reach " << s.spec.reach << " at " << at;
  int64_t expected_rows = 0;
  for (CacheId c = 0; c < layout_->n_caches(); ++c)
    if (layout_->cache(c).ring() && window(c) > 1)
      expected_rows += m.seq.length() - needed_from(c, m.seq.length() - s.spec.reach);
  ASSERT_EQ(s.spec.total_rows(), expected_rows);
  for (const CacheRows &cr : s.spec.rows) {
    std::vector<Cell> cells;
    for (const Run &r : cr.rows)
      for (int32_t row = r.start; row < r.end(); ++row)
        cells.push_back(m.store[size_t(cr.cache)][size_t(row)]);
    s.saved.push_back(std::move(cells));
  }
  snapshots_.push_back(std::move(s));
  ++tally_.snapshots;
  if (snapshots_.size() > 6) snapshots_.erase(snapshots_.begin());
}

void Harness::op_restore() {
  if (snapshots_.empty()) return;
  const SavedSnapshot &s = snapshots_[size_t(uniform(0, int32_t(snapshots_.size()) - 1))];
  auto owner = std::find_if(pool_.begin(), pool_.end(),
                            [&](const Model &x) { return x.seq.uid() == s.spec.sequence_uid; });
  ASSERT_NE(owner, pool_.end());
  Model &m = *owner;
  // Anywhere in the snapshot's reach. Naive validity: the current history still starts with the
  // snapshot's first `at` positions.
  const int32_t at = uniform(s.spec.length - s.spec.reach, s.spec.length);
  const size_t b = size_t(at);
  const bool expect =
      m.history.size() >= b &&
      std::equal(s.history_prefix.begin(), s.history_prefix.begin() + long(b), m.history.begin());
  Status st = m.seq.restore(s.spec, at);
  ASSERT_EQ(st.ok(), expect) << st.message();
  ++(st.ok() ? tally_.restores_ok : tally_.restores_refused);
  if (!st.ok()) return;
  for (size_t i = 0; i < s.spec.rows.size(); ++i) {
    const CacheRows &cr = s.spec.rows[i];
    size_t k = 0;
    for (const Run &r : cr.rows)
      for (int32_t row = r.start; row < r.end(); ++row)
        m.store[size_t(cr.cache)][size_t(row)] = s.saved[i][k++];
  }
  m.history.resize(b);
  ASSERT_TRUE(naive_can_continue_at(m, int32_t(b)));
  // A restore into another sequence is always refused.
  for (Model &x : pool_)
    if (x.seq.uid() != s.spec.sequence_uid) {
      ASSERT_FALSE(x.seq.restore(s.spec).ok());
    }
}

void Harness::op_invalid(Model &m) {
  const int32_t at = m.seq.length();
  switch (uniform(0, 3)) {
  case 0: // a position that does not continue the sequence
    if (at > 0) {
      ASSERT_FALSE(m.seq.plan(0, uniform(0, at - 1), 1).ok());
    }
    ASSERT_FALSE(m.seq.plan(0, at + uniform(1, 5), 1).ok());
    break;
  case 1: // longer than max_write
    ASSERT_FALSE(m.seq.plan(0, at, layout_->max_write() + uniform(1, 3)).ok());
    break;
  case 2: // past the capacity
    if (layout_->capacity() - at < layout_->max_write()) {
      ASSERT_FALSE(m.seq.plan(0, at, layout_->capacity() - at + 1).ok());
    }
    break;
  default: // rewind forward
    ASSERT_FALSE(m.seq.rewind(at + uniform(1, 3)).ok());
  }
  ASSERT_EQ(m.seq.length(), at) << "a refusal must change nothing";
}

void Harness::check_floor(const Model &m) {
  const int32_t floor = m.seq.rewind_floor();
  ASSERT_LE(floor, m.seq.length());
  for (int32_t at = std::max(1, floor - 2); at <= m.seq.length(); ++at)
    ASSERT_EQ(naive_can_continue_at(m, at), at >= floor) << "floor " << floor << " at " << at;
}

int64_t Harness::run_geometry(int n_ops) {
  const int32_t n_layers = uniform(1, 6);
  std::vector<LayerSpec> layers;
  for (int32_t i = 0; i < n_layers; ++i) {
    const int32_t w = chance(0.35) ? 0 : (chance(0.5) ? uniform(1, 8) : uniform(1, 64));
    layers.push_back(testing::layer(w));
  }
  const int32_t shared = uniform(0, n_layers - 1);
  auto geo = Geometry::build(layers, shared);
  // Naive donor rule: each shared layer needs a same-kind layer before the shared block.
  bool donors = true;
  for (int32_t i = n_layers - shared; i < n_layers; ++i)
    donors = donors && std::any_of(layers.begin(), layers.begin() + (n_layers - shared),
                                   [&](const LayerSpec &l) {
                                     return l.attention == layers[size_t(i)].attention;
                                   });
  EXPECT_EQ(geo.ok(), donors) << geo.message();
  if (!geo.ok()) return 0;
  return run_on(std::move(geo).value(), n_ops);
}

int64_t Harness::run_layers(const std::vector<LayerSpec> &layers, int32_t shared, int n_ops) {
  auto geo = Geometry::build(layers, shared);
  EXPECT_TRUE(geo.ok()) << geo.message();
  if (!geo.ok()) return 0;
  return run_on(std::move(geo).value(), n_ops);
}

int64_t Harness::run_on(Geometry geo, int n_ops) {
  const int32_t capacity = uniform(1, 320);
  const int32_t max_write = uniform(1, std::min(capacity, chance(0.5) ? 4 : 70));
  // Ring reaches from none (rings of the window alone) to past max_write (rings that always have
  // room for a step's rows before it reads).
  auto layout = Layout::make(std::move(geo), Policy{capacity, max_write, uniform(1, 64),
                                                    chance(0.3) ? 64 : uniform(0, 8)});
  EXPECT_TRUE(layout.ok()) << layout.message();
  layout_ = *layout;
  pool_.clear();
  snapshots_.clear();
  pool_.push_back(fresh_model());

  int64_t done = 0;
  for (int i = 0; i < n_ops; ++i, ++done) {
    const size_t k = size_t(uniform(0, int32_t(pool_.size()) - 1));
    Model &m = pool_[k];
    const int32_t room = std::min(layout_->max_write(), m.seq.capacity() - m.seq.length());
    const int32_t pick = uniform(0, 99);
    if (pick < 35 && room > 0)
      op_step(m, uniform(1, room));
    else if (pick < 60 && room > 0)
      op_step(m, 1);
    else if (pick < 72)
      op_rewind(m);
    else if (pick < 74)
      m.seq.clear(), m.history.clear();
    else if (pick < 80)
      op_fork(k);
    else if (pick < 86)
      op_snapshot(k);
    else if (pick < 92)
      op_restore();
    else if (pick < 96)
      op_invalid(m);
    else
      check_floor(m);
    if (::testing::Test::HasFatalFailure() || ::testing::Test::HasNonfatalFailure()) return done;
  }
  return done;
}

TEST(CacheProperty, RandomOperationsAgreeWithTheNaiveModel) {
  Tally t;
  int64_t ops = 0;
  int geometries = 0;
  for (uint64_t seed = 1; ops < 100000; ++seed) {
    Harness h(seed, t);
    const int64_t n = h.run_geometry(150);
    if (HasFailure()) {
      ADD_FAILURE() << "seed " << seed;
      return;
    }
    ops += n;
    geometries += n > 0;
  }
  std::printf(
      "[ property ] %lld random operations on %d geometries agreed with the naive model:\n"
      "             %lld steps (%lld wrapped writes, %lld wrapped reads, %lld shared re-plans,\n"
      "             %lld writes after the reads),\n"
      "             rewinds %lld allowed / %lld refused, forks %lld / %lld, %lld snapshots,\n"
      "             restores %lld / %lld\n",
      (long long)ops, geometries, (long long)t.steps, (long long)t.wrapped_writes,
      (long long)t.wrapped_reads, (long long)t.shared_replans, (long long)t.deferred_writes,
      (long long)t.rewinds_ok, (long long)t.rewinds_refused, (long long)t.forks_ok,
      (long long)t.forks_refused, (long long)t.snapshots, (long long)t.restores_ok,
      (long long)t.restores_refused);
  EXPECT_GE(ops, 10000);
  // Every path must have been taken, or the run proves less than it claims.
  for (int64_t count :
       {t.wrapped_writes, t.wrapped_reads, t.shared_replans, t.deferred_writes, t.rewinds_ok,
        t.rewinds_refused, t.forks_ok, t.forks_refused, t.restores_ok, t.restores_refused})
    EXPECT_GT(count, 100);
}

// Gemma 4's released layouts (config.json of E2B, E4B and 31B: layer types and
// num_kv_shared_layers), windows cut to test sizes: every 5th (E2B) or 6th layer global, the last
// 20 (E2B) or 18 (E4B) reading a donor.
struct ReleasedLayout {
  const char *name;
  int32_t n_layers, period, shared;
};
constexpr ReleasedLayout kGemma4Layouts[] = {
    {"E2B", 35, 5, 20}, {"E4B", 42, 6, 18}, {"31B", 60, 6, 0}};

std::vector<LayerSpec> released_layers(const ReleasedLayout &r, int32_t window) {
  std::vector<LayerSpec> layers;
  for (int32_t i = 0; i < r.n_layers; ++i)
    layers.push_back(i % r.period == r.period - 1 ? testing::layer(0, 1, 16, 16)
                                                  : testing::layer(window, 2, 8, 8));
  return layers;
}

// The donors are llama.cpp's (llama-model.cpp: reuse(il) = n_kv - (is_swa(il) ? 2 : 1)) and
// transformers' (the last cache-owning layer of the same kind); shared layers own nothing.
TEST(CacheProperty, Gemma4ReleasedLayoutsMapSharedLayersToTheirDonors) {
  for (const ReleasedLayout &r : kGemma4Layouts) {
    const auto layers = released_layers(r, 6);
    auto geo = Geometry::build(layers, r.shared);
    ASSERT_TRUE(geo.ok()) << r.name << ": " << geo.message();
    const int32_t n_kv = r.n_layers - r.shared;
    EXPECT_EQ(geo->n_caches(), n_kv) << r.name;
    for (int32_t il = 0; il < r.n_layers; ++il) {
      const int32_t owner = geo->cache(geo->cache_of_layer(il)).owner_layer;
      if (il < n_kv) {
        EXPECT_EQ(owner, il) << r.name << " layer " << il;
        EXPECT_FALSE(geo->is_shared_layer(il));
      } else {
        // llama.cpp's formula, and transformers' rule: the last owner of the same kind.
        EXPECT_EQ(owner, n_kv - (layers[size_t(il)].attention.sliding() ? 2 : 1))
            << r.name << " layer " << il;
        int32_t last_same_kind = n_kv - 1;
        while (layers[size_t(last_same_kind)].attention != layers[size_t(il)].attention)
          --last_same_kind;
        EXPECT_EQ(owner, last_same_kind) << r.name << " layer " << il;
        EXPECT_TRUE(geo->is_shared_layer(il));
      }
      EXPECT_EQ(geo->cache(geo->cache_of_layer(il)).attention, layers[size_t(il)].attention);
    }
  }
}

// The random operations of the test above on the released layouts, where most layers re-plan a
// donor's cache: every shared layer's plan must be its donor's, every read the history's.
TEST(CacheProperty, RandomOperationsOnGemma4ReleasedLayouts) {
  Tally t;
  int64_t ops = 0;
  uint64_t seed = 1000;
  for (const ReleasedLayout &r : kGemma4Layouts)
    for (int32_t window : {1, 3, 8, 37}) {
      for (int rep = 0; rep < 3; ++rep, ++seed) {
        Harness h(seed, t);
        ops += h.run_layers(released_layers(r, window), r.shared, 200);
        if (HasFailure()) {
          ADD_FAILURE() << r.name << " window " << window << " seed " << seed;
          return;
        }
      }
    }
  EXPECT_EQ(ops, 3 * 4 * 3 * 200);
  for (int64_t count : {t.wrapped_writes, t.wrapped_reads, t.shared_replans, t.rewinds_ok,
                        t.rewinds_refused, t.forks_ok, t.restores_ok})
    EXPECT_GT(count, 20);
}

} // namespace
} // namespace offgraph::cache
