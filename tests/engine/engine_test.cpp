// The engine against running each request alone: batched requests, prefix reuse (by rewind and by
// the prompt-end snapshot after the rings wrapped) and agent loops give exactly the tokens of a
// fresh computation, while computing only the new part of each prompt.
#include "engine/engine_detail.h"
#include "engine_util.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <limits>
#include <map>
#include <random>

namespace offgraph::engine {
namespace {

using testing::alone;
using testing::calls_grammar;
using testing::CallsGrammar;
using testing::fixture;
using testing::greedy;
using testing::options;
using testing::random_tokens;
using testing::run;

TEST(Engine, BatchedRequestsEqualEachAlone) {
  std::mt19937_64 rng(1);
  std::vector<Request> reqs = {greedy(random_tokens(rng, 30), 20),
                               greedy(random_tokens(rng, 45), 12),
                               greedy(random_tokens(rng, 7), 25), greedy(random_tokens(rng, 60), 5),
                               greedy(random_tokens(rng, 18), 9)}; // five requests, four at a time
  auto e = Engine::create(*fixture().model, options(4));
  ASSERT_TRUE(e.ok()) << e.message();
  auto together = run(**e, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_EQ(together[i].size(), size_t(reqs[i].max_tokens));
    EXPECT_EQ(together[i], alone(reqs[i])) << "request " << i;
  }
  EXPECT_EQ((*e)->stats().computed_prompt_tokens, 30 + 45 + 7 + 60 + 18);
}

// The agent pattern: each turn resends the whole history plus something new (not what the model
// generated, as a template that drops reasoning would). Each turn must compute only the new part,
// by restoring the snapshot at the previous prompt's end, and answer exactly as a fresh engine.
TEST(Engine, AgentLoopComputesOnlyWhatFollowsThePreviousPrompt) {
  std::mt19937_64 rng(2);
  auto e = Engine::create(*fixture().model, options(2));
  ASSERT_TRUE(e.ok());
  std::vector<int32_t> history = random_tokens(rng, 40);
  int64_t computed = 0;
  for (int turn = 0; turn < 4; ++turn) {
    const Request r = greedy(history, 15);
    auto got = run(**e, {r})[0];
    const int64_t now = (*e)->stats().computed_prompt_tokens;
    if (turn > 0) {
      EXPECT_EQ(now - computed, 12) << "turn " << turn << " recomputed the history";
      EXPECT_EQ((*e)->stats().snapshot_restores, turn);
    }
    computed = now;
    EXPECT_EQ(got, alone(r)) << "turn " << turn;
    const auto added = random_tokens(rng, 12); // an edited answer and a tool result
    history.insert(history.end(), added.begin(), added.end());
  }
}

TEST(Engine, ContinuationWithinTheRingSlackRewinds) {
  std::mt19937_64 rng(3);
  auto e = Engine::create(*fixture().model, options(2));
  ASSERT_TRUE(e.ok());
  const auto prompt = random_tokens(rng, 33);
  auto first = run(**e, {greedy(prompt, 1)})[0];
  // The same prompt plus what was generated and more: the cached sequence continues.
  std::vector<int32_t> longer = prompt;
  longer.push_back(first[0]);
  const auto more = random_tokens(rng, 5);
  longer.insert(longer.end(), more.begin(), more.end());
  const int64_t before = (*e)->stats().computed_prompt_tokens;
  auto second = run(**e, {greedy(longer, 6)})[0];
  EXPECT_EQ((*e)->stats().computed_prompt_tokens - before, int64_t(longer.size() - prompt.size()));
  EXPECT_EQ((*e)->stats().snapshot_restores, 0);
  EXPECT_EQ(second, alone(greedy(longer, 6)));
}

// The same prompt again after the rings wrapped (a regenerate): the snapshot taken at its end is
// restored and the logits kept with it give the first token; nothing is recomputed.
TEST(Engine, IdenticalPromptUsesItsOwnSnapshot) {
  std::mt19937_64 rng(11);
  auto e = Engine::create(*fixture().model, options(2));
  ASSERT_TRUE(e.ok());
  const Request r = greedy(random_tokens(rng, 50), 30); // the answer wraps the 23-row rings
  const auto first = run(**e, {r})[0];
  const int64_t before = (*e)->stats().computed_prompt_tokens;
  int32_t cached = -1;
  std::vector<int32_t> again;
  auto id = (*e)->submit(r, [&](const Event &ev) {
    if (ev.token >= 0) again.push_back(ev.token);
    if (ev.finish != FinishReason::None) cached = ev.cached_tokens;
  });
  ASSERT_TRUE(id.ok());
  (*e)->run_until_idle();
  EXPECT_EQ((*e)->stats().computed_prompt_tokens - before, 0); // its logits were kept too
  EXPECT_EQ(cached, 50);
  EXPECT_EQ((*e)->stats().snapshot_restores, 1);
  EXPECT_EQ(again, first);            // and the answer is the same
  EXPECT_EQ(run(**e, {r})[0], first); // a third time as well
}

// A memory budget for cached conversations: they are dropped, least recently used first, once
// their bytes pass it; the answers do not change.
TEST(Engine, CachedConversationsStayUnderTheirByteBudget) {
  std::mt19937_64 rng(12);
  EngineOptions o = options(8);
  auto probe = Engine::create(*fixture().model, o);
  ASSERT_TRUE(probe.ok());
  run(**probe, {greedy(random_tokens(rng, 40), 4)});
  const int64_t one = (*probe)->cached_bytes(); // what one cached conversation holds
  ASSERT_GT(one, 0);
  o.cache_budget = one * 5 / 2; // room for two
  auto e = Engine::create(*fixture().model, o);
  ASSERT_TRUE(e.ok());
  std::vector<Request> reqs;
  for (int i = 0; i < 5; ++i) reqs.push_back(greedy(random_tokens(rng, 40), 4));
  for (const Request &r : reqs) {
    EXPECT_EQ(run(**e, {r})[0], alone(r));
    EXPECT_LE((*e)->cached_bytes(), o.cache_budget);
  }
  EXPECT_EQ((*e)->cached(), 2u);
  EXPECT_EQ((*e)->stats().cache_evictions, 3);
}

// The default KV budget: three quarters of the memory available, at most the page pool, at least
// one request at the full context; none where the memory is unknown; by device, the largest
// whose part on each fits there. An engine asked for it holds a
// positive budget no larger than its pool, and a budget below -1 is refused.
TEST(Engine, KvBudgetFromMemory) {
  const int64_t gib = int64_t(1) << 30;
  EXPECT_EQ(kv_budget_from_memory(4 * gib, 10 * gib, 4096), 3 * gib);
  EXPECT_EQ(kv_budget_from_memory(4 * gib, 2 * gib, 4096), 2 * gib);
  EXPECT_EQ(kv_budget_from_memory(4 * gib, 0, 4096), 3 * gib);
  EXPECT_EQ(kv_budget_from_memory(1000, 10 * gib, 4096), 4096);
  EXPECT_EQ(kv_budget_from_memory(0, 10 * gib, 4096), 0);
  // By device: the host holds at most a quarter of the store, a device at most 3/4, in a pool of
  // 2 GiB allocated up front. The host allows 3 GiB / (1/4) = 12 GiB, the device (2 + 6) GiB /
  // (3/4) = 32/3 GiB: the smaller. A device whose memory is unknown, or that holds no KV, sets no
  // limit.
  const std::vector<KvDeviceMemory> split = {{4 * gib, 0, 0.25}, {8 * gib, 2 * gib, 0.75}};
  EXPECT_EQ(kv_budget_from_memory(split, 0, 4096), int64_t(32.0 * double(gib) / 3.0));
  EXPECT_EQ(kv_budget_from_memory(split, 10 * gib, 4096), 10 * gib);
  const std::vector<KvDeviceMemory> unknown_device = {{4 * gib, 0, 0.25}, {0, 2 * gib, 0.75}};
  EXPECT_EQ(kv_budget_from_memory(unknown_device, 0, 4096), 12 * gib);
  const std::vector<KvDeviceMemory> idle_device = {{4 * gib, 0, 1.0}, {gib, 0, 0}};
  EXPECT_EQ(kv_budget_from_memory(idle_device, 0, 4096), 3 * gib);
  const std::vector<KvDeviceMemory> none_known = {{0, 0, 0.25}, {0, gib, 0.75}};
  EXPECT_EQ(kv_budget_from_memory(none_known, 10 * gib, 4096), 0);
  EngineOptions o = options(0);
  o.kv_budget = EngineOptions::kKvBudgetFromMemory;
  auto e = Engine::create(*fixture().model, o);
  ASSERT_TRUE(e.ok()) << e.message();
  const kv::KvStore &store = (*e)->store();
  EXPECT_GT((*e)->options().kv_budget, 0);
  EXPECT_LE((*e)->options().kv_budget, int64_t(store.pages().max_pages()) * store.page_bytes());
  std::mt19937_64 rng(12);
  const Request r = greedy(random_tokens(rng, 30), 5);
  EXPECT_EQ(run(**e, {r})[0], alone(r));
  // One device, the host: its part of the budget is all of it.
  const auto &budget_by_device = (*e)->budget_by_device();
  ASSERT_EQ(budget_by_device.size(), 1u);
  EXPECT_EQ(budget_by_device[0].bytes, (*e)->options().kv_budget);
  EXPECT_STREQ(budget_by_device[0].use, "kv");
  // With a draft model (the target as its own: the same bytes a sequence), the store's real parts
  // and the draft's, at its share of the budget, on the buffer type both live in: the host holds
  // twice the budget's part, so it allows half the budget.
  o.draft_model = fixture().model.get();
  auto with_draft = Engine::create(*fixture().model, o);
  ASSERT_TRUE(with_draft.ok()) << with_draft.message();
  const kv::KvStore &target = (*with_draft)->store(), &draft = *(*with_draft)->draft_store();
  const double share = double(draft.peak_bytes_at_length(o.context)) /
                       double(target.peak_bytes_at_length(o.context));
  EXPECT_DOUBLE_EQ(share, 1.0);
  const std::vector<KvDeviceMemory> host = kv_device_memory(target, o.context, &draft, share);
  ASSERT_EQ(host.size(), 1u);
  EXPECT_DOUBLE_EQ(host[0].part, 2.0);
  EXPECT_GT(host[0].available, 0);
  const std::vector<KvDeviceMemory> alone_host = kv_device_memory(target, o.context);
  ASSERT_EQ(alone_host.size(), 1u);
  EXPECT_DOUBLE_EQ(alone_host[0].part, 1.0);
  const int64_t available = int64_t(1) << 30;
  const std::vector<KvDeviceMemory> gib_host = {{available, 0, host[0].part}};
  EXPECT_EQ(kv_budget_from_memory(gib_host, 0, 4096), available / 4 * 3 / 2);
  EXPECT_EQ(draft.memory_budget(), (*with_draft)->options().kv_budget);
  o.draft_model = nullptr;
  o.kv_budget = -2;
  EXPECT_FALSE(Engine::create(*fixture().model, o).ok());
}

// A KV budget that holds one request at a time: the second waits in the queue (nothing refused,
// nothing lost) and both answer as alone; one that can never fit is refused with the numbers.
TEST(Engine, RequestsWaitForKvMemory) {
  std::mt19937_64 rng(13);
  EngineOptions o = options(0);
  auto probe = Engine::create(*fixture().model, o);
  ASSERT_TRUE(probe.ok());
  const Request a = greedy(random_tokens(rng, 60), 40), b = greedy(random_tokens(rng, 60), 40);
  const int64_t peak =
      (*probe)->store().peak_bytes_at_length(100) + (*probe)->store().peak_bytes_at_length(0);
  o.kv_budget = peak + peak / 2; // one fits, two do not (nor one with two choices)
  auto e = Engine::create(*fixture().model, o);
  ASSERT_TRUE(e.ok());
  const auto both = run(**e, {a, b});
  EXPECT_EQ(both[0], alone(a));
  EXPECT_EQ(both[1], alone(b));
  EXPECT_GT((*e)->stats().waits_for_memory, 0);
  EXPECT_LE((*e)->store().memory().buffers, o.kv_budget);
  // Two choices can never fit: refused at submit, with the numbers, before it waits.
  Request two = greedy(random_tokens(rng, 60), 40);
  two.n = 2;
  const int64_t need = (*e)->peak_kv_bytes(two);
  EXPECT_GT(need, o.kv_budget);
  auto refused = (*e)->submit(two, [](const Event &) {});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("may need " + std::to_string(need) + " bytes"),
            std::string::npos)
      << refused.message();
  EXPECT_NE(refused.message().find("the budget (--kv-mib) is " + std::to_string(o.kv_budget)),
            std::string::npos)
      << refused.message();
  // One choice of the same request fits and is accepted.
  two.n = 1;
  EXPECT_LE((*e)->peak_kv_bytes(two), o.kv_budget);
  EXPECT_TRUE((*e)->submit(two, [](const Event &) {}).ok());
  (*e)->run_until_idle();
}

// Constrained output: every choice, sampled at temperature 1 with a bias against the grammar,
// writes a prefix of a sentence, and the end token comes only where a sentence is complete.
TEST(Engine, GrammarMakesEveryChoiceASentence) {
  std::mt19937_64 rng(14);
  auto e = Engine::create(*fixture().model, options(0));
  ASSERT_TRUE(e.ok());
  const CallsGrammar calls = calls_grammar();
  const auto &texts = calls.texts;
  int ended = 0;
  for (uint64_t seed = 0; seed < 6; ++seed) {
    Request r = greedy(random_tokens(rng, 12), 40);
    r.sampling.temperature = 1.0, r.sampling.seed = seed;
    r.sampling.logit_bias[3] = 3; // makes more calls likely
    r.sampling.logit_bias[2] = 2;
    r.sampling.logit_bias[7] = -5; // against the grammar: it must still come
    r.stop_tokens = {2};
    r.n = 2;
    r.grammar = calls.compiled;
    std::vector<std::vector<int32_t>> outs(2);
    ASSERT_TRUE((*e)->submit(r,
                             [&](const Event &ev) {
                               EXPECT_NE(ev.finish, FinishReason::Error) << ev.error;
                               if (ev.token >= 0) outs[size_t(ev.choice)].push_back(ev.token);
                             })
                    .ok());
    (*e)->run_until_idle();
    for (const auto &out : outs) {
      ASSERT_GE(out.size(), 2u);
      std::string text;
      bool end = false;
      for (int32_t t : out) {
        ASSERT_FALSE(end) << "a token after the end token";
        if (t == 2)
          end = true;
        else
          text += texts->bytes[size_t(t)];
      }
      auto whole = sample::grammar_accepts(calls.grammar, text);
      ASSERT_TRUE(whole.ok());
      if (end) {
        EXPECT_TRUE(*whole) << text;
        ++ended;
      }
      // Every output is a prefix of a sentence: completing it with "<7><10>" pieces works.
      sample::GrammarMatcher m(calls.compiled);
      EXPECT_TRUE(m.accept_bytes(text)) << text;
    }
  }
  EXPECT_GT(ended, 0);
}

TEST(Engine, CancelEndsTheRequestWithinOneStep) {
  std::mt19937_64 rng(4);
  auto e = Engine::create(*fixture().model, options(0));
  ASSERT_TRUE(e.ok());
  FinishReason reason = FinishReason::None;
  int tokens = 0;
  auto id = (*e)->submit(greedy(random_tokens(rng, 10), 200), [&](const Event &ev) {
    tokens += ev.token >= 0;
    if (ev.finish != FinishReason::None) reason = ev.finish;
  });
  ASSERT_TRUE(id.ok());
  for (int i = 0; i < 5; ++i) (*e)->step();
  (*e)->cancel(*id);
  (*e)->step();
  EXPECT_EQ(reason, FinishReason::Cancelled);
  EXPECT_EQ((*e)->active(), 0u);
  EXPECT_TRUE((*e)->store().sequence_ids().empty()); // nothing cached: its sequence is freed
  EXPECT_LT(tokens, 200);
}

TEST(Engine, AdmissionRefusesWhatCannotFitWithTheNumbers) {
  auto e = Engine::create(*fixture().model, options(0));
  ASSERT_TRUE(e.ok());
  auto r = (*e)->submit(greedy(std::vector<int32_t>(200, 1), 100), nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("300 in all; the context holds 256"), std::string::npos)
      << r.message();
  EXPECT_FALSE((*e)->submit(greedy({}, 10), nullptr).ok());
  EngineOptions small = options(0);
  small.max_queue = 2;
  auto q = Engine::create(*fixture().model, small);
  EXPECT_TRUE((*q)->submit(greedy({1, 2}, 1), nullptr).ok());
  EXPECT_TRUE((*q)->submit(greedy({1, 2}, 1), nullptr).ok());
  auto full = (*q)->submit(greedy({1, 2}, 1), nullptr);
  ASSERT_FALSE(full.ok());
  EXPECT_NE(full.message().find("queue is full"), std::string::npos);
}

// After a burst the pool's resident memory returns to what the cached conversations hold plus
// the warm free pages asked for; the next burst's answers are unchanged.
TEST(Engine, FreePagesGoBackToTheOsAfterABurst) {
  std::mt19937_64 rng(37);
  std::vector<Request> burst;
  for (int i = 0; i < 6; ++i) burst.push_back(greedy(random_tokens(rng, 150), 20));
  // Nothing given back (a budget past the pool), none kept warm, and 1 MiB kept warm.
  const int64_t all = std::numeric_limits<int64_t>::max();
  int64_t resident_all = 0;
  for (const int64_t warm : {all, int64_t(0), int64_t(1) << 20}) {
    EngineOptions o = options(1); // one conversation stays cached
    o.warm_free_kv = warm;
    auto e = Engine::create(*fixture().model, o);
    ASSERT_TRUE(e.ok()) << e.message();
    const auto first = run(**e, burst);
    const kv::KvStore &store = (*e)->store();
    const int64_t page = store.page_bytes();
    const int64_t held = store.memory().pages * page;
    EXPECT_GT(held, 0); // the cached conversation
    const int64_t free_pages = store.pages().touched() - store.pages().in_use();
    EXPECT_GT(free_pages, 6);
    const int64_t resident = store.resident_pool_bytes();
    if (warm == all) {
      resident_all = resident;
      EXPECT_EQ(store.pages().free_warm(), free_pages);
    } else {
      // The held pages and the warm free ones at most (a sequence's last page may be written only
      // in part); the rest went back: at least every free page past the warm ones, less one
      // partly written page per request.
      const int64_t warm_pages = std::min(free_pages, warm / page);
      EXPECT_EQ(store.pages().free_warm(), warm_pages);
      EXPECT_LE(resident, held + warm_pages * page);
      EXPECT_GE(resident_all - resident, (free_pages - warm_pages - int64_t(burst.size())) * page);
    }
    EXPECT_EQ(run(**e, burst), first);
  }
}

// A step whose one span cannot reserve its storage ends that request with the reason; the other
// requests of the step go on and produce what each produces alone (fault injection at the
// reserve of every span of every step, one failure per run).
TEST(Engine, AFailedReserveEndsOnlyItsRequest) {
  std::mt19937_64 rng(38);
  std::vector<Request> requests;
  for (int i = 0; i < 3; ++i) requests.push_back(greedy(random_tokens(rng, 30 + 10 * i), 12));
  std::vector<std::vector<int32_t>> want;
  for (const Request &r : requests) want.push_back(alone(r));
  // Count the reserves of a clean run, then fail each one of them in turn.
  int64_t reserves = 0;
  {
    EngineOptions o = options(0);
    o.kv_fault = [&](std::string_view site, kv::SeqId) {
      reserves += site == "reserve";
      return Status();
    };
    auto e = Engine::create(*fixture().model, o);
    ASSERT_EQ(run(**e, requests), want);
  }
  ASSERT_GT(reserves, 10);
  for (int64_t fail_at = 0; fail_at < reserves; fail_at += 3) {
    SCOPED_TRACE("reserve " + std::to_string(fail_at) + " fails");
    int64_t seen = 0;
    EngineOptions o = options(0);
    o.kv_fault = [&](std::string_view site, kv::SeqId) {
      if (site != "reserve") return Status();
      return seen++ == fail_at ? Status::error("injected: no pages") : Status();
    };
    auto e = Engine::create(*fixture().model, o);
    ASSERT_TRUE(e.ok());
    std::vector<std::vector<int32_t>> out(requests.size());
    std::vector<FinishReason> how(requests.size(), FinishReason::None);
    std::vector<std::string> why(requests.size());
    for (size_t i = 0; i < requests.size(); ++i)
      ASSERT_TRUE((*e)->submit(requests[i],
                               [&, i](const Event &ev) {
                                 if (ev.token >= 0) out[i].push_back(ev.token);
                                 if (ev.finish != FinishReason::None)
                                   how[i] = ev.finish, why[i] = ev.error;
                               })
                      .ok());
    (*e)->run_until_idle();
    int failed = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
      if (how[i] == FinishReason::Error) {
        ++failed;
        EXPECT_NE(why[i].find("injected: no pages"), std::string::npos) << why[i];
        // What it produced before is a prefix of its answer.
        EXPECT_EQ(out[i],
                  std::vector<int32_t>(want[i].begin(), want[i].begin() + long(out[i].size())));
      } else {
        EXPECT_EQ(out[i], want[i]) << "request " << i;
      }
    }
    EXPECT_EQ(failed, 1);
    EXPECT_EQ((*e)->store().memory().pages, 0); // nothing leaked
  }
}

