// Speculative decoding through the API: OpenAI's `prediction` and the speculative.* fields change
// how fast an answer comes, never what it is; usage and /metrics count the drafts; bad values are
// refused by name.
#include "live_server.h"

#include <chrono>
#include <thread>

namespace offgraph::server::testing {
namespace {

struct Shared {
  std::string path = make_model(16, 7, "speculative");
  std::unique_ptr<model::Model> model = std::move(model::Model::load(path)).value();
  ~Shared() { fs::remove(path); }
};
Shared &shared() {
  static Shared s;
  return s;
}

// /metrics is published after the step that sent a request's last event: waits (bounded) until it
// counts `tokens` generated in all.
bool published(Running &run, double tokens) {
  for (int i = 0; i < 400; ++i) {
    if (run.metric("offgraph_generated_tokens_total") == tokens) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  return false;
}

json completion(const std::string &prompt, int max_tokens) {
  return {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}};
}

// The engine's options for these tests: drafts of fixed length (the adaptive one follows measured
// step times, which would make the counts below depend on the machine's load).
engine::EngineOptions fixed_length() {
  engine::EngineOptions eo = small_engine();
  eo.speculation.adaptive = false;
  return eo;
}

TEST(ServerSpeculative, APredictionSpeedsTheSameAnswer) {
  Running run(*shared().model, fixed_length(), opts("prediction"));
  const json plain_req = completion("Once upon a time there was a", 48);
  auto [s0, plain] = run.post("/v1/completions", plain_req);
  ASSERT_EQ(s0, 200) << plain.dump();
  const std::string answer = plain["choices"][0]["text"];
  EXPECT_FALSE(plain["usage"].contains("completion_tokens_details"));
  const std::string drafter = "offgraph_spec_accepted_tokens_total{drafter=\"ngram\"}";
  const double accepted_before = run.metric(drafter);
  json req = plain_req;
  req["prediction"] = {{"type", "content"}, {"content", answer}};
  auto [s1, spec] = run.post("/v1/completions", req);
  ASSERT_EQ(s1, 200) << spec.dump();
  EXPECT_EQ(spec["choices"][0]["text"], answer);
  const json &details = spec["usage"]["completion_tokens_details"];
  // The prediction is text, tokenized again: where the answer's tokens spell it differently, its
  // drafts miss (these random weights write odd token sequences).
  EXPECT_GT(details["accepted_prediction_tokens"].get<int>(), 5) << details.dump();
  ASSERT_TRUE(published(run, plain["usage"]["completion_tokens"].get<double>() +
                                 spec["usage"]["completion_tokens"].get<double>()));
  EXPECT_EQ(run.metric(drafter) - accepted_before,
            details["accepted_prediction_tokens"].get<int>());
  EXPECT_EQ(run.metric("offgraph_spec_drafted_tokens_total{drafter=\"ngram\"}"),
            details["accepted_prediction_tokens"].get<int>() +
                details["rejected_prediction_tokens"].get<int>());
  // As text parts, on the chat route, streamed: the same answer as without.
  json chat_req = chat(24, "Tell me a story");
  auto [s2, chat_plain] = run.post("/v1/chat/completions", chat_req);
  ASSERT_EQ(s2, 200) << chat_plain.dump();
  chat_req["prediction"] = {
      {"type", "content"},
      {"content", json::array({{{"type", "text"},
                                {"text", chat_plain["choices"][0]["message"]["content"]}}})}};
  auto [s3, chat_spec] = run.post("/v1/chat/completions", chat_req);
  ASSERT_EQ(s3, 200) << chat_spec.dump();
  EXPECT_EQ(chat_spec["choices"][0]["message"], chat_plain["choices"][0]["message"]);
}

// A step's tokens reach a streaming client together: one chunk per verify span, so a client pays
// per step, not per token (each kept drafted token rides in its step's chunk).
TEST(ServerSpeculative, AVerifySpanStreamsAsOneChunk) {
  Running run(*shared().model, fixed_length(), opts("chunks"));
  json req = completion("The old clock in the hall", 48);
  auto [s0, plain] = run.post("/v1/completions", req);
  ASSERT_EQ(s0, 200) << plain.dump();
  req["prediction"] = {{"type", "content"}, {"content", plain["choices"][0]["text"]}};
  req["stream"] = true, req["stream_options"] = {{"include_usage", true}};
  auto r = run.client->Post("/v1/completions", req.dump(), "application/json");
  ASSERT_TRUE(r && r->status == 200);
  std::string streamed;
  int text_chunks = 0;
  json usage;
  for (const std::string &d : sse_data(r->body)) {
    if (d == "[DONE]") continue;
    const json c = json::parse(d);
    if (c.contains("usage") && c["usage"].is_object()) usage = c["usage"];
    for (const json &ch : c["choices"])
      if (!ch.value("text", "").empty()) ++text_chunks, streamed += ch["text"].get<std::string>();
  }
  EXPECT_EQ(streamed, plain["choices"][0]["text"]);
  ASSERT_TRUE(usage.is_object());
  const int accepted = usage["completion_tokens_details"]["accepted_prediction_tokens"];
  EXPECT_GT(accepted, 5) << usage.dump();
  // Steps = tokens - kept drafted tokens; a step whose text the detokenizer holds back sends none.
  EXPECT_LE(text_chunks, usage["completion_tokens"].get<int>() - accepted) << usage.dump();
}

// A stop string inside a verify span ends the answer where plain decoding ends it: the tokens
// drawn after it in the same step are dropped, and the usage counts the same tokens.
TEST(ServerSpeculative, StopStringsInsideASpanEndTheAnswerAsPlainDecoding) {
  Running run(*shared().model, fixed_length(), opts("stops"));
  json req = completion("A story about a lighthouse keeper", 48);
  auto [s0, whole] = run.post("/v1/completions", req);
  ASSERT_EQ(s0, 200) << whole.dump();
  const std::string text = whole["choices"][0]["text"];
  ASSERT_GT(text.size(), 12u);
  req["stop"] = text.substr(text.size() / 2, 3);
  auto [s1, plain] = run.post("/v1/completions", req);
  ASSERT_EQ(s1, 200) << plain.dump();
  req["prediction"] = {{"type", "content"}, {"content", text}};
  auto [s2, spec] = run.post("/v1/completions", req);
  ASSERT_EQ(s2, 200) << spec.dump();
  EXPECT_EQ(spec["choices"][0]["text"], plain["choices"][0]["text"]);
  EXPECT_EQ(spec["choices"][0]["finish_reason"], plain["choices"][0]["finish_reason"]);
  EXPECT_EQ(spec["usage"]["completion_tokens"], plain["usage"]["completion_tokens"]);
  // Streamed: the chunks add up to the same text.
  req["stream"] = true;
  auto r = run.client->Post("/v1/completions", req.dump(), "application/json");
  ASSERT_TRUE(r && r->status == 200);
  std::string streamed, finish;
  for (const std::string &d : sse_data(r->body)) {
    if (d == "[DONE]") continue;
    const json c = json::parse(d);
    for (const json &ch : c["choices"]) {
      streamed += ch.value("text", "");
      if (ch.contains("finish_reason") && ch["finish_reason"].is_string())
        finish = ch["finish_reason"];
    }
  }
  EXPECT_EQ(streamed, plain["choices"][0]["text"]);
  EXPECT_EQ(finish, plain["choices"][0]["finish_reason"]);
}

TEST(ServerSpeculative, RequestFieldsChooseTheDrafterAndKeepTheAnswer) {
  engine::EngineOptions eo = fixed_length();
  eo.speculation.ngram.n_min = 1; // any recurring token drafts (the source stays none)
  Running run(*shared().model, eo, opts("fields"));
  std::string prompt;
  for (int i = 0; i < 6; ++i) prompt += "the cat sat on the mat and the dog lay by the door. ";
  const json plain_req = completion(prompt, 40);
  auto [s0, plain] = run.post("/v1/completions", plain_req);
  ASSERT_EQ(s0, 200) << plain.dump();
  const std::string drafted = "offgraph_spec_drafted_tokens_total{drafter=\"ngram\"}";
  EXPECT_EQ(run.metric(drafted), 0); // the server's default is none
  // These random weights' answers never repeat the context: the answer itself is the prediction
  // drafts come from, and n_max bounds them.
  json req = plain_req;
  req["speculative.type"] = "ngram", req["speculative.n_max"] = 2, req["speculative.n_min"] = 1;
  req["speculative.adaptive"] = false;
  req["prediction"] = {{"type", "content"}, {"content", plain["choices"][0]["text"]}};
  auto [s1, spec] = run.post("/v1/completions", req);
  ASSERT_EQ(s1, 200) << spec.dump();
  EXPECT_EQ(spec["choices"][0]["text"], plain["choices"][0]["text"]);
  ASSERT_TRUE(published(run, plain["usage"]["completion_tokens"].get<double>() +
                                 spec["usage"]["completion_tokens"].get<double>()));
  const double verifications = run.metric("offgraph_spec_verifications_total{drafter=\"ngram\"}");
  EXPECT_GT(run.metric(drafted), 0) << spec.dump();
  EXPECT_GT(verifications, 0);
  EXPECT_LE(run.metric(drafted), 2 * verifications); // speculative.n_max held
}

// A draft model (here the model itself, so every greedy draft is kept): the same answer, counted
// under drafter="draft".
TEST(ServerSpeculative, ADraftModelDraftsTheSameAnswer) {
  engine::EngineOptions eo = fixed_length();
  eo.draft_model = shared().model.get();
  Running run(*shared().model, eo, opts("draft"));
  const json plain_req = completion("Once upon a time there was a", 40);
  auto [s0, plain] = run.post("/v1/completions", plain_req);
  ASSERT_EQ(s0, 200) << plain.dump();
  json req = plain_req;
  req["speculative.type"] = "draft", req["speculative.n_max"] = 6;
  auto [s1, spec] = run.post("/v1/completions", req);
  ASSERT_EQ(s1, 200) << spec.dump();
  EXPECT_EQ(spec["choices"][0]["text"], plain["choices"][0]["text"]);
  ASSERT_TRUE(published(run, plain["usage"]["completion_tokens"].get<double>() +
                                 spec["usage"]["completion_tokens"].get<double>()));
  const double drafted = run.metric("offgraph_spec_drafted_tokens_total{drafter=\"draft\"}");
  EXPECT_GT(drafted, 10);
  EXPECT_EQ(run.metric("offgraph_spec_accepted_tokens_total{drafter=\"draft\"}"), drafted);
  // Without a draft model loaded, asking for one is refused by name.
  Running bare(*shared().model, fixed_length(), opts("bare"));
  auto [s2, refused] = bare.post("/v1/completions", req);
  EXPECT_EQ(s2, 400);
  EXPECT_EQ(refused["error"]["param"], "speculative.type") << refused.dump();
}

TEST(ServerSpeculative, BadValuesAreRefusedByName) {
  Running run(*shared().model, small_engine(), opts("bad"));
  const json base = completion("Hello", 4);
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"speculative.type", "eagle"}}, "speculative.type"},
      {{{"speculative.type", 3}}, "speculative.type"},
      {{{"speculative.n_max", 0}}, "speculative.n_max"},
      {{{"speculative.n_max", 65}}, "speculative.n_max"},
      {{{"speculative.type", "ngram"}, {"speculative.n_max", 2}, {"speculative.n_min", 3}},
       "speculative.n_min"},
      {{{"speculative.type", "ngram"}, {"speculative.adaptive", "yes"}}, "speculative.adaptive"},
      {{{"speculative.n_max", 4}}, "speculative.n_max"}, // no drafts: the server's type is none
      {{{"speculative.type", "none"}, {"prediction", {{"type", "content"}, {"content", "x"}}}},
       "speculative.type"},
      {{{"speculative.p_min", 0.5}}, "speculative.p_min"},
      {{{"speculative.pq", true}}, "speculative.pq"},                                // no drafts
      {{{"speculative.type", "ngram"}, {"speculative.pq", true}}, "speculative.pq"}, // no q
      {{{"speculative.type", "draft"}}, "speculative.type"},                         // none loaded
      {{{"prediction", "text"}}, "prediction"},
      {{{"prediction", {{"type", "content"}, {"content", 5}}}}, "prediction"},
      {{{"prediction", {{"type", "content"}, {"content", json::array({{{"type", "image"}}})}}}},
       "prediction"},
      {{{"prediction", {{"type", "content"}, {"content", "x"}, {"weight", 2}}}}, "prediction"},
  };
  for (const auto &[extra, param] : cases) {
    json req = base;
    req.update(extra);
    auto [s, b] = run.post("/v1/completions", req);
    EXPECT_EQ(s, 400) << extra.dump();
    EXPECT_EQ(b["error"]["param"], param) << b.dump();
  }
}

} // namespace
} // namespace offgraph::server::testing
