// Soak: 10,000 requests, 16 computed at once, over the prefix tree: branches of eight
// conversations, regenerations, shared prefixes, two choices now and then, a tenth cancelled
// mid-stream. Every accepted request must end exactly once (finished or cancelled, never an
// error); afterwards only what the cache keeps remains (sequences, pages, snapshots, tree nodes),
// and the resident memory after the run is within a stated bound of what it was after the first
// thousand requests (the page pool reuses pages; nothing may grow with the number of requests).
#include "engine_util.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <random>
#include <set>

namespace offgraph::engine {
namespace {

using testing::fixture;
using testing::options;
using testing::random_tokens;

int64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages_total = 0, pages_resident = 0;
  statm >> pages_total >> pages_resident;
  return pages_resident * int64_t(sysconf(_SC_PAGESIZE));
}

TEST(Soak, TenThousandRequestsEndExactlyOnceAndLeaveOnlyTheCache) {
  std::mt19937_64 rng(37);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  EngineOptions o = options(12);
  o.page_rows = 8;
  o.max_active = 16;
  o.step_tokens = 96;
  o.max_queue = 64;
  o.snapshot_every = 16;
  o.cache_budget = 4 << 20;
  auto created = Engine::create(*fixture().model, o);
  ASSERT_TRUE(created.ok()) << created.message();
  Engine &e = **created;
  std::vector<std::vector<int32_t>> bases;
  for (int i = 0; i < 8; ++i) bases.push_back(random_tokens(rng, size_t(uniform(40, 80))));
  std::vector<std::vector<int32_t>> recent; // earlier prompts, for regenerations

#ifdef OFFGRAPH_SOAK_SANITIZED
  constexpr int kRequests = 1000;
#else
  constexpr int kRequests = 10000;
#endif
  struct Outcome {
    int32_t choices = 1, ended = 0, tokens = 0;
    bool cancel = false, errored = false;
    std::string error;
  };
  std::map<uint64_t, Outcome> outcomes;
  int64_t in_flight = 0, submitted = 0, cancelled = 0, finished = 0, baseline = 0;
  while (finished < kRequests) {
    while (submitted < kRequests && in_flight < 32) {
      Request r;
      const int kind = uniform(0, 9);
      if (kind < 2 && !recent.empty()) {
        r.prompt = recent[size_t(uniform(0, int(recent.size()) - 1))]; // a regeneration
      } else {
        r.prompt = bases[size_t(uniform(0, 7))];
        r.prompt.resize(size_t(uniform(20, int(r.prompt.size()))));
        const auto tail = random_tokens(rng, size_t(uniform(1, 12)));
        r.prompt.insert(r.prompt.end(), tail.begin(), tail.end());
      }
      if (recent.size() < 64)
        recent.push_back(r.prompt);
      else
        recent[size_t(uniform(0, 63))] = r.prompt;
      r.sampling.temperature = 0.8f;
      r.sampling.seed = uint64_t(submitted);
      r.max_tokens = uniform(2, 8);
      r.n = uniform(0, 19) == 0 ? 2 : 1;
      const bool cancel = submitted % 10 == 3;
      auto id = std::make_shared<uint64_t>(0);
      auto sent = e.submit(r, [&, id, cancel](const Event &ev) {
        Outcome &out = outcomes[*id];
        if (ev.token >= 0 && ++out.tokens == 1 && cancel) e.cancel(*id); // mid-stream
        if (ev.finish == FinishReason::None) return;
        if (ev.finish == FinishReason::Error) out.errored = true, out.error = ev.error;
        if (++out.ended == out.choices) --in_flight, ++finished;
      });
      ASSERT_TRUE(sent.ok()) << sent.message();
      *id = *sent;
      outcomes[*sent] = Outcome{r.n, 0, 0, cancel, false, ""};
      ++in_flight, ++submitted;
      cancelled += cancel;
    }
    ASSERT_TRUE(e.step() || finished == kRequests) << "the engine stalled";
    if (finished >= kRequests / 10 && baseline == 0) baseline = resident_bytes();
  }
  while (e.step()) {
  }
  for (const auto &[id, out] : outcomes) {
    ASSERT_FALSE(out.errored) << "request " << id << ": " << out.error;
    ASSERT_EQ(out.ended, out.choices) << "request " << id << " ended " << out.ended << " times";
  }
  EXPECT_EQ(cancelled, kRequests / 10);
  EXPECT_EQ(e.active(), 0u);
  EXPECT_EQ(e.queued(), 0u);
  // What remains is the cache: its sequences only, the pages they hold, the tree's snapshots.
  const kv::KvStore &store = e.store();
  EXPECT_EQ(store.sequence_ids().size(), e.cached());
  EXPECT_LE(e.cached(), size_t(o.max_cached));
  EXPECT_LE(e.cached_bytes(), o.cache_budget);
  std::map<cache::PageId, int32_t> held; // table entries naming each page
  for (kv::SeqId id : store.sequence_ids())
    for (cache::PageId p : store.page_table(id)->pages) ++held[p];
  EXPECT_EQ(store.memory().pages, int64_t(held.size()));
  for (const auto &[page, n] : held) EXPECT_EQ(store.pages().refs(page), n) << "page " << page;
  EXPECT_EQ(e.tree().check(), "");
  EXPECT_EQ(e.tree().n_snapshots(), size_t(e.load().snapshots));
  EXPECT_LE(e.tree().n_nodes(), 4 * e.cached() + e.tree().n_snapshots());
  // Resident memory: within 32 MiB of where it stood after the first tenth of the requests.
  const int64_t now = resident_bytes();
  std::printf("[ soak     ] %d requests (%lld cancelled), %lld steps; %lld prompt tokens computed, "
              "%lld reused; %zu cached, %zu snapshots, %zu tree nodes, %lld pages; RSS %.1f MiB "
              "after a tenth, %.1f MiB at the end\n",
              kRequests, (long long)cancelled, (long long)e.stats().steps,
              (long long)e.stats().computed_prompt_tokens,
              (long long)e.stats().reused_prompt_tokens, e.cached(), e.tree().n_snapshots(),
              e.tree().n_nodes(), (long long)store.memory().pages, double(baseline) / (1 << 20),
              double(now) / (1 << 20));
#ifndef OFFGRAPH_SOAK_SANITIZED
  EXPECT_LT(now - baseline, int64_t(32) << 20);
#endif
  EXPECT_GT(e.stats().reused_prompt_tokens, e.stats().computed_prompt_tokens);
}

} // namespace
} // namespace offgraph::engine