// A fork for prefix reuse that cannot be made falls back to a snapshot of the prefix (then to
// computing the prompt): the answer is the same, only less is reused.
TEST(Engine, AFailedForkFallsBackToASnapshot) {
  std::mt19937_64 rng(39);
  const Request first = greedy(random_tokens(rng, 64), 8);
  const std::vector<int32_t> answer = alone(first);
  Request next = greedy(first.prompt, 8);
  next.prompt.insert(next.prompt.end(), answer.begin(), answer.end());
  const auto more = random_tokens(rng, 5);
  next.prompt.insert(next.prompt.end(), more.begin(), more.end());
  const std::vector<int32_t> want = alone(next);
  for (const bool fail_forks : {false, true}) {
    SCOPED_TRACE(fail_forks ? "forks fail" : "forks work");
    EngineOptions o = options(4);
    o.snapshot_every = 16; // snapshots inside the prompt
    o.kv_fault = [&](std::string_view site, kv::SeqId) {
      return fail_forks && site == "fork" ? Status::error("injected: no ring memory") : Status();
    };
    auto e = Engine::create(*fixture().model, o);
    ASSERT_TRUE(e.ok());
    run(**e, {first});
    std::vector<int32_t> got;
    int32_t cached = -1;
    ASSERT_TRUE((*e)->submit(next,
                             [&](const Event &ev) {
                               if (ev.token >= 0) got.push_back(ev.token);
                               cached = ev.cached_tokens;
                               EXPECT_NE(ev.finish, FinishReason::Error) << ev.error;
                             })
                    .ok());
    (*e)->run_until_idle();
    EXPECT_EQ(got, want);
    const int32_t whole = int32_t(first.prompt.size() + answer.size()) - 1;
    if (!fail_forks) {
      EXPECT_EQ(cached, whole);
      EXPECT_EQ((*e)->stats().failed_forks, 0);
    } else {
      EXPECT_GE((*e)->stats().failed_forks, 1);
      EXPECT_GE((*e)->stats().snapshot_restores, 1);
      EXPECT_GT(cached, 0);     // a snapshot's depth
      EXPECT_LT(cached, whole); // short of the fork's
    }
  }
}

