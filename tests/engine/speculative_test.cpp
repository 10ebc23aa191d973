// Speculative decoding against plain decoding: the same tokens, greedy and sampled (same seed),
// for every draft length, on a window-16 model whose rings wrap several times per answer, batched
// with plain requests, with choices, stop tokens, grammars and prefix reuse; drafts clipped to
// what a rejection can be rewound from. And the adaptive length's parts against their definitions.
#include "engine_util.h"

#include "sample/grammar.h"
#include "sample/grammar_matcher.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <unistd.h>

namespace offgraph::engine {
namespace {

using testing::fixture;
using testing::greedy;
using testing::options;
using testing::random_tokens;
using testing::run;

SpeculationOptions ngram(int32_t n_max, bool adaptive = false) {
  SpeculationOptions s;
  s.source = DraftSource::Ngram;
  s.n_max = n_max;
  s.n_min = 1;
  s.adaptive = adaptive;
  s.ngram.n_min = 1;
  return s;
}

// A prompt that echoes itself: a random passage, some noise, the passage again, then its start
// (the model's greedy answers on such prompts repeat stretches of them, and n-gram drafts hit).
std::vector<int32_t> echo_prompt(std::mt19937_64 &rng, size_t passage) {
  std::vector<int32_t> p = random_tokens(rng, passage);
  const auto noise = random_tokens(rng, 5);
  std::vector<int32_t> out = p;
  out.insert(out.end(), noise.begin(), noise.end());
  out.insert(out.end(), p.begin(), p.end());
  out.insert(out.end(), p.begin(), p.begin() + long(passage / 2));
  return out;
}

// Each request's tokens, its choices one after another (choice 0's, then 1's, ...).
std::vector<std::vector<int32_t>> run_with(const std::vector<Request> &reqs,
                                           std::optional<SpeculationOptions> spec,
                                           EngineStats *stats = nullptr,
                                           EngineOptions o = options(4)) {
  if (spec) o.speculation = *spec;
  auto e = Engine::create(*fixture().model, o);
  EXPECT_TRUE(e.ok()) << e.message();
  std::vector<std::vector<std::vector<int32_t>>> by_choice(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    by_choice[i].resize(size_t(reqs[i].n));
    auto id = (*e)->submit(reqs[i], [&by_choice, i](const Event &ev) {
      if (ev.token >= 0) by_choice[i][size_t(ev.choice)].push_back(ev.token);
      EXPECT_NE(ev.finish, FinishReason::Error) << ev.error;
    });
    EXPECT_TRUE(id.ok()) << id.message();
  }
  (*e)->run_until_idle();
  if (stats) *stats = (*e)->stats();
  std::vector<std::vector<int32_t>> out(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i)
    for (const auto &c : by_choice[i]) out[i].insert(out[i].end(), c.begin(), c.end());
  return out;
}

TEST(Speculative, GreedyEqualsPlainDecodingForEveryDraftLength) {
  std::mt19937_64 rng(41);
  std::vector<Request> reqs;
  for (int i = 0; i < 6; ++i) reqs.push_back(greedy(echo_prompt(rng, 10 + 4 * size_t(i)), 70));
  for (int i = 0; i < 3; ++i) reqs.push_back(greedy(random_tokens(rng, 20 + 7 * size_t(i)), 60));
  const auto plain = run_with(reqs, std::nullopt);
  for (int32_t k = 1; k <= 8; ++k) {
    EngineStats stats;
    const auto spec = run_with(reqs, ngram(k), &stats);
    for (size_t i = 0; i < reqs.size(); ++i)
      ASSERT_EQ(spec[i], plain[i]) << "request " << i << ", draft length " << k;
    // The rings hold 16 + 8 - 1 rows; 70 tokens wrap them three times.
    EXPECT_GT(stats.ngram.verifications, 0) << k;
    EXPECT_GT(stats.ngram.accepted, 0) << k;
    EXPECT_LT(stats.ngram.accepted, stats.ngram.drafted) << k;
    EXPECT_LT(stats.decode_spans, stats.generated_tokens - int64_t(reqs.size())) << k;
    int64_t kept = 0, verifications = 0;
    for (size_t j = 0; j < stats.ngram.kept.size(); ++j) {
      if (j > size_t(k)) {
        EXPECT_EQ(stats.ngram.kept[j], 0);
      }
      kept += stats.ngram.kept[j] * int64_t(j), verifications += stats.ngram.kept[j];
    }
    EXPECT_EQ(kept, stats.ngram.accepted);
    EXPECT_EQ(verifications, stats.ngram.verifications);
  }
}

// A prediction (OpenAI's Predicted Outputs) that is the plain answer with tokens changed at
// spacings of 1 to 9: drafts from it are rejected at every draft position, kept whole too, and
// the answer is still the plain one.
TEST(Speculative, RejectionsAtEveryDraftPositionStayExact) {
  std::mt19937_64 rng(43);
  std::vector<Request> reqs;
  for (int i = 0; i < 6; ++i) reqs.push_back(greedy(random_tokens(rng, 12 + size_t(i)), 80));
  const auto plain = run_with(reqs, std::nullopt);
  for (size_t i = 0; i < reqs.size(); ++i) {
    std::vector<int32_t> p = plain[i];
    for (size_t at = i % 3, gap = 1; at < p.size(); at += gap, gap = gap % 9 + 1)
      p[at] = (p[at] + 1) % 500;
    reqs[i].prediction = p;
  }
  EngineStats stats;
  const auto spec = run_with(reqs, ngram(7), &stats);
  for (size_t i = 0; i < reqs.size(); ++i) ASSERT_EQ(spec[i], plain[i]) << "request " << i;
  for (size_t j = 0; j <= 7; ++j)
    EXPECT_GT(stats.ngram.kept[j], 0) << "no verification kept exactly " << j << " drafts";
}

// Sampling draws each kept token with the request's own sampler, in order: the same seed gives
// the same text with or without drafts (penalties read the same history).
TEST(Speculative, SampledTextIsThePlainTextOfTheSameSeed) {
  std::mt19937_64 rng(45);
  std::vector<Request> reqs;
  for (int i = 0; i < 6; ++i) {
    Request r = greedy(echo_prompt(rng, 12), 60);
    r.sampling.temperature = 0.7f;
    r.sampling.top_k = 20;
    r.sampling.top_p = 0.9f;
    r.sampling.min_p = 0.0f;
    r.sampling.repetition_penalty = i % 2 ? 1.1f : 1.0f;
    r.sampling.seed = 100 + uint64_t(i);
    reqs.push_back(r);
  }
  const auto plain = run_with(reqs, std::nullopt);
  EngineStats stats;
  auto spec = run_with(reqs, ngram(6), &stats); // drafts from the context alone
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(spec[i], plain[i]) << "request " << i;
  // And drafts from a prediction of the answer itself: most are kept.
  for (size_t i = 0; i < reqs.size(); ++i) reqs[i].prediction = plain[i];
  spec = run_with(reqs, ngram(6), &stats);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(spec[i], plain[i]) << "request " << i;
  EXPECT_GT(stats.ngram.accepted, stats.ngram.drafted / 2);
}

// Speculating requests batched with plain ones, per-request choices of drafts, n > 1, stop
// tokens: each answers as it does alone without drafts.
TEST(Speculative, MixedBatchesChoicesAndStopsAnswerAsPlainDecoding) {
  std::mt19937_64 rng(47);
  std::vector<Request> reqs;
  for (int i = 0; i < 8; ++i) {
    Request r = greedy(i % 2 ? echo_prompt(rng, 9) : random_tokens(rng, 25), 50);
    if (i % 4 == 1) r.speculation = ngram(5);
    if (i % 4 == 3) r.speculation = SpeculationOptions{}; // none, though the engine drafts
    if (i == 5) r.n = 3, r.sampling.temperature = 0.9f, r.sampling.seed = 7;
    reqs.push_back(r);
  }
  auto plain = run_with(reqs, std::nullopt);
  // A stop token each answer writes midway, which a verify span may hold with drafts after it.
  for (size_t i = 0; i < reqs.size(); ++i) reqs[i].stop_tokens = {plain[i][plain[i].size() / 2]};
  plain = run_with(reqs, std::nullopt);
  EngineStats stats;
  const auto spec = run_with(reqs, ngram(8), &stats);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(spec[i], plain[i]) << "request " << i;
  EXPECT_GT(stats.ngram.accepted, 0);
}

// A grammar masks each row as it is sampled: the constrained answer is the plain one.
TEST(Speculative, ConstrainedAnswersAreThePlainOnes) {
  // Tokens spell "<i>"; an answer is a run of tokens 10 to 99 (any of them, so that the model's
  // repetitions and the drafts stay possible).
  auto texts = std::make_shared<sample::TokenTexts>();
  for (int i = 0; i < 500; ++i) texts->bytes.push_back("<" + std::to_string(i) + ">");
  texts->special.assign(500, 0);
  texts->special[2] = 1;
  sample::GrammarBuilder g;
  std::vector<sample::Sequence> items;
  for (int i = 10; i < 100; ++i) items.push_back(g.literal("<" + std::to_string(i) + ">"));
  const sample::Element item = g.choice("item", items);
  auto some = g.repeat("items", {item}, 1, sample::kUnbounded);
  ASSERT_TRUE(some.ok());
  const sample::Element root = g.rule("root", {{*some}});
  auto parsed = std::move(g).finish(root.value);
  ASSERT_TRUE(parsed.ok()) << parsed.message();
  auto grammar =
      sample::compile_grammar(*parsed, std::make_shared<sample::GrammarVocabulary>(texts), {2});
  ASSERT_TRUE(grammar.ok()) << grammar.message();
  std::mt19937_64 rng(49);
  std::vector<Request> reqs;
  for (int i = 0; i < 4; ++i) {
    Request r = greedy(echo_prompt(rng, 10), 40);
    r.grammar = *grammar;
    r.stop_tokens = {2}; // the grammar's end
    reqs.push_back(r);
  }
  const auto plain = run_with(reqs, std::nullopt);
  EngineStats stats;
  const auto spec = run_with(reqs, ngram(6), &stats);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(spec[i], plain[i]) << "request " << i;
  EXPECT_GT(stats.ngram.verifications, 0);
}

// A draft longer than the ring slack allows is clipped to max_write - 1 (a longer verify span
// could not be rewound: cache::Sequence::max_draft_tokens), never refused mid-step or rewound
// wrongly; and a conversation continued after speculation reuses the cache exactly.
TEST(Speculative, DraftsAreClippedToTheRingSlackAndTheCacheStaysReusable) {
  std::mt19937_64 rng(51);
  const std::vector<int32_t> prompt = echo_prompt(rng, 14);
  EngineOptions o = options(4); // max_write 8
  o.speculation = ngram(20);
  auto e = Engine::create(*fixture().model, o);
  ASSERT_TRUE(e.ok());
  Request r = greedy(prompt, 60);
  r.prediction = run_with({r}, std::nullopt)[0]; // drafts of 20 would all be kept
  const auto first = run(**e, {r})[0];
  EXPECT_EQ(first, r.prediction);
  const EngineStats &s = (*e)->stats();
  EXPECT_GT(s.ngram.kept[7], 0);
  for (size_t j = 8; j < s.ngram.kept.size(); ++j) EXPECT_EQ(s.ngram.kept[j], 0) << j;
  std::vector<int32_t> next = prompt;
  next.insert(next.end(), first.begin(), first.end());
  const auto more = random_tokens(rng, 4);
  next.insert(next.end(), more.begin(), more.end());
  const int64_t before = s.computed_prompt_tokens;
  const auto second = run(**e, {greedy(next, 40)})[0];
  // The answer's last token (never fed back) and the four new ones.
  EXPECT_EQ(s.computed_prompt_tokens - before, 5);
  EXPECT_EQ(second, run_with({greedy(next, 40)}, std::nullopt)[0]);
}

// A draft model: another small model of the same vocabulary (its own KV store, its own rings of
// window 8 that wrap), or the target itself.
struct DraftFixture {
  std::string path;
  std::unique_ptr<model::Model> model;
  DraftFixture() {
    path = (testing::fs::temp_directory_path() /
            ("offgraph-draft-test-" + std::to_string(::getpid()) + ".gguf"))
               .string();
    synth::SynthSpec s = synth::preset("tiny", "muse-glimmer").value();
    s.n_layer = 2, s.n_embd = 32, s.n_head = 2, s.n_head_kv = 1, s.head_dim = 16, s.n_ff = 48,
    s.window = 8, s.n_vocab = 500, s.seed = 21;
    EXPECT_TRUE(synth::write_model(s, path).ok());
    model = std::move(model::Model::load(path)).value();
  }
  ~DraftFixture() { testing::fs::remove(path); }
};
DraftFixture &draft_fixture() {
  static DraftFixture f;
  return f;
}

SpeculationOptions draft_model(int32_t n_max, bool pq = false) {
  SpeculationOptions s = ngram(n_max);
  s.source = DraftSource::Draft;
  s.pq = pq;
  return s;
}

// Greedy answers, and sampled ones verified by sampling and matching (the default), are plain
// decoding's; with speculative sampling (pq) greedy ones still are. No draft sequence outlives its
// request but with a cached conversation.
TEST(SpeculativeDraftModel, AnswersEqualPlainDecodingForEveryDraftLength) {
  std::mt19937_64 rng(61);
  std::vector<Request> reqs;
  for (int i = 0; i < 6; ++i) {
    Request r = greedy(i % 2 ? echo_prompt(rng, 9) : random_tokens(rng, 30 + size_t(i)), 50);
    if (i % 3 == 2) r.sampling.temperature = 0.8f, r.sampling.seed = 5 + uint64_t(i);
    if (i == 4) r.n = 2, r.sampling.temperature = 0.9f, r.sampling.seed = 9;
    reqs.push_back(r);
  }
  const auto plain = run_with(reqs, std::nullopt);
  for (bool pq : {false, true})
    for (int32_t k : {1, 3, 7}) {
      EngineOptions o = options(4);
      o.speculation = draft_model(k, pq);
      o.draft_model = draft_fixture().model.get();
      auto e = Engine::create(*fixture().model, o);
      ASSERT_TRUE(e.ok()) << e.message();
      std::vector<std::vector<std::vector<int32_t>>> out(reqs.size());
      for (size_t i = 0; i < reqs.size(); ++i) {
        out[i].resize(size_t(reqs[i].n));
        ASSERT_TRUE((*e)->submit(reqs[i],
                                 [&out, i](const Event &ev) {
                                   if (ev.token >= 0) out[i][size_t(ev.choice)].push_back(ev.token);
                                   EXPECT_NE(ev.finish, FinishReason::Error) << ev.error;
                                 })
                        .ok());
      }
      (*e)->run_until_idle();
      for (size_t i = 0; i < reqs.size(); ++i) {
        std::vector<int32_t> all;
        for (const auto &c : out[i]) all.insert(all.end(), c.begin(), c.end());
        if (!pq || reqs[i].sampling.temperature == 0) {
          EXPECT_EQ(all, plain[i]) << "request " << i << ", draft length " << k << ", pq " << pq;
        }
      }
      // Choices drafted from q draw from streams of their own: their answers differ.
      if (pq) {
        EXPECT_NE(out[4][0], out[4][1]);
      }
      const EngineStats &stats = (*e)->stats();
      EXPECT_GT(stats.draft.verifications, 0) << k;
      // k draft passes per verification at least, batched over at most 4 sequences.
      EXPECT_GE(4 * stats.draft_steps, int64_t(k) * stats.draft.verifications) << k;
      EXPECT_EQ(stats.ngram.verifications, 0) << k;
      // Draft caches outlive their requests only with a cached conversation (prefix reuse).
      EXPECT_LE((*e)->draft_store()->sequence_ids().size(), (*e)->cached());
    }
}

// The target as its own draft: every drafted token is the target's greedy choice, so every one
// is kept, across catch-ups, rewinds of the draft cache and rings that wrap; mixed in one batch
// with n-gram and plain requests.
TEST(SpeculativeDraftModel, TheTargetAsItsOwnDraftKeepsEveryDraft) {
  std::mt19937_64 rng(63);
  std::vector<Request> reqs;
  for (int i = 0; i < 6; ++i) {
    Request r = greedy(random_tokens(rng, 20 + 9 * size_t(i)), 60);
    if (i == 4) r.speculation = ngram(4);
    if (i == 5) r.speculation = SpeculationOptions{};
    reqs.push_back(r);
  }
  const auto plain = run_with(reqs, std::nullopt);
  EngineOptions o = options(4);
  o.draft_model = fixture().model.get();
  EngineStats stats;
  const auto spec = run_with(reqs, draft_model(5), &stats, o);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(spec[i], plain[i]) << "request " << i;
  EXPECT_GT(stats.draft.drafted, 100);
  EXPECT_EQ(stats.draft.accepted, stats.draft.drafted);
  EXPECT_GT(stats.ngram.verifications, 0);
}

// Speculative sampling with a draft model (p/q): the tokens follow the target's distribution.
// Tokens 2 to 5 of 3,000 sampled answers with a presence penalty (drafts of 2 from another model,
// q != p, so the penalties read drafted tokens too) against 3,000 plain ones: a two-sample
// chi-square test at p = 0.001 per position.
TEST(SpeculativeDraftModel, SpeculativeSamplingFollowsTheTargetsDistribution) {
  std::mt19937_64 rng(65);
  const std::vector<int32_t> prompt = random_tokens(rng, 24);
  constexpr int kRuns = 3000;
  auto tokens_at = [&](std::optional<SpeculationOptions> spec) {
    EngineOptions o = options(0);
    o.max_active = 8, o.step_tokens = 64;
    o.draft_model = draft_fixture().model.get();
    if (spec) o.speculation = *spec;
    auto e = Engine::create(*fixture().model, o);
    EXPECT_TRUE(e.ok()) << e.message();
    std::vector<std::vector<int32_t>> out(kRuns);
    for (int first = 0; first < kRuns; first += 60) {
      for (int i = first; i < std::min(kRuns, first + 60); ++i) {
        Request r = greedy(prompt, 5);
        r.sampling.temperature = 1.5f, r.sampling.top_k = 5, r.sampling.top_p = 1.0f;
        r.sampling.presence_penalty = 1.0f;
        r.sampling.min_p = 0.0f, r.sampling.seed = 1000 + uint64_t(i);
        EXPECT_TRUE((*e)->submit(r,
                                 [&out, i](const Event &ev) {
                                   if (ev.token >= 0) out[size_t(i)].push_back(ev.token);
                                 })
                        .ok());
      }
      (*e)->run_until_idle();
    }
    return std::make_pair(out, (*e)->stats());
  };
  const auto [plain, plain_stats] = tokens_at(std::nullopt);
  const auto [spec, spec_stats] = tokens_at(draft_model(2, true));
  EXPECT_GT(spec_stats.draft.accepted, 0);
  EXPECT_LT(spec_stats.draft.accepted, spec_stats.draft.drafted); // q != p: some rejected
  // Rejections at the second drafted token too (the residual drawn after a kept first one).
  EXPECT_GT(spec_stats.draft.kept[1], 0)
      << spec_stats.draft.kept[0] << " " << spec_stats.draft.kept[2];
  for (size_t at : {size_t(1), size_t(2), size_t(3), size_t(4)}) {
    std::map<int32_t, std::pair<double, double>> counts;
    for (int i = 0; i < kRuns; ++i) {
      ASSERT_EQ(plain[size_t(i)].size(), 5u);
      ASSERT_EQ(spec[size_t(i)].size(), 5u);
      counts[plain[size_t(i)][at]].first += 1;
      counts[spec[size_t(i)][at]].second += 1;
    }
    // Cells with fewer than 10 in all pooled into one.
    double chi = 0, pooled_a = 0, pooled_b = 0;
    int cells = 0;
    for (const auto &[token, ab] : counts) {
      if (ab.first + ab.second < 10) {
        pooled_a += ab.first, pooled_b += ab.second;
        continue;
      }
      chi += (ab.first - ab.second) * (ab.first - ab.second) / (ab.first + ab.second), ++cells;
    }
    if (pooled_a + pooled_b > 0)
      chi += (pooled_a - pooled_b) * (pooled_a - pooled_b) / (pooled_a + pooled_b), ++cells;
    ASSERT_GE(cells, 5);
    // The 0.999 quantile of chi-square with cells - 1 degrees of freedom (Wilson-Hilferty).
    const double df = cells - 1, z = 3.0902;
    const double critical = df * std::pow(1 - 2 / (9 * df) + z * std::sqrt(2 / (9 * df)), 3);
    EXPECT_LT(chi, critical) << "token " << at << ": chi-square " << chi << " over " << cells
                             << " cells";
  }
}

// The target as its own sampled draft: q = p up to rounding, so nearly every draft is kept.
TEST(SpeculativeDraftModel, SampledDraftsFromTheTargetItselfAreKept) {
  std::mt19937_64 rng(67);
  std::vector<Request> reqs;
  for (int i = 0; i < 4; ++i) {
    Request r = greedy(random_tokens(rng, 20 + size_t(i)), 40);
    r.sampling.temperature = 1.0f, r.sampling.seed = 77 + uint64_t(i);
    reqs.push_back(r);
  }
  EngineOptions o = options(4);
  o.draft_model = fixture().model.get();
  EngineStats stats;
  run_with(reqs, draft_model(4, true), &stats, o);
  EXPECT_GT(stats.draft.drafted, 50);
  EXPECT_GE(double(stats.draft.accepted), 0.97 * double(stats.draft.drafted));
}

// Prefix reuse reaches the draft store: an agent loop's next turn forks the draft cache kept with
// the cached conversation, so the draft model catches up only what is new; the answers stay plain
// decoding's.
TEST(SpeculativeDraftModel, TheDraftCacheIsReusedWithTheConversation) {
  std::mt19937_64 rng(69);
  EngineOptions o = options(2);
  o.speculation = draft_model(3);
  o.draft_model = draft_fixture().model.get();
  auto e = Engine::create(*fixture().model, o);
  ASSERT_TRUE(e.ok()) << e.message();
  std::vector<int32_t> history = random_tokens(rng, 40);
  int64_t caught_up = 0;
  for (int turn = 0; turn < 3; ++turn) {
    const Request r = greedy(history, 20);
    const auto got = run(**e, {r})[0];
    EXPECT_EQ(got, run_with({r}, std::nullopt)[0]) << "turn " << turn;
    const int64_t now = (*e)->stats().draft_catch_up_tokens;
    if (turn == 0) {
      EXPECT_GE(now, 39); // the whole prompt but its last token
    } else { // what the target computed anew (the answer and the new tokens), not the history
      EXPECT_LE(now - caught_up, 20 + 8) << "turn " << turn;
    }
    caught_up = now;
    history.insert(history.end(), got.begin(), got.end());
    const auto added = random_tokens(rng, 8);
    history.insert(history.end(), added.begin(), added.end());
  }
  EXPECT_GT((*e)->stats().draft.verifications, 0);
}

// Under a KV budget the draft model's store has the budget's share (in proportion to a
// full-context sequence of each): it never holds more, cached conversations' drafts give way when
// a new draft needs room, and the answers are plain decoding's.
TEST(SpeculativeDraftModel, TheDraftStoreStaysInsideItsShareOfTheKvBudget) {
  std::mt19937_64 rng(70);
  EngineOptions o = options(3);
  o.speculation = draft_model(3);
  o.draft_model = draft_fixture().model.get();
  std::vector<Request> reqs;
  for (int i = 0; i < 6; ++i) reqs.push_back(greedy(random_tokens(rng, 30 + 5 * i), 16));
  {
    auto probe = Engine::create(*fixture().model, o);
    ASSERT_TRUE(probe.ok());
    o.kv_budget = 2 * (*probe)->peak_kv_bytes(reqs.back()); // two at a time
  }
  auto e = Engine::create(*fixture().model, o);
  ASSERT_TRUE(e.ok()) << e.message();
  const kv::KvStore &drafts = *(*e)->draft_store();
  ASSERT_GT(drafts.memory_budget(), 0);
  EXPECT_LT(drafts.memory_budget(), o.kv_budget);
  std::vector<std::vector<int32_t>> got(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i)
    ASSERT_TRUE((*e)->submit(reqs[i],
                             [&got, i](const Event &ev) {
                               if (ev.token >= 0) got[i].push_back(ev.token);
                               EXPECT_NE(ev.finish, FinishReason::Error) << ev.error;
                             })
                    .ok());
  int64_t peak = 0;
  while ((*e)->step()) {
    EXPECT_LE(drafts.bytes_in_use(), drafts.memory_budget());
    peak = std::max(peak, drafts.bytes_in_use());
  }
  EXPECT_GT(peak, 0);
  EXPECT_EQ(got, run_with(reqs, std::nullopt));
  EXPECT_GT((*e)->stats().draft.verifications, 0);
}

TEST(SpeculativeDraftModel, ADraftModelIsRefusedWhereItCannotServe) {
  EngineOptions o = options(0);
  o.speculation = draft_model(4);
  auto none = Engine::create(*fixture().model, o); // no draft model
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.message().find("draft model"), std::string::npos) << none.message();
  auto plain = Engine::create(*fixture().model, options(0));
  Request r = greedy({1, 2, 3}, 4);
  r.speculation = draft_model(4);
  auto id = (*plain)->submit(r, nullptr);
  ASSERT_FALSE(id.ok());
  EXPECT_NE(id.message().find("no draft model"), std::string::npos) << id.message();
  r.prediction = {1, 2};
  o = options(0), o.draft_model = fixture().model.get();
  auto with = Engine::create(*fixture().model, o);
  ASSERT_TRUE(with.ok()) << with.message();
  id = (*with)->submit(r, nullptr);
  ASSERT_FALSE(id.ok());
  EXPECT_NE(id.message().find("prediction"), std::string::npos) << id.message();
}

TEST(Speculative, OptionsOutOfRangeAreRefusedByName) {
  SpeculationOptions bad = ngram(0);
  EXPECT_NE(validate(bad).message().find("n_max"), std::string::npos);
  bad = ngram(4), bad.n_min = 5;
  EXPECT_NE(validate(bad).message().find("n_min"), std::string::npos);
  EngineOptions o = options(0);
  o.speculation = ngram(65);
  EXPECT_FALSE(Engine::create(*fixture().model, o).ok());
  auto e = Engine::create(*fixture().model, options(0));
  Request r = greedy({1, 2, 3}, 4);
  r.speculation = ngram(4), r.speculation->ngram.n_min = 0;
  auto id = (*e)->submit(r, nullptr);
  ASSERT_FALSE(id.ok());
  EXPECT_NE(id.message().find("shortest match"), std::string::npos) << id.message();
  EXPECT_EQ(parse_draft_source("ngram").value(), DraftSource::Ngram);
  EXPECT_NE(parse_draft_source("eagle").message().find("'eagle'"), std::string::npos);
}

// The adaptive length's parts against their definitions.
TEST(SpeculativeAdaptive, BestLengthIsTheBruteForceArgmax) {
  std::mt19937_64 rng(53);
  for (double rate : {0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 0.99})
    for (int trial = 0; trial < 20; ++trial) {
      // Costs rising by random steps (the measured shapes: a jump, then slower growth).
      std::vector<double> cost = {1.0};
      for (int k = 1; k <= 12; ++k)
        cost.push_back(cost.back() + std::uniform_real_distribution<double>(0.01, 1.2)(rng));
      int32_t best = 0;
      double best_gain = 1.0;
      for (int32_t k = 1; k <= 12; ++k) {
        double expected = 0;
        for (int32_t i = 0; i <= k; ++i) expected += std::pow(rate, i);
        if (expected / cost[size_t(k)] > best_gain + 1e-12)
          best = k, best_gain = expected / cost[size_t(k)];
      }
      EXPECT_EQ(best_draft_length(rate, cost), best) << rate << " " << trial;
    }
  const std::vector<double> linear = {1.0, 1.25, 1.5, 1.75};
  EXPECT_EQ(best_draft_length(0.2, linear), 0); // a draft kept less often than it costs
}

TEST(SpeculativeAdaptive, StepCostUsesWhatItMeasured) {
  StepCost c;
  // Nothing measured: the prior, kPrior per token.
  EXPECT_EQ(c.relative(1, 2),
            (std::vector<double>{1.0, 1.0 + StepCost::kPrior, 1.0 + 2 * StepCost::kPrior}));
  // Measured sizes give their ratios; a size not measured extends the largest one below it by
  // kOptimism of a one-token step per token (optimistic, so that it gets tried).
  for (int i = 0; i < 50; ++i) c.observe(1, 0.010), c.observe(2, 0.022), c.observe(4, 0.030);
  const std::vector<double> r = c.relative(1, 5);
  EXPECT_NEAR(r[1], 2.2, 1e-9);
  EXPECT_NEAR(r[2], 2.2 + StepCost::kOptimism, 1e-9); // 3 tokens: from 2
  EXPECT_NEAR(r[3], 3.0, 1e-9);
  EXPECT_NEAR(r[5], 3.0 + 2 * StepCost::kOptimism, 1e-9);
  EXPECT_NEAR(c.relative(2, 2)[2], 0.030 / 0.022, 1e-9);
  // Recent steps weigh more: the mean follows a change.
  for (int i = 0; i < 200; ++i) c.observe(2, 0.011);
  EXPECT_NEAR(c.relative(1, 1)[1], 1.1, 1e-3);
  c.observe(3, -1.0), c.observe(0, 1.0), c.observe(StepCost::kMaxTokens + 1, 1.0); // ignored
  EXPECT_NEAR(c.relative(1, 2)[2], 1.1 + StepCost::kOptimism, 1e-3);
  // Only larger sizes measured: the smallest, scaled by the prior, stands for a one-token step.
  StepCost d;
  for (int i = 0; i < 10; ++i) d.observe(3, 0.015);
  EXPECT_NEAR(d.relative(3, 2)[2], 1.0 + 2 * StepCost::kOptimism / 1.5, 1e-9);
}

TEST(SpeculativeAdaptive, ADrafterThatKeepsMissingStopsAndProbes) {
  SpeculationOptions o = ngram(8, true);
  const std::vector<double> prior_cost = StepCost().relative(1, 8); // 0.25 per drafted token
  // 0..29, another token, then 0..9 again: the continuation 10..29 can be drafted.
  std::vector<int32_t> history;
  for (int32_t i = 0; i < 30; ++i) history.push_back(i);
  history.push_back(100);
  for (int32_t i = 0; i < 9; ++i) history.push_back(i);
  Speculator s(o, {}, history);
  s.append(9);
  EXPECT_FALSE(s.draft(8, prior_cost).empty()); // the prior: one of two kept
  for (int i = 0; i < 20; ++i) s.observe(1, 0); // the first drafted token rejected each time
  EXPECT_LT(s.acceptance().rate(), 0.2);
  int drafted = 0;
  for (int i = 0; i < 3 * Speculator::kProbeEvery; ++i) {
    const auto d = s.draft(8, prior_cost);
    EXPECT_LE(d.size(), 1u);
    drafted += !d.empty();
  }
  EXPECT_EQ(drafted, 3); // one probe every kProbeEvery steps
  for (int i = 0; i < 40; ++i) s.observe(4, 4);
  EXPECT_GE(s.draft(8, prior_cost).size(), 4u); // kept again: long drafts again
  // A sequence that starts from a low prior (the engine's recent rate) does not draft at first.
  Speculator low(o, {}, history, 0.05);
  low.append(9);
  EXPECT_TRUE(low.draft(8, prior_cost).empty());
  Speculator high(o, {}, history, 0.95);
  high.append(9);
  EXPECT_GE(high.draft(8, prior_cost).size(), 4u);
}

// The cursor against its definition, computed naively: while every token kept is the
// prediction's next one, drafts are the prediction's next tokens; once lost, the end e of the
// longest match (n_min..n_max tokens) of the history's tail in the prediction, of equal ones the
// first at or after the place last followed, else the first; a match at the prediction's end, or
// an answer gone past an end it followed to (or found by a match of n_max), drafts nothing. Random
// predictions over a small alphabet (many repeats), followed with random substitutions and
// insertions.
TEST(PredictionCursor, DraftsAreTheNaiveDefinitionsWhileFollowingAndLost) {
  std::mt19937_64 rng(61);
  int64_t found_again = 0, used_up = 0, gone_past = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int32_t alphabet = 2 + int32_t(rng() % 6), n_min = 1 + int32_t(rng() % 3),
                  n_max = n_min + int32_t(rng() % 4);
    std::vector<int32_t> prediction(1 + rng() % 40);
    for (int32_t &t : prediction) t = int32_t(rng() % uint64_t(alphabet));
    std::vector<int32_t> history(rng() % 5);
    for (int32_t &t : history) t = 50 + int32_t(rng() % 3); // a prompt the prediction lacks
    PredictionCursor cursor(prediction, n_min, n_max);
    const int64_t size = int64_t(prediction.size());
    int64_t next = 0, followed = 0; // the naive model's state; -2: gone past the end
    int64_t found = n_max;          // the match that found the place: n_max while confirmed
    size_t at = 0;                  // where the output stands in the prediction it copies
    for (int step = 0; step < 60; ++step) {
      const size_t k = 1 + rng() % 5;
      if (next == -1) { // lost: find the prediction again, from the definition
        auto matches = [&](int64_t e, int64_t n) {
          return n <= e && n <= int64_t(history.size()) &&
                 std::equal(prediction.begin() + (e - n), prediction.begin() + e,
                            history.end() - n);
        };
        int64_t pick = -1;
        for (int64_t n = n_max; n >= n_min && pick < 0; --n) {
          for (int64_t e = followed; e <= size && pick < 0; ++e)
            if (e >= 1 && matches(e, n)) pick = e;
          for (int64_t e = 1; e < followed && pick < 0; ++e)
            if (matches(e, n)) pick = e;
        }
        next = pick;
        found = 0;
        for (int64_t n = n_max; pick >= 0 && n >= n_min && found == 0; --n)
          if (matches(pick, n)) found = n;
        found_again += pick >= 0 && pick < size;
        used_up += pick == size;
      }
      std::vector<int32_t> expected;
      if (next >= 0)
        expected.assign(prediction.begin() + next,
                        prediction.begin() + std::min<int64_t>(next + int64_t(k), size));
      const PredictionCursor::Draft d = cursor.draft(history, k);
      ASSERT_EQ(d.tokens, expected) << "trial " << trial << " step " << step;
      ASSERT_EQ(cursor.next(), next) << "trial " << trial << " step " << step;
      if (next >= 0) {
        ASSERT_EQ(d.match, found) << "trial " << trial << " step " << step;
      }
      // The next token kept: mostly the copied prediction's, sometimes another one.
      int32_t token = at < prediction.size() ? prediction[at] : int32_t(rng() % uint64_t(alphabet));
      if (rng() % 5 == 0) token = int32_t(rng() % uint64_t(alphabet + 1));
      if (rng() % 7 != 0) ++at; // else an insertion: the copy stays where it was
      cursor.follow(token);
      history.push_back(token);
      if (next == -2) continue;
      if (next >= 0 && next < size && prediction[size_t(next)] == token)
        followed = ++next, found = n_max;
      else
        next = next == size && found == n_max ? -2 : -1;
      gone_past += next == -2;
    }
  }
  // Every branch of the definition was taken.
  EXPECT_GT(found_again, 100);
  EXPECT_GT(used_up, 10);
  EXPECT_GT(gone_past, 10);
}

