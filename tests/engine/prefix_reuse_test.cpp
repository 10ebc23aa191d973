// Prefix reuse through the tree: edits far back, concurrent continuations of one cached
// conversation, periodic snapshots inside long prompts. Each answer is checked against a fresh
// engine without prefix reuse (greedy, token for token), and each request's computed prompt
// tokens against what the deepest reusable point leaves to compute.
#include "engine_util.h"

#include <gtest/gtest.h>

#include <random>

namespace offgraph::engine {
namespace {

using testing::alone;
using testing::fixture;
using testing::greedy;
using testing::options;
using testing::random_tokens;
using testing::run;

EngineOptions paged(int32_t max_cached) {
  EngineOptions o = options(max_cached);
  o.page_rows = 8; // prefixes split pages, so forks share some and copy on write
  return o;
}

int64_t computed(const Engine &e) { return e.stats().computed_prompt_tokens; }

// Runs `r` alone on `e`, checks its answer against a fresh engine without prefix reuse, and returns
// the prompt tokens it computed.
int64_t computed_by(Engine &e, const Request &r) {
  const int64_t before = computed(e);
  EXPECT_EQ(run(e, {r})[0], alone(r));
  return computed(e) - before;
}

TEST(PrefixReuse, AnEditThreeTurnsBackResumesAtThePromptEndBeforeIt) {
  std::mt19937_64 rng(31);
  EngineOptions o = paged(4);
  o.snapshot_reach = 0; // snapshots resume only where taken (the reach: the test after next)
  auto e = Engine::create(*fixture().model, o);
  ASSERT_TRUE(e.ok()) << e.message();
  // Five turns; turn k's prompt is the history so far. Prompt ends: 30, 42, 54, 66, 78.
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int32_t> history = random_tokens(rng, 30);
  for (int turn = 0; turn < 5; ++turn) {
    prompts.push_back(history);
    run(**e, {greedy(history, 4)});
    const auto added = random_tokens(rng, 12);
    history.insert(history.end(), added.begin(), added.end());
  }
  EXPECT_EQ(computed(**e), 30 + 4 * 12);
  // Edit the message that followed turn 1's prompt (position 42 + 5), then continue.
  std::vector<int32_t> edited = prompts[4];
  edited[42 + 5] = (edited[42 + 5] + 1) % 500;
  // The deepest snapshot at or before position 47 is turn 1's prompt end, 42.
  EXPECT_EQ(computed_by(**e, greedy(edited, 10)), int64_t(edited.size()) - 42);
}

// A next turn renders the prompt's last tokens (a generation header) as another message, and the
// prompt was last answered from its snapshot (so no cached sequence's rings hold the positions
// before its end): the prompt end's snapshot reaches back to the divergence.
TEST(PrefixReuse, ASnapshotReachesBackToADivergenceJustBeforeItsPromptEnd) {
  std::mt19937_64 rng(35);
  auto e = Engine::create(*fixture().model, paged(4));
  ASSERT_TRUE(e.ok()) << e.message();
  const std::vector<int32_t> prompt = random_tokens(rng, 70);
  run(**e, {greedy(prompt, 1)});
  run(**e, {greedy(prompt, 6)}); // from the snapshot; it replaces the first in the cache
  std::vector<int32_t> next(prompt.begin(), prompt.end() - 3);
  const auto added = random_tokens(rng, 11);
  next.insert(next.end(), added.begin(), added.end());
  // Resumed at 67, 3 before the snapshot at 70.
  EXPECT_EQ(computed_by(**e, greedy(next, 8)), 11);
  // One token after the resume point: the restored rows of 68 and 69 (the old path's) stay in the
  // ring, masked, until the answer overwrites them.
  std::vector<int32_t> one(prompt.begin(), prompt.end() - 3);
  one.push_back((prompt[67] + 1) % 500);
  EXPECT_EQ(computed_by(**e, greedy(one, 6)), 1);
  // Beyond the reach (max_write here: 8), the prompt is computed from the start: no snapshot
  // before it and no cached sequence's rings hold position 60.
  std::vector<int32_t> far(prompt.begin(), prompt.end() - 10);
  far.insert(far.end(), added.begin(), added.end());
  EXPECT_EQ(computed_by(**e, greedy(far, 4)), int64_t(far.size()));
}

// A prompt end re-taken after a resume just before it saves fewer rows (the fork's rings hold
// only the window before 39): the periodic snapshot already there, reaching further back, stays
// and takes the prompt end's logits.
TEST(PrefixReuse, ASnapshotRetakenWithLessReachKeepsTheOneReachingFurther) {
  std::mt19937_64 rng(36);
  EngineOptions o = paged(4);
  o.snapshot_every = 40;
  auto e = Engine::create(*fixture().model, o);
  ASSERT_TRUE(e.ok()) << e.message();
  const std::vector<int32_t> doc = random_tokens(rng, 80);
  run(**e, {greedy(doc, 2)}); // snapshots at 40 (periodic: no logits, reach 8) and 80
  const std::vector<int32_t> half(doc.begin(), doc.begin() + 40);
  // From 39 (the snapshot's reach), for the logits at 40.
  EXPECT_EQ(computed_by(**e, greedy(half, 3)), 1);
  // The prompt end at 40 now has logits: the same prompt computes nothing.
  EXPECT_EQ(computed_by(**e, greedy(half, 3)), 0);
  // And the snapshot still reaches 8 back: a branch at 34 resumes there.
  std::vector<int32_t> branch(doc.begin(), doc.begin() + 34);
  const auto tail = random_tokens(rng, 5);
  branch.insert(branch.end(), tail.begin(), tail.end());
  EXPECT_EQ(computed_by(**e, greedy(branch, 4)), 5);
}

// With snapshot_every, a prefill chunk within snapshot_reach of a message start ends with a
// snapshot reaching back over it as far as the rings hold: an edit near a message's start
// resumes exactly at the edit, and no chunk is cut for it.
TEST(PrefixReuse, SnapshotsReachBackOverMessageStarts) {
  std::mt19937_64 rng(37);
  EngineOptions o = paged(8);
  o.snapshot_every = 1000; // no grid point inside these prompts
  o.snapshot_reach = 3;
  o.snapshot_budget = -1; // every snapshot kept (the budget's test is below)
  auto e = Engine::create(*fixture().model, o);
  ASSERT_TRUE(e.ok()) << e.message();
  Request first = greedy(random_tokens(rng, 80), 3);
  first.message_starts = {30, 49};
  // Chunks of max_write (8). Snapshots: 32 (reach 5: back to 27), 40 (8, all the rings hold:
  // 32), 48 (3, the chunk before 49: 45), 56 (8: 48) and the end, 80 (3: 77).
  EXPECT_EQ(computed_by(**e, first), 80);
  auto edit = [&](int32_t at) {
    Request r = first;
    r.prompt[size_t(at)] = (r.prompt[size_t(at)] + 1) % 500;
    return computed_by(**e, r);
  };
  EXPECT_EQ(edit(28), 80 - 28); // two before a start
  EXPECT_EQ(edit(34), 80 - 34); // four after it, in the next chunk
  EXPECT_EQ(edit(44), 80 - 40); // further in: the snapshot before it
  EXPECT_EQ(edit(46), 80 - 46); // the previous message's tail, in the chunk before the start
  EXPECT_EQ(edit(53), 80 - 53); // four into that message
  // Without message starts only the prompt end's snapshot (77-80) and the cached sequence's
  // rings (the last 23 positions) are there: an edit at 53 recomputes everything.
  Request plain = first;
  plain.message_starts.clear();
  plain.prompt[0] = (plain.prompt[0] + 1) % 500; // a path of its own
  EXPECT_EQ(computed_by(**e, plain), 80);
  plain.prompt[53] = (plain.prompt[53] + 1) % 500;
  EXPECT_EQ(computed_by(**e, plain), 80);
}

// Rings whose lead (ring_reach + 1) is shorter than a chunk: a chunk ending further past a start
// than the lead reaches no edit near it, and takes no snapshot; edits there resume from the
// chunk before, exactly.
TEST(PrefixReuse, StartSnapshotsOnlyWhereTheRingsReachTheStart) {
  std::mt19937_64 rng(37);
  EngineOptions o = paged(8);
  o.ring_reach = 2; // lead 3
  o.snapshot_every = 1000;
  o.snapshot_reach = 3;
  o.snapshot_budget = -1;
  auto e = Engine::create(*fixture().model, o);
  ASSERT_TRUE(e.ok()) << e.message();
  Request first = greedy(random_tokens(rng, 80), 3);
  first.message_starts = {30, 49};
  // Chunks of 8. Snapshots: 32 (back to 29), 48 (back to 45) and the prompt end; not 40 (its
  // rings reach 37, past 30 + 3) nor 56 (53, past 49 + 3).
  EXPECT_EQ(computed_by(**e, first), 80);
  EXPECT_EQ((*e)->load().snapshots, 3u);
  auto edit = [&](int32_t at) {
    Request r = first;
    r.prompt[size_t(at)] = (r.prompt[size_t(at)] + 1) % 500;
    return computed_by(**e, r);
  };
  EXPECT_EQ(edit(31), 80 - 31); // one after a start
  EXPECT_EQ(edit(44), 80 - 32); // the chunk after it: from the chunk before
  EXPECT_EQ(edit(47), 80 - 47); // two before the next start
  EXPECT_EQ(edit(51), 80 - 48); // two after it, past the reach of 56's rings
}

// Message-start snapshots are the default (no snapshot_every needed), under the snapshot budget:
// over it the least recently used start snapshot goes, never a prompt end's; off, an edit after
// a start recomputes from the prompt's beginning.
TEST(PrefixReuse, StartSnapshotsByDefaultUnderTheirBudget) {
  std::mt19937_64 rng(41);
  const auto prompt = random_tokens(rng, 80);
  auto run = [&](bool on, int64_t budget) {
    EngineOptions o = paged(8);
    o.snapshot_reach = 3;
    o.start_snapshots = on;
    o.snapshot_budget = budget;
    auto e = Engine::create(*fixture().model, o);
    EXPECT_TRUE(e.ok()) << e.message();
    Request first = greedy(prompt, 3);
    first.message_starts = {30, 49};
    EXPECT_EQ(computed_by(**e, first), 80);
    Request edited = first;
    edited.prompt[34] = (edited.prompt[34] + 1) % 500;
    const int32_t computed = computed_by(**e, edited);
    // The first prompt again: its end's snapshot (with logits) is never the budget's to drop.
    EXPECT_EQ(computed_by(**e, first), 0);
    return computed;
  };
  EXPECT_EQ(run(true, -1), 80 - 34); // the default: resumes at the edit
  EXPECT_EQ(run(false, -1), 80);     // off: the prompt end's snapshot is past the edit
  EXPECT_EQ(run(true, 1), 80);       // a budget too small for one: none kept
}

// A request's own start snapshots count against the budget while its prompt is computed: at no
// step do the store's snapshots exceed the budget by more than the prompt end's (which the budget
// does not take), however many message starts the prompt has.
TEST(PrefixReuse, ARequestsOwnStartSnapshotsStayWithinTheBudget) {
  std::mt19937_64 rng(43);
  EngineOptions o = paged(8);
  o.snapshot_reach = 3;
  o.snapshot_budget = -1;
  // One start snapshot's bytes, from a run without a budget.
  auto probe = Engine::create(*fixture().model, o);
  ASSERT_TRUE(probe.ok()) << probe.message();
  Request r = greedy(random_tokens(rng, 160), 3);
  for (int32_t at = 10; at < 150; at += 12) r.message_starts.push_back(at);
  (void)run(**probe, {r});
  const int64_t all = (*probe)->store().memory().snapshots;
  ASSERT_GT(all, 0);
  o.snapshot_budget = all / 4; // a quarter of what the starts took unbounded
  auto e = Engine::create(*fixture().model, o);
  ASSERT_TRUE(e.ok()) << e.message();
  int64_t peak = 0;
  ASSERT_TRUE((*e)->submit(r, [](const Event &) {}).ok());
  while ((*e)->step()) peak = std::max(peak, (*e)->store().memory().snapshots);
  EXPECT_GT(peak, 0);
  // The budget, one snapshot taken before the trim, and the prompt end's (each at most a ring's
  // reach of max_write + snapshot_reach rows: bounded by `all` / 4 here).
  EXPECT_LE(peak, o.snapshot_budget + all / 4) << "unbounded: " << all;
  EXPECT_LT(peak, all);
}

TEST(PrefixReuse, MessageStartsMustAscendInsideThePrompt) {
  std::mt19937_64 rng(38);
  auto e = Engine::create(*fixture().model, paged(2));
  ASSERT_TRUE(e.ok()) << e.message();
  for (const std::vector<int32_t> &starts :
       std::vector<std::vector<int32_t>>{{5, 5}, {9, 4}, {-1}, {20}}) {
    Request r = greedy(random_tokens(rng, 20), 2);
    r.message_starts = starts;
    auto id = (*e)->submit(r, [](const Event &) {});
    ASSERT_FALSE(id.ok());
    EXPECT_NE(id.message().find("message starts"), std::string::npos) << id.message();
  }
}

TEST(PrefixReuse, ConcurrentContinuationsShareOneCachedConversation) {
  std::mt19937_64 rng(32);
  auto e = Engine::create(*fixture().model, paged(4));
  ASSERT_TRUE(e.ok());
  const std::vector<int32_t> base = random_tokens(rng, 61);
  run(**e, {greedy(base, 3)});
  const int64_t before = computed(**e);
  std::vector<Request> continuations;
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> p = base;
    const auto added = random_tokens(rng, size_t(5 + i));
    p.insert(p.end(), added.begin(), added.end());
    continuations.push_back(greedy(p, 8));
  }
  // All four at once: each forks the cached conversation (none takes it).
  auto answers = run(**e, continuations);
  EXPECT_EQ(computed(**e) - before, 5 + 6 + 7 + 8);
  for (size_t i = 0; i < continuations.size(); ++i)
    EXPECT_EQ(answers[i], alone(continuations[i])) << "continuation " << i;
  // The cached conversation is still there for a fifth.
  std::vector<int32_t> fifth = base;
  fifth.push_back(7);
  EXPECT_EQ(computed_by(**e, greedy(fifth, 4)), 1);
}

TEST(PrefixReuse, RequestsArrivingTogetherComputeTheirSharedPrefixOnce) {
  // A system prompt nobody has computed yet, then six questions at once (four computed together):
  // the first computes the prefix; the others wait for it, fork it as soon as it is there (long
  // before the first has answered: its answer is longer than the rings' slack) and answer alone.
  std::mt19937_64 rng(36);
  auto e = Engine::create(*fixture().model, paged(8));
  ASSERT_TRUE(e.ok());
  const std::vector<int32_t> system = random_tokens(rng, 70);
  std::vector<Request> requests;
  int64_t tails = 0;
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> p = system;
    const auto question = random_tokens(rng, size_t(4 + i));
    p.insert(p.end(), question.begin(), question.end());
    tails += int64_t(question.size());
    requests.push_back(greedy(p, 30));
  }
  std::vector<std::vector<int32_t>> answers(requests.size());
  std::vector<int64_t> first_token_step(requests.size(), -1), last_step(requests.size(), -1);
  for (size_t i = 0; i < requests.size(); ++i)
    ASSERT_TRUE((*e)->submit(requests[i],
                             [&, i](const Event &ev) {
                               const int64_t step = (*e)->stats().steps;
                               if (ev.token >= 0 && answers[i].empty()) first_token_step[i] = step;
                               if (ev.token >= 0) answers[i].push_back(ev.token);
                               if (ev.finish != FinishReason::None) last_step[i] = step;
                             })
                    .ok());
  (*e)->run_until_idle();
  EXPECT_EQ(computed(**e), 70 + tails);
  EXPECT_EQ((*e)->stats().parked, 5);
  // The second, third and fourth start while the first is still answering.
  for (size_t i = 1; i < 4; ++i)
    EXPECT_LT(first_token_step[i], last_step[0])
        << "request " << i << " waited for the whole answer";
  for (size_t i = 0; i < requests.size(); ++i)
    EXPECT_EQ(answers[i], alone(requests[i])) << "request " << i;
  // A seventh, later, finds the prefix in the tree (the snapshot kept where they branched).
  std::vector<int32_t> later = system;
  later.push_back(11);
  later.push_back(12);
  EXPECT_EQ(computed_by(**e, greedy(later, 4)), 2);
}