// Each request's tokens and error ("" without one) after an engine made with `o` ran them all
// together; `submitted` sees each request's id before the engine runs. Nothing may stay held.
struct Answers {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::string> errors;
};
Answers run_together(const EngineOptions &o, const std::vector<Request> &requests,
                     const std::function<void(size_t, uint64_t)> &submitted = {}) {
  auto e = Engine::create(*fixture().model, o);
  EXPECT_TRUE(e.ok()) << e.message();
  Answers a{std::vector<std::vector<int32_t>>(requests.size()),
            std::vector<std::string>(requests.size())};
  for (size_t i = 0; i < requests.size(); ++i) {
    auto id = (*e)->submit(requests[i], [&a, i](const Event &ev) {
      if (ev.token >= 0) a.tokens[i].push_back(ev.token);
      if (ev.finish == FinishReason::Error) a.errors[i] = ev.error;
    });
    EXPECT_TRUE(id.ok()) << id.message();
    if (id.ok() && submitted) submitted(i, *id);
  }
  (*e)->run_until_idle();
  EXPECT_EQ((*e)->store().sequence_ids().size(), 0u) << "a sequence was left held";
  return a;
}

// A step whose graph cannot be allocated (a device's memory, the compute buffer of that many
// tokens; injected through EngineOptions::allocation_fault): its parts run as smaller steps, a
// prompt's chunk alone in halves, and a part that cannot be allocated even so ends only its own
// request. Against each request alone.
TEST(Engine, AGraphThatCannotBeAllocatedRunsSmallerOrEndsOnlyItsRequest) {
  std::mt19937_64 rng(41);
  const std::vector<Request> requests = {greedy(random_tokens(rng, 12), 10),
                                         greedy(random_tokens(rng, 60), 6),
                                         greedy(random_tokens(rng, 14), 10)};
  std::vector<std::vector<int32_t>> want;
  for (const Request &r : requests) want.push_back(alone(r));
  auto run_with = [&](model::Forward::AllocationFault fault) {
    EngineOptions o = options(0);
    o.allocation_fault = std::move(fault);
    return run_together(o, requests);
  };
  // No batch of two or more spans can be allocated: every step runs one request at a time.
  int refused = 0;
  const Answers one_at_a_time =
      run_with([&](const model::Batch &b) { return b.spans.size() > 1 && ++refused > 0; });
  EXPECT_GT(refused, 3);
  EXPECT_EQ(one_at_a_time.tokens, want);
  EXPECT_EQ(one_at_a_time.errors, std::vector<std::string>(requests.size(), ""));
  // No batch of more than 4 tokens can be allocated: prompts run in halves of their chunks, down
  // to what fits, and every request answers as alone.
  int64_t largest = 0;
  const Answers small_steps = run_with([&](const model::Batch &b) {
    const bool fail = b.tokens.size() > 4;
    if (!fail) largest = std::max<int64_t>(largest, int64_t(b.tokens.size()));
    return fail;
  });
  EXPECT_EQ(largest, 4);
  EXPECT_EQ(small_steps.tokens, want);
  EXPECT_EQ(small_steps.errors, std::vector<std::string>(requests.size(), ""));
  // No batch that reaches position 30 can be allocated: only the long prompt's request errors
  // (before any token of its answer, having run its prompt in halves up to there); the others
  // answer as alone.
  const Answers without_long = run_with([](const model::Batch &b) {
    for (const model::Batch::Span &s : b.spans)
      if (s.position + s.n_tokens > 30) return true;
    return false;
  });
  EXPECT_NE(without_long.errors[1].find("could not allocate the graph"), std::string::npos)
      << without_long.errors[1];
  EXPECT_TRUE(without_long.tokens[1].empty());
  for (size_t i : {size_t(0), size_t(2)}) {
    EXPECT_EQ(without_long.errors[i], "") << "request " << i;
    EXPECT_EQ(without_long.tokens[i], want[i]) << "request " << i;
  }
}

