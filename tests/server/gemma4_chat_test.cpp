// A generated Gemma 4 model (31B-shaped, the real Gemma 4 vocabulary and the pinned tree's
// template embedded) behind the server: reasoning_effort (and Anthropic's thinking) reaches the
// template as enable_thinking, and constrained turns come back parsed — a forced strict call as
// tool_calls whose arguments validate, a structured answer as content — from a random model that
// only the grammar keeps in line.
#include "live_server.h"

namespace offgraph::server::testing {
namespace {

struct Shared {
  std::string path = [] {
    const std::string p = (fs::temp_directory_path() /
                           ("offgraph-gemma4-chat-" + std::to_string(::getpid()) + ".gguf"))
                              .string();
    synth::SynthSpec s = synth::preset("31b", "gemma4").value();
    s.vocab_path = std::string(OFFGRAPH_LLAMA_TREE) + "/models/ggml-vocab-gemma-4.gguf";
    s.template_path =
        std::string(OFFGRAPH_LLAMA_TREE) + "/models/templates/google-gemma-4-31B-it.jinja";
    s.own_head = false; // the tied head: one 262K-row table, not two
    s.seed = 35;
    EXPECT_TRUE(synth::write_model(s, p).ok());
    return p;
  }();
  std::unique_ptr<model::Model> model = std::move(model::Model::load(path)).value();
  Running run{*model, small_engine(1024, 32), opts("gemma4")};
  ~Shared() { fs::remove(path); }
};
Shared &shared() {
  static Shared s;
  return s;
}

json weather_tool() {
  return json::parse(R"({"type": "function", "function": {"name": "get_weather", "strict": true,
    "parameters": {"type": "object", "properties": {
      "city": {"type": "string", "maxLength": 12},
      "days": {"type": "integer", "minimum": 1, "maximum": 7},
      "units": {"enum": ["c", "f"]}},
    "required": ["city", "days", "units"], "additionalProperties": false}}})");
}

TEST(Gemma4Chat, ReasoningEffortIsTheTemplatesThinkingSwitch) {
  Running &run = shared().run;
  json body = chat(8, "Weather in Bern?");
  body["reasoning_effort"] = "none";
  auto [s1, off] = run.post("/apply-template", body);
  ASSERT_EQ(s1, 200) << off.dump();
  const std::string p_off = off["prompt"];
  const std::string closed = "<|turn>model\n<|channel>thought\n<channel|>";
  EXPECT_EQ(p_off.substr(p_off.size() - closed.size()), closed);
  EXPECT_EQ(p_off.find("<|think|>"), std::string::npos);
  body["reasoning_effort"] = "high";
  auto [s2, on] = run.post("/apply-template", body);
  ASSERT_EQ(s2, 200) << on.dump();
  const std::string p_on = on["prompt"];
  EXPECT_NE(p_on.find("<|turn>system\n<|think|>\n"), std::string::npos) << p_on;
  EXPECT_EQ(p_on.substr(p_on.size() - 13), "<|turn>model\n");
}

// Anthropic's thinking switch reaches the same template variable: a disabled request's prompt is
// the one /apply-template renders with reasoning off, an enabled one's the one with it on (sizes
// from count_tokens, against the two rendered prompts' token counts, whose difference a BOS
// convention cannot change).
TEST(Gemma4Chat, AnthropicThinkingIsTheTemplatesThinkingSwitch) {
  Running &run = shared().run;
  auto rendered_tokens = [&](const char *effort) {
    json body = chat(8, "Weather in Bern?");
    body["reasoning_effort"] = effort;
    auto [s, t] = run.post("/apply-template", body);
    EXPECT_EQ(s, 200) << t.dump();
    auto [s2, ids] = run.post("/tokenize", {{"content", t["prompt"]}});
    EXPECT_EQ(s2, 200) << ids.dump();
    return int64_t(ids["tokens"].size());
  };
  auto message_tokens = [&](const json &thinking) {
    json body = {{"model", "gemma4"},
                 {"messages", {{{"role", "user"}, {"content", "Weather in Bern?"}}}},
                 {"thinking", thinking}};
    auto [s, r] = run.post("/v1/messages/count_tokens", body);
    EXPECT_EQ(s, 200) << r.dump();
    return r["input_tokens"].get<int64_t>();
  };
  const int64_t off = message_tokens({{"type", "disabled"}});
  const int64_t on = message_tokens({{"type", "enabled"}, {"budget_tokens", 2048}});
  EXPECT_NE(off, on);
  EXPECT_EQ(on - off, rendered_tokens("low") - rendered_tokens("none"));
}