// A request that waits for another to compute the prefix they share holds no memory while it
// waits: under a KV budget that cannot also keep a cached conversation beside both, parking it
// evicts nothing (memory is made only when it is admitted), and every answer is as alone.
TEST(PrefixReuse, ARequestWaitingForASharedPrefixEvictsNothing) {
  std::mt19937_64 rng(37);
  EngineOptions o = paged(4);
  const std::vector<int32_t> other = random_tokens(rng, 40), system = random_tokens(rng, 70);
  std::vector<int32_t> pa = system, pr = system;
  for (int32_t t : random_tokens(rng, 5)) pa.push_back(t);
  for (int32_t t : random_tokens(rng, 6)) pr.push_back(t);
  const Request c = greedy(other, 3), a = greedy(pa, 20), r = greedy(pr, 20);
  int64_t cached = 0, peak_a = 0, peak_r = 0;
  {
    auto probe = Engine::create(*fixture().model, o);
    ASSERT_TRUE(probe.ok());
    run(**probe, {c});
    cached = (*probe)->cached_bytes(), peak_a = (*probe)->peak_kv_bytes(a);
    peak_r = (*probe)->peak_kv_bytes(r);
  }
  ASSERT_GT(cached, 0);
  o.kv_budget = peak_a + peak_r + cached - 1; // both fit, not beside the cached conversation
  auto e = Engine::create(*fixture().model, o);
  ASSERT_TRUE(e.ok());
  run(**e, {c});
  ASSERT_EQ((*e)->cached_bytes(), cached);
  std::vector<std::vector<int32_t>> answers(2);
  const Request both[2] = {a, r};
  for (size_t i = 0; i < 2; ++i)
    ASSERT_TRUE((*e)->submit(both[i],
                             [&answers, i](const Event &ev) {
                               if (ev.token >= 0) answers[i].push_back(ev.token);
                               EXPECT_NE(ev.finish, FinishReason::Error) << ev.error;
                             })
                    .ok());
  ASSERT_TRUE((*e)->step());
  EXPECT_EQ((*e)->stats().parked, 1);
  EXPECT_EQ((*e)->stats().cache_evictions, 0);
  EXPECT_EQ((*e)->cached(), 1u);
  (*e)->run_until_idle();
  EXPECT_EQ(answers[0], alone(a));
  EXPECT_EQ(answers[1], alone(r));
  EXPECT_LE((*e)->store().memory().buffers, o.kv_budget);
}