// Memory that cannot be had while one request samples its next token (std::bad_alloc from its
// grammar's tables, logits or log-probabilities; injected through EngineOptions::sampling_fault
// on the second request's third token) ends that request alone, after the tokens it had; the
// others answer as alone.
TEST(Engine, MemoryThatCannotBeHadWhileSamplingEndsOnlyThatRequest) {
  std::mt19937_64 rng(43);
  const std::vector<Request> requests = {greedy(random_tokens(rng, 12), 8),
                                         greedy(random_tokens(rng, 15), 8),
                                         greedy(random_tokens(rng, 9), 8)};
  std::vector<std::vector<int32_t>> want;
  for (const Request &r : requests) want.push_back(alone(r));
  EngineOptions o = options(0);
  uint64_t victim = 0;
  int victim_calls = 0;
  o.sampling_fault = [&](uint64_t id) { return id == victim && ++victim_calls == 3; };
  const Answers got = run_together(o, requests, [&](size_t i, uint64_t id) {
    if (i == 1) victim = id;
  });
  EXPECT_EQ(victim_calls, 3);
  EXPECT_NE(got.errors[1].find("out of memory while sampling"), std::string::npos) << got.errors[1];
  EXPECT_EQ(got.tokens[1], std::vector<int32_t>(want[1].begin(), want[1].begin() + 2));
  for (size_t i : {size_t(0), size_t(2)}) {
    EXPECT_EQ(got.errors[i], "") << "request " << i;
    EXPECT_EQ(got.tokens[i], want[i]) << "request " << i;
  }
}