// An exact prediction is followed to its end, though its tokens recur in the prompt (where the
// n-gram search's most recent occurrence lies): every drafted token is kept.
TEST(Speculative, AnExactPredictionIsFollowedThroughRepeatsOfThePrompt) {
  std::mt19937_64 rng(63);
  std::vector<Request> reqs;
  for (int i = 0; i < 4; ++i) reqs.push_back(greedy(echo_prompt(rng, 10 + size_t(i)), 48));
  const auto plain = run_with(reqs, std::nullopt);
  for (size_t i = 0; i < reqs.size(); ++i) reqs[i].prediction = plain[i];
  EngineStats stats;
  EngineOptions o = options(4);
  o.step_tokens = 4 * 7; // every decoder may verify 1 + 6 in each step
  const auto spec = run_with(reqs, ngram(6), &stats, o);
  for (size_t i = 0; i < reqs.size(); ++i) ASSERT_EQ(spec[i], plain[i]) << "request " << i;
  EXPECT_EQ(stats.ngram.accepted, stats.ngram.drafted);
  // Each answer's first token is drawn from the prompt's logits, the rest 7 per step: of the 47,
  // 6 of each 7 are drafted (the last step's draft is clipped to the tokens left).
  EXPECT_GE(stats.ngram.accepted, int64_t(reqs.size()) * (47 / 7 * 6 + 47 % 7 - 1));
}

TEST(SpeculativeAdaptive, AcceptanceStartsAtItsPriorAndFollowsTheText) {
  Acceptance a(0.2, 0.5);
  EXPECT_DOUBLE_EQ(a.rate(), 0.2);
  a.observe(4, 4); // (4 + 0.4) / (4 + 2)
  EXPECT_DOUBLE_EQ(a.rate(), 4.4 / 6);
  a.observe(1, 0); // (2 + 0.4) / (2 + 1 + 2)
  EXPECT_DOUBLE_EQ(a.rate(), 2.4 / 5);
  a.observe(0, 0); // nothing tested: unchanged
  EXPECT_DOUBLE_EQ(a.rate(), 2.4 / 5);
}

} // namespace
} // namespace offgraph::engine