TEST(PrefixReuse, InterleavedConversationsOfEqualLengthsAllStayCached) {
  // Four conversations sharing a long prefix and differing in one token, turn by turn: a cached
  // conversation is dropped only for one that holds it (a prefix or the same tokens), never for
  // another of the same length.
  std::mt19937_64 rng(39);
  auto e = Engine::create(*fixture().model, paged(8));
  ASSERT_TRUE(e.ok());
  std::vector<std::vector<int32_t>> convs;
  const auto shared = random_tokens(rng, 40);
  for (int i = 0; i < 4; ++i) {
    convs.push_back(shared);
    convs.back().push_back(100 + i);
  }
  for (auto &c : convs) run(**e, {greedy(c, 3)});
  for (int turn = 0; turn < 2; ++turn)
    for (auto &c : convs) {
      const auto added = random_tokens(rng, 6);
      c.insert(c.end(), added.begin(), added.end());
      EXPECT_EQ(computed_by(**e, greedy(c, 3)), 6) << "turn " << turn;
    }
}

TEST(PrefixReuse, PeriodicSnapshotsBoundWhatABranchInsideALongPromptRecomputes) {
  std::mt19937_64 rng(33);
  EngineOptions o = paged(4);
  o.snapshot_every = 16;
  o.snapshot_reach = 0;
  auto e = Engine::create(*fixture().model, o);
  ASSERT_TRUE(e.ok());
  const std::vector<int32_t> document = random_tokens(rng, 120);
  run(**e, {greedy(document, 2)});
  EXPECT_GE((*e)->tree().n_snapshots(), 120u / 16); // 16, 32, ..., 112 and the prompt end
  // Branch at 75: the snapshot at 64 serves; 75 - 64 + the new tail are computed.
  std::vector<int32_t> branch(document.begin(), document.begin() + 75);
  const auto tail = random_tokens(rng, 9);
  branch.insert(branch.end(), tail.begin(), tail.end());
  EXPECT_EQ(computed_by(**e, greedy(branch, 6)), int64_t(branch.size()) - 64);
}

