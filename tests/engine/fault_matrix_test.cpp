// The fault matrix of a mixed step (docs/reliability.md, "Faults contained to their request"):
// every allocation site a step reaches fails in turn, one call at a time (every third call of
// each site), in two waves of requests mixing a fresh prompt with n-gram speculation, an image's
// embedding rows, structured output, two choices, a draft model's speculation, and the next
// turns of two conversations (reused from a fork or a snapshot, the draft's cache with them).
// The sites: the target's and the draft's KV stores (kv::KvStore::set_fault), the target's and
// the draft's graphs (model::Forward::set_allocation_fault) and sampling (std::bad_alloc).
// Against each request alone on a fresh engine: where the engine has a fallback (a snapshot
// instead of a fork, one reuse point fewer, a draft not used) every answer is as alone;
// elsewhere at most the request whose call failed ends with the error, after a prefix of its
// answer, and every other answers as alone. Nothing is left held but the cached conversations.
#include "engine/images.h"
#include "engine_util.h"
#include "sample/grammar.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <utility>

namespace offgraph::engine::testing {
namespace {

constexpr int32_t kBegin = 497, kEnd = 498, kEndToken = 2; // stand-ins: image markers, the end

SpeculationOptions speculation(DraftSource source) {
  SpeculationOptions s;
  s.source = source;
  s.n_max = 4, s.n_min = 1, s.adaptive = false;
  s.ngram.n_min = 1;
  return s;
}

// The two waves. The second holds the next turns of the first's conversations 0 and 4 (their
// answers alone appended), so that it reuses their caches.
std::vector<std::vector<Request>> mixed_waves() {
  std::mt19937_64 rng(44);
  std::vector<Request> first;
  // 0: a fresh prompt that repeats itself (n-gram drafts find something), n-gram speculation.
  std::vector<int32_t> repeat = random_tokens(rng, 12);
  for (int i = 0; i < 2; ++i) repeat.insert(repeat.end(), repeat.begin(), repeat.begin() + 12);
  first.push_back(greedy(repeat, 10));
  first.back().speculation = speculation(DraftSource::Ngram);
  // 1: an image of 12 rows between text.
  Request image = greedy(random_tokens(rng, 6), 8);
  image.prompt.push_back(kBegin);
  image.embeddings.push_back({int32_t(image.prompt.size()), random_image(5, 12)});
  ImageDigest digest{};
  digest[0] = 5;
  const auto ids = image_row_ids(digest, 12, 500);
  image.prompt.insert(image.prompt.end(), ids.begin(), ids.end());
  image.prompt.push_back(kEnd);
  const auto after = random_tokens(rng, 4);
  image.prompt.insert(image.prompt.end(), after.begin(), after.end());
  first.push_back(image);
  // 2: structured output.
  first.push_back(greedy(random_tokens(rng, 14), 12));
  first.back().grammar = calls_grammar().compiled;
  first.back().stop_tokens = {kEndToken};
  // 3: two choices of one prompt (sampled, each with its seed).
  first.push_back(greedy(random_tokens(rng, 20), 8));
  first.back().n = 2, first.back().sampling.temperature = 1.0, first.back().sampling.seed = 7;
  // 4: a draft model's speculation.
  first.push_back(greedy(random_tokens(rng, 26), 12));
  first.back().speculation = speculation(DraftSource::Draft);
  std::vector<Request> second;
  for (size_t i : {size_t(0), size_t(4)}) {
    Request next = first[i];
    Request plain = first[i];
    plain.speculation.reset();
    const std::vector<int32_t> answer = alone(plain);
    next.prompt.insert(next.prompt.end(), answer.begin(), answer.end());
    const auto more = random_tokens(rng, 5);
    next.prompt.insert(next.prompt.end(), more.begin(), more.end());
    next.max_tokens = 8;
    second.push_back(next);
  }
  // A prompt sharing conversation 3's prefix.
  Request shared = first[3];
  shared.n = 1, shared.prompt.resize(14);
  const auto tail = random_tokens(rng, 9);
  shared.prompt.insert(shared.prompt.end(), tail.begin(), tail.end());
  second.push_back(shared);
  return {first, second};
}

EngineOptions mixed_options() {
  EngineOptions o = options(8);
  o.page_rows = 8, o.snapshot_every = 16, o.max_active = 8;
  o.draft_model = fixture().model.get(); // the target as its own draft: every draft is kept
  return o;
}

// Per request: each choice's tokens, and its error ("" without one).
struct Answers {
  std::vector<std::vector<std::vector<int32_t>>> out;
  std::vector<std::string> errors;
};

// `after_step`, if set, sees the engine after each step.
Answers run_waves(const std::vector<std::vector<Request>> &waves, const EngineOptions &o,
                  const std::function<void(const Engine &)> &after_step = {}) {
  auto e = Engine::create(*fixture().model, o);
  EXPECT_TRUE(e.ok()) << e.message();
  Answers r;
  for (const auto &wave : waves)
    for (const Request &req : wave) {
      r.out.emplace_back(size_t(req.n));
      r.errors.emplace_back();
    }
  size_t k = 0;
  for (const auto &wave : waves) {
    for (const Request &req : wave) {
      auto id = (*e)->submit(req, [&r, k](const Event &ev) {
        if (ev.token >= 0) r.out[k][size_t(ev.choice)].push_back(ev.token);
        if (ev.finish == FinishReason::Error) r.errors[k] = ev.error;
      });
      EXPECT_TRUE(id.ok()) << id.message();
      ++k;
    }
    while ((*e)->step())
      if (after_step) after_step(**e);
    EXPECT_EQ((*e)->cached_bytes(), (*e)->cached_bytes_walked());
  }
  EXPECT_EQ((*e)->store().sequence_ids().size(), (*e)->cached()) << "a sequence was left held";
  EXPECT_EQ((*e)->draft_store()->sequence_ids().size(), (*e)->cached_drafts())
      << "a draft sequence was left held";
  return r;
}

// One site of the matrix: how it is injected (failing the call numbered `fail_at`, or counting
// calls where fail_at < 0), the words of its error, and how many requests may end with it.
struct Site {
  std::string name;
  std::function<void(EngineOptions &, int64_t fail_at, std::map<std::string, int64_t> &calls)>
      inject;
  std::string error;
  int max_failed = 1, min_failed = 0;
};

// A store call that fails: returning an error, or (`throws`) throwing std::bad_alloc as an
// allocation inside it would.
std::function<Status(std::string_view, kv::SeqId)>
store_fault(const std::string &prefix, const std::string &site, int64_t fail_at,
            std::map<std::string, int64_t> &calls, bool throws) {
  return [&calls, prefix, site, fail_at, throws](std::string_view s, kv::SeqId) {
    const int64_t n = calls[prefix + std::string(s)]++;
    if (s != site || n != fail_at) return Status();
    if (throws) throw std::bad_alloc();
    return Status::error("injected: no memory");
  };
}

std::vector<Site> sites() {
  std::vector<Site> out;
  for (const bool throws : {false, true}) {
    // Thrown: the words of the error where one is reported.
    const std::string how = throws ? " (thrown)" : "", no_memory = throws ? "out of memory" : "";
    for (const char *s : {"reserve", "fork", "fork_at_snapshot", "create_sequence", "snapshot"}) {
      const std::string site = s;
      // A fork for prefix reuse falls back to a snapshot, one at a snapshot to recomputing; a
      // lost snapshot is one reuse point fewer. A reserve, a new sequence and the fork of a
      // second choice end their request (choice).
      const bool falls_back = site == "fork_at_snapshot" || site == "snapshot";
      out.push_back({"kv:" + site + how,
                     [site, throws](EngineOptions &o, int64_t fail_at, auto &calls) {
                       o.kv_fault = store_fault("kv:", site, fail_at, calls, throws);
                     },
                     throws ? no_memory : "injected: no memory", falls_back ? 0 : 1});
    }
    // The draft's store: a draft that cannot be had is not used.
    for (const char *s : {"reserve", "fork", "create_sequence"}) {
      const std::string site = s;
      out.push_back({"draft_kv:" + site + how,
                     [site, throws](EngineOptions &o, int64_t fail_at, auto &calls) {
                       o.draft_kv_fault = store_fault("draft_kv:", site, fail_at, calls, throws);
                     },
                     "", 0});
    }
    // A graph that cannot be allocated (device memory, or host memory inside the pass: thrown)
    // runs as smaller steps; a part alone that cannot ends its request. The draft's graph: the
    // draft is not used.
    out.push_back({"allocation" + how,
                   [throws](EngineOptions &o, int64_t fail_at, auto &calls) {
                     o.allocation_fault = [&calls, fail_at, throws](const model::Batch &) {
                       const bool fail = calls["allocation"]++ == fail_at;
                       if (fail && throws) throw std::bad_alloc();
                       return fail;
                     };
                   },
                   "could not allocate the graph", 1});
    out.push_back({"draft_allocation" + how,
                   [throws](EngineOptions &o, int64_t fail_at, auto &calls) {
                     o.draft_allocation_fault = [&calls, fail_at, throws](const model::Batch &) {
                       const bool fail = calls["draft_allocation"]++ == fail_at;
                       if (fail && throws) throw std::bad_alloc();
                       return fail;
                     };
                   },
                   "", 0});
  }
  // Memory that cannot be had while a request samples: that request (choice) ends.
  out.push_back({"sampling",
                 [](EngineOptions &o, int64_t fail_at, auto &calls) {
                   o.sampling_fault = [&calls, fail_at](uint64_t) {
                     return calls["sampling"]++ == fail_at;
                   };
                 },
                 "out of memory while sampling", 1, 1});
  return out;
}

TEST(FaultMatrix, EverySiteOfAMixedStepFailsAtMostItsRequest) {
  const auto waves = mixed_waves();
  // Each request alone, plainly decoded (speculation gives the same greedy and seeded tokens).
  std::vector<std::vector<std::vector<int32_t>>> want;
  for (const auto &wave : waves)
    for (Request r : wave) {
      r.speculation.reset();
      want.push_back(choices_alone(r));
    }
  std::map<std::string, int64_t> calls;
  const std::vector<Site> all = sites();
  {
    EngineOptions o = mixed_options();
    for (const Site &s : all) s.inject(o, -1, calls);
    const Answers clean = run_waves(waves, o);
    ASSERT_EQ(clean.out, want);
    ASSERT_EQ(clean.errors, std::vector<std::string>(want.size(), ""));
  }
  int64_t runs = 0;
  for (const Site &site : all) {
    const int64_t n = calls[site.name.substr(0, site.name.find(' '))];
    ASSERT_GT(n, 0) << site.name << " is never reached by this mix";
    for (int64_t fail_at = 0; fail_at < n; fail_at += 3, ++runs) {
      SCOPED_TRACE(site.name + " call " + std::to_string(fail_at) + " of " + std::to_string(n) +
                   " fails");
      std::map<std::string, int64_t> seen;
      EngineOptions o = mixed_options();
      site.inject(o, fail_at, seen);
      const Answers got = run_waves(waves, o);
      int failed = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        if (got.errors[i].empty()) {
          EXPECT_EQ(got.out[i], want[i]) << "request " << i;
          continue;
        }
        ++failed;
        EXPECT_NE(got.errors[i].find(site.error), std::string::npos) << got.errors[i];
        for (size_t c = 0; c < want[i].size(); ++c) {
          const size_t have = std::min(got.out[i][c].size(), want[i][c].size());
          EXPECT_EQ(got.out[i][c],
                    std::vector<int32_t>(want[i][c].begin(), want[i][c].begin() + long(have)))
              << "request " << i << " choice " << c;
        }
      }
      EXPECT_LE(failed, site.max_failed);
      EXPECT_GE(failed, site.min_failed);
    }
  }
  std::string counts;
  for (const auto &[name, n] : calls) counts += " " + name + "=" + std::to_string(n);
  std::printf("[ matrix   ] %lld faulty runs; calls in the clean run:%s\n", (long long)runs,
              counts.c_str());
}

// std::bad_alloc that no fault site contains escapes a step (EngineOptions::step_fault, thrown
// after the step in which the first request finished): every request of that step ends with the
// error, after a prefix of its answer, each choice with exactly one last event (a request of two
// choices among them), none is kept, no sequence is left held, and the engine answers the next
// request as alone.
TEST(FaultMatrix, MemoryNoSiteContainsEndsTheStepsRequestsAndTheEngineGoesOn) {
  std::mt19937_64 rng(45);
  std::vector<Request> requests = {greedy(random_tokens(rng, 12), 6),
                                   greedy(random_tokens(rng, 10), 12),
                                   greedy(random_tokens(rng, 9), 12)};
  requests[2].n = 2, requests[2].sampling.temperature = 1.0, requests[2].sampling.seed = 3;
  EngineOptions o = options(4);
  bool first_done = false, thrown = false;
  o.step_fault = [&](int64_t) { return first_done && !std::exchange(thrown, true); };
  auto e = Engine::create(*fixture().model, o);
  ASSERT_TRUE(e.ok()) << e.message();
  std::vector<std::vector<std::vector<int32_t>>> out(requests.size());
  std::vector<std::vector<int>> last_events(requests.size());
  std::vector<std::string> errors(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    out[i].resize(size_t(requests[i].n)), last_events[i].assign(size_t(requests[i].n), 0);
    ASSERT_TRUE((*e)->submit(requests[i],
                             [&, i](const Event &ev) {
                               if (ev.token >= 0) out[i][size_t(ev.choice)].push_back(ev.token);
                               if (ev.finish == FinishReason::Error) errors[i] = ev.error;
                               if (ev.finish != FinishReason::None)
                                 ++last_events[i][size_t(ev.choice)];
                               if (i == 0 && ev.finish != FinishReason::None) first_done = true;
                             })
                    .ok());
  }
  (*e)->run_until_idle();
  EXPECT_EQ((*e)->stats().step_memory_faults, 1);
  EXPECT_EQ(out[0][0], alone(requests[0])); // it had finished when the step threw
  EXPECT_EQ(last_events[0], std::vector<int>{1});
  for (size_t i : {size_t(1), size_t(2)}) {
    EXPECT_NE(errors[i].find("out of memory in the engine's step"), std::string::npos) << errors[i];
    EXPECT_EQ(last_events[i], std::vector<int>(size_t(requests[i].n), 1)) << "request " << i;
    // Each choice's tokens: a prefix of its answer alone.
    Request one = requests[i];
    one.n = 1;
    for (int32_t c = 0; c < requests[i].n; ++c) {
      one.sampling.seed = requests[i].sampling.seed + uint64_t(c);
      const std::vector<int32_t> want = alone(one);
      const auto &got = out[i][size_t(c)];
      ASSERT_LE(got.size(), want.size());
      EXPECT_EQ(got, std::vector<int32_t>(want.begin(), want.begin() + long(got.size())))
          << "request " << i << " choice " << c;
    }
  }
  EXPECT_EQ((*e)->active(), 0u);
  EXPECT_EQ((*e)->store().sequence_ids().size(), (*e)->cached()) << "a sequence was left held";
  EXPECT_EQ((*e)->cached_bytes(), (*e)->cached_bytes_walked());
  const Request next = greedy(random_tokens(rng, 11), 8);
  EXPECT_EQ(run(**e, {next})[0], alone(next));
  // A receiver that never takes a last event (choice 1's, while the choices are being forked,
  // its only token): offered at each of the next steps, 16 times in all, then counted lost; the
  // choices beside it each get exactly one; no step-wide fault; nothing is left held.
  Request three = greedy(random_tokens(rng, 10), 1);
  three.n = 3;
  std::vector<int> ends(3, 0);
  ASSERT_TRUE((*e)->submit(three,
                           [&](const Event &ev) {
                             if (ev.finish == FinishReason::None) return;
                             ++ends[size_t(ev.choice)];
                             if (ev.choice == 1) throw std::bad_alloc();
                           })
                  .ok());
  (*e)->run_until_idle();
  EXPECT_EQ((*e)->stats().step_memory_faults, 1);
  EXPECT_EQ((*e)->stats().lost_end_events, 1);
  EXPECT_EQ(ends, (std::vector<int>{1, 16, 1}));
  EXPECT_EQ((*e)->store().sequence_ids().size(), (*e)->cached()) << "a sequence was left held";
}

// Memory that stays short: no graph of more than 8 tokens can be allocated, and (second run) no
// verify span either (any span of 2-5 tokens). Steps shrink to what was allocated (the learned
// cap: a few failures, not one per step), a prompt runs in halves, a verify span that fails
// alone steps aside for its plain token; every request answers as alone, none errors.
TEST(FaultMatrix, UnderMemoryThatStaysShortStepsShrinkAndDraftsStepAside) {
  std::mt19937_64 rng(46);
  std::vector<int32_t> repeat = random_tokens(rng, 10);
  for (int i = 0; i < 2; ++i) repeat.insert(repeat.end(), repeat.begin(), repeat.begin() + 10);
  std::vector<Request> requests = {greedy(repeat, 16), greedy(random_tokens(rng, 60), 8),
                                   greedy(random_tokens(rng, 14), 12)};
  requests[0].speculation = speculation(DraftSource::Ngram);
  std::vector<std::vector<int32_t>> want;
  for (Request r : requests) {
    r.speculation.reset();
    want.push_back(alone(r));
  }
  requests[0].prediction = want[0]; // its drafts: its own answer (every one kept)
  for (const bool verify_too : {false, true}) {
    SCOPED_TRACE(verify_too ? "no verify span either" : "no graph past 8 tokens");
    int64_t failures = 0, verified = 0;
    EngineOptions o = options(0);
    o.allocation_fault = [&](const model::Batch &b) {
      bool fail = b.tokens.size() > 8;
      for (const model::Batch::Span &sp : b.spans)
        if (verify_too && sp.n_tokens > 1 && sp.n_tokens <= 5) fail = true;
      failures += fail;
      return fail;
    };
    auto e = Engine::create(*fixture().model, o);
    ASSERT_TRUE(e.ok()) << e.message();
    std::vector<std::vector<int32_t>> out(requests.size());
    std::vector<std::string> errors(requests.size());
    for (size_t i = 0; i < requests.size(); ++i)
      ASSERT_TRUE((*e)->submit(requests[i],
                               [&, i](const Event &ev) {
                                 if (ev.token >= 0) out[i].push_back(ev.token);
                                 if (ev.finish == FinishReason::Error) errors[i] = ev.error;
                               })
                      .ok());
    (*e)->run_until_idle();
    verified = (*e)->stats().ngram.verifications;
    EXPECT_EQ(out, want);
    EXPECT_EQ(errors, std::vector<std::string>(requests.size(), ""));
    EXPECT_GT(failures, 0);
    if (verify_too) {
      EXPECT_EQ(verified, 0); // each verify span failed, and its token ran alone
      // A span size that failed alone is not tried again at every step (31 were, before each
      // generation learned its own: Engine::Generation::span).
      EXPECT_LE(failures, 12);
    } else {
      EXPECT_LE(failures, 4) << "a step size that failed was tried again";
      EXPECT_GT(verified, 0);
    }
    std::printf("[ short    ] %s: %lld failed allocations, %lld verifications\n",
                verify_too ? "verify spans too" : "past 8 tokens", (long long)failures,
                (long long)verified);
  }
}

// A compute budget (EngineOptions::compute_budget) as tight as the engine allows (one token's
// step at the full context, both models), and between that and a full prefill chunk: the mixed
// waves answer as without a budget, no step's compute buffers ever pass it, and graphs were
// refused (steps ran smaller). One byte below the tightest is refused at create by name.
TEST(FaultMatrix, UnderATightComputeBudgetStepsShrinkAndAnswersStayTheSame) {
  const std::vector<std::vector<Request>> waves = mixed_waves();
  const Answers want = run_waves(waves, mixed_options());
  for (const std::string &error : want.errors) ASSERT_EQ(error, "");
  EngineOptions probe = mixed_options();
  probe.compute_budget = int64_t(1) << 40;
  auto measured = Engine::create(*fixture().model, probe);
  ASSERT_TRUE(measured.ok()) << measured.message();
  const Engine::ComputeNeeds needs = (*measured)->compute_needs();
  ASSERT_EQ(needs.one_token.size(), 1u); // the CPU alone
  const int64_t one = needs.one_token[0].second, full = needs.full_chunk[0].second;
  ASSERT_LT(one, full);
  for (const int64_t budget : {one, (one + full) / 2}) {
    SCOPED_TRACE("budget " + std::to_string(budget) + " (one token " + std::to_string(one) +
                 ", a chunk " + std::to_string(full) + ")");
    EngineOptions o = mixed_options();
    o.compute_budget = budget;
    int64_t most = 0, refusals = 0, steps = 0;
    const Answers got = run_waves(waves, o, [&](const Engine &e) {
      int64_t compute = 0;
      for (const Engine::Load::DeviceBytes &b : e.load().by_device)
        if (std::string(b.use) == "compute") compute += b.bytes;
      most = std::max(most, compute);
      refusals = e.published_stats().compute_budget_refusals;
      ++steps;
    });
    EXPECT_EQ(got.out, want.out);
    EXPECT_EQ(got.errors, want.errors);
    EXPECT_LE(most, budget);
    EXPECT_GT(most, 0);
    EXPECT_GT(refusals, 0);
    std::printf("[ compute  ] budget %lld bytes (one token %lld, a chunk %lld): %lld steps, "
                "compute buffers at most %lld, %lld graphs refused\n",
                (long long)budget, (long long)one, (long long)full, (long long)steps,
                (long long)most, (long long)refusals);
  }
  EngineOptions o = mixed_options();
  o.compute_budget = one - 1;
  auto refused = Engine::create(*fixture().model, o);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("--compute-mib"), std::string::npos) << refused.message();
  EXPECT_NE(refused.message().find("one token's step"), std::string::npos) << refused.message();
}

