// Log-probabilities over HTTP: a scored prompt (/v1/completions with token ids, echo, logprobs,
// max_tokens 0, as evaluation harnesses send it) against a direct forward pass over the same
// tokens; chat logprobs streamed equal to whole; OpenAI's shapes.
#include "live_server.h"

#include "ggml-cpu.h"
#include "model/forward.h"
#include "text/tokenizer/unicode.h"

#include <cmath>
#include <random>

namespace offgraph::server::testing {
namespace {

// Two log-probability shapes equal in every field but the numbers, which agree within 1e-5 (the
// second request of a pair reuses the first's cached prompt: a different chunking of the same
// computation, so float sums differ in their last bits).
void expect_close(const json &a, const json &b, const std::string &where = "") {
  if (a.is_number() && b.is_number()) {
    EXPECT_NEAR(a.get<double>(), b.get<double>(), 1e-5) << where;
    return;
  }
  ASSERT_EQ(a.type(), b.type()) << where << ": " << a.dump() << " vs " << b.dump();
  if (a.is_array()) {
    ASSERT_EQ(a.size(), b.size()) << where;
    for (size_t i = 0; i < a.size(); ++i) expect_close(a[i], b[i], where + "/" + std::to_string(i));
  } else if (a.is_object()) {
    ASSERT_EQ(a.size(), b.size()) << where;
    for (auto it = a.begin(); it != a.end(); ++it) {
      ASSERT_TRUE(b.contains(it.key())) << where << ": " << it.key();
      expect_close(it.value(), b[it.key()], where + "/" + it.key());
    }
  } else {
    EXPECT_EQ(a, b) << where;
  }
}

struct Shared {
  std::string path = make_model(16, 7, "logprobs");
  std::unique_ptr<model::Model> model = std::move(model::Model::load(path)).value();
  ~Shared() { fs::remove(path); }
};
Shared &shared() {
  static Shared s;
  return s;
}

// log-softmax of the logits after tokens[0..i], for each i, in long double: one forward pass,
// every row.
std::vector<std::vector<double>> reference_logprobs(const std::vector<int32_t> &tokens) {
  const model::Model &m = *shared().model;
  const int32_t n = int32_t(tokens.size());
  auto layout = model::make_layout(m, {n, n});
  auto store =
      kv::KvStore::create(*layout, {GGML_TYPE_F32, GGML_TYPE_F32}, ggml_backend_cpu_buffer_type());
  const kv::SeqId seq = *(*store)->create_sequence();
  model::Forward forward(m, **store, 2);
  model::Batch b;
  b.tokens = tokens;
  b.spans.push_back({seq, 0, n});
  for (int32_t i = 0; i < n; ++i) b.logit_rows.push_back(i);
  auto logits = forward.run(b);
  EXPECT_TRUE(logits.ok()) << logits.message();
  const size_t v = size_t(m.config().n_vocab);
  std::vector<std::vector<double>> out;
  for (int32_t i = 0; i < n; ++i) {
    const float *row = logits->data() + size_t(i) * v;
    long double z = 0;
    for (size_t j = 0; j < v; ++j) z += std::exp((long double)row[j]);
    std::vector<double> lp(v);
    for (size_t j = 0; j < v; ++j) lp[j] = double((long double)row[j] - std::log(z));
    out.push_back(std::move(lp));
  }
  return out;
}

TEST(ServerLogprobs, AnEchoedPromptIsScoredLikeADirectForwardPass) {
  Running run(*shared().model, small_engine(), opts("score"));
  std::mt19937 rng(61);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 90; ++i) prompt.push_back(int32_t(1000 + rng() % 20000));
  // Twice: the second time the prompt is cached, and is still computed whole for its scores.
  json first;
  for (int pass = 0; pass < 2; ++pass) {
    auto [s, b] = run.post("/v1/completions", {{"prompt", json::array({prompt})},
                                               {"echo", true},
                                               {"logprobs", 2},
                                               {"max_tokens", 0},
                                               {"temperature", 0}});
    ASSERT_EQ(s, 200) << b.dump();
    if (pass == 0) first = b;
    EXPECT_EQ(b["choices"][0]["logprobs"], first["choices"][0]["logprobs"]) << "pass " << pass;
  }
  const json &lp = first["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), prompt.size());
  ASSERT_EQ(lp["token_logprobs"].size(), prompt.size());
  EXPECT_TRUE(lp["token_logprobs"][0].is_null()); // nothing predicts the first token
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  EXPECT_EQ(first["usage"]["completion_tokens"], 0);
  EXPECT_EQ(first["choices"][0]["finish_reason"], "length");
  const auto ref = reference_logprobs(prompt);
  double worst = 0;
  for (size_t i = 1; i < prompt.size(); ++i) {
    const double got = lp["token_logprobs"][i].get<double>();
    worst = std::max(worst, std::abs(got - ref[i - 1][size_t(prompt[i])]));
    // The two likeliest, each as the reference has it, summing to at most 1.
    const json &top = lp["top_logprobs"][i];
    ASSERT_TRUE(top.is_object() && !top.empty() && top.size() <= 2) << top.dump();
    double mass = 0;
    for (auto it = top.begin(); it != top.end(); ++it) mass += std::exp(it.value().get<double>());
    EXPECT_LE(mass, 1 + 1e-6);
    const double best = *std::max_element(ref[i - 1].begin(), ref[i - 1].end());
    double got_best = -1e9;
    for (auto it = top.begin(); it != top.end(); ++it)
      got_best = std::max(got_best, it.value().get<double>());
    EXPECT_NEAR(got_best, best, 1e-5) << "position " << i;
  }
  EXPECT_LE(worst, 1e-5);
  std::printf("[ logprobs ] %zu prompt tokens scored, largest error %.2g\n", prompt.size(), worst);
  // text_offset counts code points of the echoed text, which is the prompt's.
  const std::string text = first["choices"][0]["text"];
  ASSERT_EQ(lp["text_offset"].size(), prompt.size());
  EXPECT_EQ(lp["text_offset"][0], 0);
  for (size_t i = 1; i < prompt.size(); ++i)
    EXPECT_GE(lp["text_offset"][i].get<int>(), lp["text_offset"][i - 1].get<int>());
}

TEST(ServerLogprobs, ChatLogprobsStreamedEqualWholeAndMatchTheAnswer) {
  Running run(*shared().model, small_engine(), opts("chat-logprobs"));
  json req = chat(12, "Name three rivers");
  req["logprobs"] = true, req["top_logprobs"] = 3;
  auto [s, whole] = run.post("/v1/chat/completions", req);
  ASSERT_EQ(s, 200) << whole.dump();
  const json &content = whole["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), whole["usage"]["completion_tokens"].get<size_t>());
  EXPECT_TRUE(whole["choices"][0]["logprobs"]["refusal"].is_null());
  for (const json &t : content) {
    ASSERT_TRUE(t["token"].is_string() && t["logprob"].is_number() && t["bytes"].is_array());
    ASSERT_EQ(t["top_logprobs"].size(), 3u);
    // Greedy: the chosen token is the likeliest.
    EXPECT_EQ(t["top_logprobs"][0]["logprob"], t["logprob"]);
    double mass = 0;
    for (const json &x : t["top_logprobs"]) mass += std::exp(x["logprob"].get<double>());
    EXPECT_LE(mass, 1 + 1e-6);
    // bytes are the token's; token is their text.
    std::string bytes;
    for (const json &b : t["bytes"]) bytes += char(b.get<int>());
    if (text::is_valid_utf8(bytes)) {
      EXPECT_EQ(t["token"], bytes);
    }
  }
  req["stream"] = true;
  auto r = run.client->Post("/v1/chat/completions", req.dump(), "application/json");
  ASSERT_TRUE(r && r->status == 200);
  json streamed = json::array();
  for (const std::string &line : sse_data(r->body)) {
    if (line == "[DONE]") break;
    const json chunk = json::parse(line);
    for (const json &c : chunk["choices"])
      if (!c["logprobs"].is_null())
        for (const json &t : c["logprobs"]["content"]) streamed.push_back(t);
  }
  expect_close(streamed, content);
  // Without logprobs: null.
  auto [s2, plain] = run.post("/v1/chat/completions", chat(3));
  ASSERT_EQ(s2, 200);
  EXPECT_TRUE(plain["choices"][0]["logprobs"].is_null());
}

TEST(ServerLogprobs, CompletionsLogprobsStreamedEqualWhole) {
  Running run(*shared().model, small_engine(), opts("completion-logprobs"));
  json req = {
      {"prompt", "The rivers of Europe:"}, {"max_tokens", 10}, {"temperature", 0}, {"logprobs", 1}};
  auto [s, whole] = run.post("/v1/completions", req);
  ASSERT_EQ(s, 200) << whole.dump();
  const json &lp = whole["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), whole["usage"]["completion_tokens"].get<size_t>());
  req["stream"] = true;
  auto r = run.client->Post("/v1/completions", req.dump(), "application/json");
  ASSERT_TRUE(r && r->status == 200);
  json merged = {{"tokens", json::array()},
                 {"token_logprobs", json::array()},
                 {"top_logprobs", json::array()},
                 {"text_offset", json::array()}};
  for (const std::string &line : sse_data(r->body)) {
    if (line == "[DONE]") break;
    const json chunk = json::parse(line);
    for (const json &c : chunk["choices"])
      if (!c["logprobs"].is_null())
        for (auto it = c["logprobs"].begin(); it != c["logprobs"].end(); ++it)
          for (const json &x : it.value()) merged[it.key()].push_back(x);
  }
  expect_close(merged, lp);
}

} // namespace
} // namespace offgraph::server::testing
