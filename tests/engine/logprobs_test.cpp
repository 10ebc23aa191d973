// Log-probabilities from the engine against a direct forward pass over the same tokens (one
// chunk, every row's logits) and a long-double log-softmax: the scored prompt's and the generated
// tokens'. Tolerance 1e-4: the engine computes in chunks of max_write, the reference in one, so
// float sums differ in order.
#include "engine_util.h"

#include "ggml-cpu.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace offgraph::engine {
namespace {

using testing::fixture;
using testing::greedy;
using testing::options;
using testing::random_tokens;

// Row i: the logits after tokens[0..i].
std::vector<std::vector<float>> reference_logits(const std::vector<int32_t> &tokens) {
  const model::Model &m = *fixture().model;
  const int32_t n = int32_t(tokens.size());
  auto layout = model::make_layout(m, {n, n});
  EXPECT_TRUE(layout.ok()) << layout.message();
  auto store =
      kv::KvStore::create(*layout, {GGML_TYPE_F32, GGML_TYPE_F32}, ggml_backend_cpu_buffer_type());
  EXPECT_TRUE(store.ok()) << store.message();
  const kv::SeqId seq = *(*store)->create_sequence();
  model::Forward forward(m, **store, 2);
  model::Batch b;
  b.tokens = tokens;
  b.spans.push_back({seq, 0, n});
  for (int32_t i = 0; i < n; ++i) b.logit_rows.push_back(i);
  auto logits = forward.run(b);
  EXPECT_TRUE(logits.ok()) << logits.message();
  const size_t v = size_t(m.config().n_vocab);
  std::vector<std::vector<float>> rows;
  for (int32_t i = 0; i < n; ++i)
    rows.emplace_back(logits->begin() + long(size_t(i) * v),
                      logits->begin() + long(size_t(i + 1) * v));
  return rows;
}

double log_softmax(const std::vector<float> &row, int32_t token) {
  long double z = 0;
  for (float l : row) z += std::exp((long double)l);
  return double((long double)row[size_t(token)] - std::log(z));
}

struct Scored {
  std::vector<sample::TokenLogprobs> prompt, generated;
  std::vector<int32_t> tokens;
  int prompt_events = 0;
  FinishReason finish = FinishReason::None;
};

std::vector<Scored> score(Engine &e, const Request &r) {
  std::vector<Scored> out(size_t(r.n));
  auto id = e.submit(r, [&](const Event &ev) {
    Scored &s = out[size_t(ev.choice)];
    if (ev.prompt_logprobs) s.prompt = *ev.prompt_logprobs, ++s.prompt_events;
    if (ev.token >= 0) {
      s.tokens.push_back(ev.token);
      EXPECT_TRUE(ev.logprobs.has_value());
      if (ev.logprobs) s.generated.push_back(*ev.logprobs);
    }
    if (ev.finish != FinishReason::None) s.finish = ev.finish;
    EXPECT_NE(ev.finish, FinishReason::Error) << ev.error;
  });
  EXPECT_TRUE(id.ok()) << id.message();
  e.run_until_idle();
  return out;
}

void expect_matches(const sample::TokenLogprobs &got, const std::vector<float> &row, int32_t token,
                    size_t top, const std::string &where) {
  EXPECT_EQ(got.token, token) << where;
  EXPECT_NEAR(got.logprob, log_softmax(row, token), 1e-4) << where;
  ASSERT_EQ(got.top.size(), top) << where;
  for (size_t k = 0; k < top; ++k) {
    EXPECT_NEAR(got.top[k].second, log_softmax(row, got.top[k].first), 1e-4) << where;
    if (k > 0) {
      EXPECT_GE(got.top[k - 1].second, got.top[k].second) << where;
    }
  }
  // The best is the reference's best (up to ties within the tolerance).
  const int32_t best = int32_t(std::max_element(row.begin(), row.end()) - row.begin());
  if (top > 0) {
    EXPECT_NEAR(got.top[0].second, log_softmax(row, best), 1e-4) << where;
  }
}

TEST(Logprobs, AScoredPromptAndItsAnswerMatchADirectForwardPass) {
  std::mt19937_64 rng(51);
  auto e = Engine::create(*fixture().model, options(4));
  ASSERT_TRUE(e.ok()) << e.message();
  const std::vector<int32_t> prompt = random_tokens(rng, 150);
  // Cached first: a scored prompt is still computed whole (a reused position has no logits).
  testing::run(**e, {greedy(prompt, 2)});
  const int64_t before = (*e)->stats().computed_prompt_tokens;
  Request r = greedy(prompt, 6);
  r.prompt_logprobs = true, r.top_logprobs = 5, r.n = 2;
  const auto out = score(**e, r);
  EXPECT_EQ((*e)->stats().computed_prompt_tokens - before, 150);
  for (const Scored &s : out) {
    EXPECT_EQ(s.prompt_events, 1); // once per choice
    ASSERT_EQ(s.prompt.size(), prompt.size() - 1);
    ASSERT_EQ(s.generated.size(), 6u);
  }
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), out[0].tokens.begin(), out[0].tokens.end());
  const auto rows = reference_logits(all);
  for (size_t i = 0; i + 1 < prompt.size(); ++i)
    expect_matches(out[0].prompt[i], rows[i], prompt[i + 1], 5, "prompt " + std::to_string(i));
  for (size_t i = 0; i < 6; ++i) {
    expect_matches(out[0].generated[i], rows[prompt.size() - 1 + i], out[0].tokens[i], 5,
                   "answer " + std::to_string(i));
    EXPECT_EQ(out[0].generated[i].top[0].first, out[0].tokens[i]) << "greedy takes the best";
  }
  EXPECT_EQ(out[1].tokens, out[0].tokens); // greedy choices agree
}