TEST(PrefixReuse, RegeneratingTheSameAnswerComputesNothingAndAgrees) {
  std::mt19937_64 rng(34);
  auto e = Engine::create(*fixture().model, paged(4));
  ASSERT_TRUE(e.ok());
  const auto prompt = random_tokens(rng, 50);
  auto first = run(**e, {greedy(prompt, 6)})[0];
  const int64_t before = computed(**e);
  // Twice at once: both come back from the prompt-end snapshot with its logits.
  auto again = run(**e, {greedy(prompt, 6), greedy(prompt, 6)});
  EXPECT_EQ(computed(**e), before);
  EXPECT_EQ(again[0], first);
  EXPECT_EQ(again[1], first);
}

// Branches, regenerations and continuations of three conversations, a few at a time, stepped by
// hand: after every step the store holds at most the minimum (a shared page counted once) plus one
// page per sequence and what rings hold beyond a short sequence's rows (they are allocated in
// full); every answer equals a fresh engine's.
// `o` decides how much the cache may keep; returns the prefix hits.
int64_t random_branching(EngineOptions o, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto e = Engine::create(*fixture().model, o);
  if (!e.ok()) {
    ADD_FAILURE() << e.message();
    return 0;
  }
  const kv::KvStore &store = (*e)->store();
  const cache::Layout &layout = store.layout();
  std::vector<std::vector<int32_t>> bases;
  for (int i = 0; i < 3; ++i) bases.push_back(random_tokens(rng, size_t(uniform(30, 45))));
  std::vector<Request> requests;
  std::vector<std::vector<int32_t>> answers;
  int64_t steps = 0, shared_seen = 0;
  for (int round = 0; round < 12; ++round) {
    std::vector<size_t> batch;
    for (int k = uniform(1, 3); k > 0; --k) {
      std::vector<int32_t> p = bases[size_t(uniform(0, 2))];
      p.resize(size_t(uniform(24, int(p.size()))));
      const auto tail = random_tokens(rng, size_t(uniform(0, 10)));
      p.insert(p.end(), tail.begin(), tail.end());
      requests.push_back(greedy(p, uniform(2, 6)));
      answers.emplace_back();
      batch.push_back(requests.size() - 1);
    }
    for (size_t i : batch)
      EXPECT_TRUE((*e)->submit(requests[i],
                               [&answers, i](const Event &ev) {
                                 if (ev.token >= 0) answers[i].push_back(ev.token);
                               })
                      .ok());
    while ((*e)->step()) {
      ++steps;
      const kv::MemoryUse m = store.memory();
      int64_t slack = 0, each = 0;
      for (kv::SeqId id : store.sequence_ids()) {
        slack += store.page_bytes();
        each += store.memory(id).held;
        const int32_t length = store.sequence(id)->length();
        for (cache::CacheId c = 0; c < layout.n_caches(); ++c)
          if (layout.cache(c).ring())
            slack += (layout.cache(c).max_rows - layout.min_rows(c, length)) *
                     int64_t(kv::k_row_bytes(layout, c, store.types()) +
                             kv::v_row_bytes(layout, c, store.types()));
      }
      EXPECT_LE(m.held, m.minimum + slack) << "step " << steps;
      EXPECT_LE(m.held, each); // a shared page counts once
      shared_seen += m.shared_pages > 0;
    }
  }
  EXPECT_GT(shared_seen, 10);
  for (size_t i = 0; i < requests.size(); ++i)
    EXPECT_EQ(answers[i], alone(requests[i])) << "request " << i;
  // Requests that found nothing: the first round's, and those whose conversation's earlier
  // requests were in flight with them (sharing is from cached state).
  std::printf("[ reuse    ] %zu requests, %lld prefix hits, %lld steps with shared pages of %lld, "
              "%lld cache and %lld snapshot evictions\n",
              requests.size(), (long long)(*e)->stats().prefix_hits, (long long)shared_seen,
              (long long)steps, (long long)(*e)->stats().cache_evictions,
              (long long)(*e)->stats().snapshot_evictions);
  if (o.cache_budget > 0) {
    EXPECT_LE((*e)->cached_bytes(), o.cache_budget);
  }
  return (*e)->stats().prefix_hits;
}

TEST(PrefixReuse, RandomBranchingStaysWithinAPageOfTheMinimumAndExact) {
  EngineOptions o = paged(6);
  o.snapshot_every = 8; // branch points inside the conversations
  EXPECT_GT(random_branching(o, 35), 21 / 2);
}

TEST(PrefixReuse, RandomBranchingUnderATinyCacheBudgetStaysExact) {
  // Room for about two cached conversations: sequences and snapshots are evicted all the time;
  // every reuse that remains must still be exact.
  EngineOptions o = paged(3);
  o.snapshot_every = 8;
  o.cache_budget = 200 << 10;
  random_branching(o, 38);
}

} // namespace
} // namespace offgraph::engine