TEST(Engine, StopTokensEndTheRequest) {
  std::mt19937_64 rng(5);
  const auto prompt = random_tokens(rng, 12);
  auto free_run = alone(greedy(prompt, 10));
  Request r = greedy(prompt, 10);
  r.stop_tokens = {free_run[3]};
  auto e = Engine::create(*fixture().model, options(0));
  FinishReason reason = FinishReason::None;
  std::vector<int32_t> got;
  ASSERT_TRUE((*e)->submit(r,
                           [&](const Event &ev) {
                             if (ev.token >= 0) got.push_back(ev.token);
                             if (ev.finish != FinishReason::None) reason = ev.finish;
                           })
                  .ok());
  (*e)->run_until_idle();
  const size_t first_stop =
      size_t(std::find(free_run.begin(), free_run.end(), free_run[3]) - free_run.begin());
  EXPECT_EQ(got, std::vector<int32_t>(free_run.begin(), free_run.begin() + long(first_stop) + 1));
  EXPECT_EQ(reason, FinishReason::Stop);
}

// Callbacks may cancel or submit (found by review: the engine iterated its queue while calling
// them). Every request still ends exactly once and no sequence is left behind.
TEST(Engine, CallbacksMayCancelAndSubmit) {
  std::mt19937_64 rng(6);
  EngineOptions o = options(0);
  o.max_active = 1; // B waits in the queue while A runs
  auto e = Engine::create(*fixture().model, o);
  ASSERT_TRUE(e.ok());
  std::map<uint64_t, int> finishes;
  uint64_t b = 0, c = 0;
  auto count = [&](const Event &ev) {
    if (ev.finish != FinishReason::None) ++finishes[ev.request];
  };
  auto a = (*e)->submit(greedy(random_tokens(rng, 9), 3), [&](const Event &ev) {
    count(ev);
    if (ev.finish != FinishReason::None) {
      (*e)->cancel(b);
      c = *(*e)->submit(greedy(random_tokens(rng, 5), 2), count);
    }
  });
  b = *(*e)->submit(greedy(random_tokens(rng, 9), 3), count);
  ASSERT_TRUE(a.ok());
  (*e)->run_until_idle();
  EXPECT_EQ(finishes[*a], 1);
  EXPECT_EQ(finishes[b], 1);
  EXPECT_EQ(finishes[c], 1);
  EXPECT_TRUE((*e)->store().sequence_ids().empty());
  // Five active requests sharing a budget of 2 tokens a step all make progress.
  EngineOptions tight = options(0);
  tight.step_tokens = 2;
  auto t = Engine::create(*fixture().model, tight);
  std::vector<int> first_token_step(4, -1);
  for (int i = 0; i < 4; ++i)
    ASSERT_TRUE((*t)->submit(greedy(random_tokens(rng, 1), 30),
                             [&, i](const Event &ev) {
                               if (ev.token >= 0 && first_token_step[size_t(i)] < 0)
                                 first_token_step[size_t(i)] = int((*t)->stats().steps);
                             })
                    .ok());
  (*t)->run_until_idle();
  for (int s : first_token_step) EXPECT_LE(s, 8);
}