TEST(Logprobs, MaxTokensZeroScoresThePromptOnly) {
  std::mt19937_64 rng(52);
  auto e = Engine::create(*fixture().model, options(2));
  ASSERT_TRUE(e.ok()) << e.message();
  Request r = greedy(random_tokens(rng, 40), 0);
  r.prompt_logprobs = true, r.n = 2;
  const auto out = score(**e, r);
  // Both choices end at once with the scores, once each.
  EXPECT_EQ(out[1].prompt_events, 1);
  EXPECT_EQ(out[1].finish, FinishReason::Length);
  EXPECT_EQ(out[1].prompt.size(), 39u);
  EXPECT_EQ(out[0].prompt_events, 1);
  EXPECT_TRUE(out[0].tokens.empty());
  EXPECT_EQ(out[0].finish, FinishReason::Length);
  ASSERT_EQ(out[0].prompt.size(), 39u);
  const auto rows = reference_logits(r.prompt);
  for (size_t i = 0; i < 39; ++i)
    expect_matches(out[0].prompt[i], rows[i], r.prompt[i + 1], 0, "prompt " + std::to_string(i));
}

// Scored prompts arriving together share 64 rows of logits a step (not 64 each: three prompts of
// 60 would take 180 rows, 180 x n_vocab floats, in one step), and each one's scores are still
// the direct pass's.
TEST(Logprobs, ScoredPromptsTogetherTakeAtMost64RowsOfLogitsAStep) {
  std::mt19937_64 rng(53);
  EngineOptions o = options(0);
  o.max_write = 64, o.step_tokens = 256;
  auto e = Engine::create(*fixture().model, o);
  ASSERT_TRUE(e.ok()) << e.message();
  std::vector<Request> requests;
  std::vector<std::vector<sample::TokenLogprobs>> got(3);
  for (size_t i = 0; i < 3; ++i) {
    requests.push_back(greedy(random_tokens(rng, 60), 0));
    requests[i].prompt_logprobs = true;
    ASSERT_TRUE((*e)->submit(requests[i],
                             [&got, i](const Event &ev) {
                               if (ev.prompt_logprobs) got[i] = *ev.prompt_logprobs;
                               EXPECT_NE(ev.finish, FinishReason::Error) << ev.error;
                             })
                    .ok());
  }
  (*e)->run_until_idle();
  EXPECT_LE((*e)->stats().peak_step_logit_rows, 64);
  EXPECT_GE((*e)->stats().peak_step_logit_rows, 60);
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_EQ(got[i].size(), 59u) << "request " << i;
    const auto rows = reference_logits(requests[i].prompt);
    for (size_t j = 0; j < 59; ++j)
      expect_matches(got[i][j], rows[j], requests[i].prompt[j + 1], 0,
                     "request " + std::to_string(i) + " prompt " + std::to_string(j));
  }
}

TEST(Logprobs, TheyAreTheModelsWhateverTheSampling) {
  // Sampled with a temperature, penalties and a bias: the reported log-probabilities are still
  // the model's own (before every sampling step).
  std::mt19937_64 rng(53);
  auto e = Engine::create(*fixture().model, options(0));
  ASSERT_TRUE(e.ok()) << e.message();
  Request r = greedy(random_tokens(rng, 30), 5);
  r.sampling.temperature = 1.5f, r.sampling.top_k = 3, r.sampling.repetition_penalty = 1.3f;
  r.sampling.logit_bias[7] = 5.0f, r.sampling.seed = 4;
  r.top_logprobs = 2;
  const auto out = score(**e, r);
  ASSERT_EQ(out[0].generated.size(), 5u);
  std::vector<int32_t> all = r.prompt;
  all.insert(all.end(), out[0].tokens.begin(), out[0].tokens.end());
  const auto rows = reference_logits(all);
  for (size_t i = 0; i < 5; ++i)
    expect_matches(out[0].generated[i], rows[r.prompt.size() - 1 + i], out[0].tokens[i], 2,
                   "answer " + std::to_string(i));
}

TEST(Logprobs, OutOfRangeIsRefused) {
  auto e = Engine::create(*fixture().model, options(0));
  ASSERT_TRUE(e.ok()) << e.message();
  for (int32_t k : {-2, 21}) {
    Request r = greedy({1, 2, 3}, 2);
    r.top_logprobs = k;
    auto id = (*e)->submit(r, [](const Event &) {});
    ASSERT_FALSE(id.ok());
    EXPECT_NE(id.message().find("top_logprobs"), std::string::npos) << id.message();
  }
}

} // namespace
} // namespace offgraph::engine