TEST(Gemma4Chat, AForcedStrictCallComesBackAsValidToolCalls) {
  Running &run = shared().run;
  int answered = 0;
  for (const char *effort : {"none", "high"}) {
    json body = chat(120, "Weather in Bern for three days?");
    body["tools"] = json::array({weather_tool()});
    body["tool_choice"] = "required";
    body["parallel_tool_calls"] = false; // else a random model may call on until max_tokens
    body["reasoning_effort"] = effort;
    body["temperature"] = 1.0;
    body["seed"] = 7;
    auto [status, r] = run.post("/v1/chat/completions", body);
    ASSERT_EQ(status, 200) << r.dump();
    const json &choice = r["choices"][0];
    if (choice["finish_reason"] == "length" && std::string(effort) == "high")
      continue; // a long thought; nothing to check
    EXPECT_EQ(choice["finish_reason"], "tool_calls") << r.dump();
    const json &calls = choice["message"]["tool_calls"];
    ASSERT_GE(calls.size(), 1u) << r.dump();
    ++answered;
    for (const json &c : calls) {
      EXPECT_EQ(c["function"]["name"], "get_weather");
      const json args = json::parse(c["function"]["arguments"].get<std::string>());
      ASSERT_TRUE(args["city"].is_string()) << args.dump();
      EXPECT_LE(args["city"].get<std::string>().size(), 12u * 4);
      ASSERT_TRUE(args["days"].is_number_integer()) << args.dump();
      EXPECT_GE(args["days"].get<int>(), 1);
      EXPECT_LE(args["days"].get<int>(), 7);
      EXPECT_TRUE(args["units"] == "c" || args["units"] == "f") << args.dump();
      EXPECT_EQ(args.size(), 3u);
    }
    if (std::string(effort) == "none") {
      EXPECT_FALSE(choice["message"].contains("reasoning_content"));
    }
  }
  EXPECT_GE(answered, 1);
}

TEST(Gemma4Chat, AStructuredAnswerIsJsonOfItsSchema) {
  Running &run = shared().run;
  json body = chat(80, "Give me a number.");
  body["reasoning_effort"] = "none";
  body["temperature"] = 1.0;
  body["seed"] = 3;
  body["response_format"] = {
      {"type", "json_schema"},
      {"json_schema",
       {{"name", "n"},
        {"strict", true},
        {"schema",
         {{"type", "object"},
          {"properties", {{"n", {{"type", "integer"}, {"minimum", 0}, {"maximum", 9}}}}},
          {"required", {"n"}},
          {"additionalProperties", false}}}}}};
  auto [status, r] = run.post("/v1/chat/completions", body);
  ASSERT_EQ(status, 200) << r.dump();
  const json &choice = r["choices"][0];
  ASSERT_EQ(choice["finish_reason"], "stop") << r.dump();
  const json answer = json::parse(choice["message"]["content"].get<std::string>(), nullptr, false);
  ASSERT_TRUE(answer.is_object()) << r.dump();
  ASSERT_TRUE(answer["n"].is_number_integer()) << r.dump();
  EXPECT_GE(answer["n"].get<int>(), 0);
  EXPECT_LE(answer["n"].get<int>(), 9);
}

} // namespace
} // namespace offgraph::server::testing
