// The KV budget against a naive model of admission: random submits, cancels and steps under tiny
// budgets. A request is refused exactly when the most it can hold (every choice at prompt +
// max_tokens, and the snapshot at its prompt's end: the naive model's sum from the store's own
// per-length figure) passes the budget alone; every accepted request ends once, finished or
// cancelled, never with an error (the store refuses growth past the budget, so a request the
// engine admitted without room for its growth would end with one); after every step the store
// holds no more than the budget. A mutation that admits without checking memory fails it.
#include "engine_util.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

namespace offgraph::engine {
namespace {

using testing::fixture;
using testing::options;
using testing::random_tokens;

struct Outcome {
  int32_t choices = 1, ended = 0;
  bool errored = false;
  std::string error;
};

struct Counts {
  int64_t refused = 0, waits = 0;
};

void run_random_admissions(uint64_t seed, Counts &counts) {
  std::mt19937_64 rng(seed);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  EngineOptions o = options(uniform(0, 3));
  o.page_rows = 8;
  o.max_active = uniform(1, 4);
  o.snapshot_every = 0, o.start_snapshots = false; // snapshots: the prompt end's only
  o.max_queue = 1000;                              // every refusal is the budget's
  auto probe = Engine::create(*fixture().model, o);
  ASSERT_TRUE(probe.ok());
  const kv::KvStore &store = (*probe)->store();
  // A naive model of the most a request can hold.
  auto naive_peak = [&](const Request &r) {
    return int64_t(r.n) * store.peak_bytes_at_length(int32_t(r.prompt.size()) + r.max_tokens) +
           store.peak_bytes_at_length(0);
  };
  const int64_t small = store.peak_bytes_at_length(40) + store.peak_bytes_at_length(0);
  o.kv_budget = small + int64_t(uniform(0, 300)) * small / 100; // one to four small requests
  auto created = Engine::create(*fixture().model, o);
  ASSERT_TRUE(created.ok());
  Engine &e = **created;
  std::vector<std::vector<int32_t>> bases;
  for (int i = 0; i < 3; ++i) bases.push_back(random_tokens(rng, size_t(uniform(10, 50))));
  std::map<uint64_t, Outcome> outcomes;
  std::vector<uint64_t> live;
  int refused = 0, accepted = 0;
  for (int op = 0; op < 240; ++op) {
    const int kind = uniform(0, 9);
    if (kind < 4) {
      Request r;
      r.prompt = bases[size_t(uniform(0, 2))];
      r.prompt.resize(size_t(uniform(1, int(r.prompt.size()))));
      const auto tail = random_tokens(rng, size_t(uniform(1, 40)));
      r.prompt.insert(r.prompt.end(), tail.begin(), tail.end());
      r.max_tokens = uniform(1, 40);
      r.n = uniform(1, 3);
      r.sampling.temperature = 0;
      const bool fits = naive_peak(r) <= o.kv_budget;
      EXPECT_EQ(e.peak_kv_bytes(r), naive_peak(r));
      auto id = e.submit(r, [&outcomes](const Event &ev) {
        if (ev.finish == FinishReason::None) return;
        Outcome &out = outcomes[ev.request];
        ++out.ended;
        if (ev.finish == FinishReason::Error) out.errored = true, out.error = ev.error;
      });
      EXPECT_EQ(id.ok(), fits) << "peak " << naive_peak(r) << ", budget " << o.kv_budget << ": "
                               << (id.ok() ? "accepted" : id.message());
      if (!id.ok()) {
        ++refused;
        EXPECT_NE(id.message().find("--kv-mib"), std::string::npos) << id.message();
        continue;
      }
      ++accepted;
      outcomes[*id].choices = r.n;
      live.push_back(*id);
    } else if (kind == 4 && !live.empty()) {
      e.cancel(live[size_t(uniform(0, int(live.size()) - 1))]);
    } else {
      e.step();
      EXPECT_LE(e.store().bytes_in_use(), o.kv_budget);
      // What the store counts as pages join and leave tables, against a walk of every table.
      EXPECT_EQ(e.cached_bytes(), e.cached_bytes_walked()) << "op " << op;
    }
  }
  for (int i = 0; i < 100000 && e.step(); ++i) {
    EXPECT_LE(e.store().bytes_in_use(), o.kv_budget);
    EXPECT_EQ(e.cached_bytes(), e.cached_bytes_walked());
  }
  EXPECT_EQ(e.active(), 0u);
  EXPECT_EQ(e.queued(), 0u);
  EXPECT_GT(accepted, 0);
  for (const auto &[id, out] : outcomes) {
    EXPECT_FALSE(out.errored) << "request " << id << ": " << out.error;
    EXPECT_EQ(out.ended, out.choices) << "request " << id;
  }
  counts.refused += refused;
  counts.waits += e.stats().waits_for_memory;
}

TEST(KvBudget, RandomAdmissionsStayInsideATinyBudgetAndRefuseOnlyWhatCannotFit) {
  Counts counts;
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    run_random_admissions(seed, counts);
    if (HasFatalFailure() || HasNonfatalFailure()) break;
  }
  // Both sides of the rule were exercised: refusals, and requests that waited for memory.
  EXPECT_GT(counts.refused, 10);
  EXPECT_GT(counts.waits, 10);
}

} // namespace
} // namespace offgraph::engine