// n choices: the prompt is computed once and forked; choice 0 is the request itself, choice i
// samples with seed + i, exactly as a request of its own with that seed would.
TEST(Engine, ChoicesForkThePromptOnce) {
  std::mt19937_64 rng(7);
  const auto prompt = random_tokens(rng, 40);
  Request r;
  r.prompt = prompt;
  r.sampling.temperature = 1.0f;
  r.sampling.top_k = 0, r.sampling.top_p = 1.0f, r.sampling.min_p = 0.0f;
  r.sampling.seed = 100;
  r.max_tokens = 12;
  r.n = 3;
  auto e = Engine::create(*fixture().model, options(0));
  ASSERT_TRUE(e.ok());
  std::vector<std::vector<int32_t>> got(3);
  std::vector<int> finished(3, 0);
  ASSERT_TRUE((*e)->submit(r,
                           [&](const Event &ev) {
                             if (ev.token >= 0) got[size_t(ev.choice)].push_back(ev.token);
                             if (ev.finish != FinishReason::None) ++finished[size_t(ev.choice)];
                           })
                  .ok());
  (*e)->run_until_idle();
  EXPECT_EQ((*e)->stats().computed_prompt_tokens, 40); // once, not three times
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(finished[size_t(c)], 1);
    Request one = r;
    one.n = 1;
    one.sampling.seed = 100 + uint64_t(c);
    EXPECT_EQ(got[size_t(c)], alone(one)) << "choice " << c;
  }
  EXPECT_NE(got[0], got[1]);
  EXPECT_TRUE((*e)->store().sequence_ids().empty());
}