// A receiver that cannot take a request's last event (std::bad_alloc from its callback: its
// queue, its message) the first time: the event is kept and sent again at the next step, each
// request sees exactly one last event, the step goes on (no step-wide fault), and every answer is
// the request's answer alone. Last events of finished, cancelled-while-queued and never-forked
// choices alike.
TEST(FaultMatrix, ALastEventTheReceiverCannotTakeIsSentAgain) {
  std::mt19937_64 rng(47);
  std::vector<Request> requests = {greedy(random_tokens(rng, 20), 6),
                                   greedy(random_tokens(rng, 12), 9),
                                   greedy(random_tokens(rng, 16), 5)};
  requests[2].n = 2, requests[2].sampling.temperature = 1.0, requests[2].sampling.seed = 3;
  const Request cancelled = greedy(random_tokens(rng, 10), 4);
  EngineOptions o = options(2);
  o.max_active = 1; // the others wait in the queue
  auto e = Engine::create(*fixture().model, o);
  ASSERT_TRUE(e.ok()) << e.message();
  struct Seen {
    std::vector<std::vector<int32_t>> tokens;
    std::vector<int> ends, refused;
    std::vector<FinishReason> how;
  };
  std::vector<Seen> seen(requests.size() + 1);
  auto callback = [&seen](size_t k) {
    return [&seen, k](const Event &ev) {
      Seen &s = seen[k];
      const size_t c = size_t(ev.choice);
      if (s.tokens.size() <= c) {
        s.tokens.resize(c + 1), s.ends.resize(c + 1), s.refused.resize(c + 1);
        s.how.resize(c + 1);
      }
      if (ev.token >= 0) s.tokens[c].push_back(ev.token);
      if (ev.finish == FinishReason::None) return;
      if (s.refused[c]++ == 0) throw std::bad_alloc(); // the first time, for every choice
      ++s.ends[c], s.how[c] = ev.finish;
    };
  };
  std::vector<uint64_t> ids;
  for (size_t k = 0; k < requests.size(); ++k) {
    auto id = (*e)->submit(requests[k], callback(k));
    ASSERT_TRUE(id.ok()) << id.message();
    ids.push_back(*id);
  }
  auto queued = (*e)->submit(cancelled, callback(requests.size()));
  ASSERT_TRUE(queued.ok());
  (*e)->cancel(*queued);
  (*e)->run_until_idle();
  for (size_t k = 0; k < requests.size(); ++k) {
    SCOPED_TRACE("request " + std::to_string(k));
    const std::vector<std::vector<int32_t>> want = choices_alone(requests[k]);
    ASSERT_EQ(seen[k].tokens.size(), want.size());
    EXPECT_EQ(seen[k].tokens, want);
    for (size_t c = 0; c < want.size(); ++c) {
      EXPECT_EQ(seen[k].ends[c], 1) << "choice " << c;
      EXPECT_EQ(seen[k].refused[c], 2) << "choice " << c;
      EXPECT_EQ(seen[k].how[c], FinishReason::Length) << "choice " << c;
    }
  }
  const Seen &c = seen.back();
  ASSERT_EQ(c.ends.size(), 1u);
  EXPECT_EQ(c.ends[0], 1);
  EXPECT_EQ(c.how[0], FinishReason::Cancelled);
  EXPECT_TRUE(c.tokens[0].empty());
  const EngineStats stats = (*e)->stats();
  EXPECT_EQ(stats.step_memory_faults, 0);
  EXPECT_EQ(stats.lost_end_events, 0);
  EXPECT_EQ((*e)->store().sequence_ids().size(), (*e)->cached());
}

} // namespace
} // namespace offgraph::engine::testing