// With a cache, every choice's conversation stays (none replaces a sibling): the next turn on any
// of them reuses its prompt and its answer.
TEST(Engine, ChoicesStayCachedSideBySide) {
  std::mt19937_64 rng(8);
  Request r;
  r.prompt = random_tokens(rng, 40);
  r.sampling.temperature = 1.0f;
  r.sampling.top_k = 0, r.sampling.top_p = 1.0f, r.sampling.min_p = 0.0f;
  r.sampling.seed = 200;
  r.max_tokens = 12;
  r.n = 3;
  const auto more = random_tokens(rng, 6);
  for (int c = 0; c < 3; ++c) {
    auto e = Engine::create(*fixture().model, options(8));
    ASSERT_TRUE(e.ok());
    std::vector<std::vector<int32_t>> got(3);
    ASSERT_TRUE((*e)->submit(r,
                             [&](const Event &ev) {
                               if (ev.token >= 0) got[size_t(ev.choice)].push_back(ev.token);
                             })
                    .ok());
    (*e)->run_until_idle();
    ASSERT_NE(got[0], got[1]);
    EXPECT_EQ((*e)->store().sequence_ids().size(), 3u);
    // The conversation goes on from choice c: its prompt and answer, then a new message.
    Request next = greedy(r.prompt, 4);
    next.prompt.insert(next.prompt.end(), got[size_t(c)].begin(), got[size_t(c)].end());
    next.prompt.insert(next.prompt.end(), more.begin(), more.end());
    int32_t cached = -1;
    ASSERT_TRUE((*e)->submit(next, [&](const Event &ev) { cached = ev.cached_tokens; }).ok());
    (*e)->run_until_idle();
    // Everything the choice's sequence computed (its last token was never fed back).
    EXPECT_EQ(cached, int32_t(r.prompt.size() + got[size_t(c)].size()) - 1) << "choice " << c;
  }
}

} // namespace
} // namespace offgraph::engine
