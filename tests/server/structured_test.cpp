// Structured output over HTTP, judged by python3-jsonschema: generated strict schemas, each asked
// for as response_format and as a strict tool's parameters, from a generated Muse Glimmer model
// (its real chat template) at temperature 0 and 1. Every answer must parse and validate; none may
// be cut short (the schemas bound every string, number and list, so a conforming answer ends).
#include "live_server.h"

#include <cstdio>
#include <fstream>
#include <random>

namespace offgraph::server::testing {
namespace {

struct Shared {
  std::string path = make_model(16, 9, "structured");
  std::unique_ptr<model::Model> model = std::move(model::Model::load(path)).value();
  ~Shared() { fs::remove(path); }
};
Shared &shared() {
  static Shared s;
  return s;
}

// A strict-mode schema whose every value is bounded.
json random_schema(std::mt19937 &rng, int depth) {
  const int kinds = depth >= 2 ? 8 : 11;
  switch (rng() % unsigned(kinds)) {
  case 0:
    return {{"type", "string"}, {"enum", {"red", "green", "blue \"quoted\""}}};
  case 1:
    return {{"type", "string"}, {"maxLength", 1 + rng() % 6}};
  case 2:
    return {{"type", "string"}, {"pattern", "^[a-z]{1,4}-[0-9]{2}$"}};
  case 3:
    return {{"type", "string"}, {"format", rng() % 2 ? "date" : "uuid"}};
  case 4: {
    const int lo = int(rng() % 50) - 25;
    return {{"type", "integer"}, {"minimum", lo}, {"maximum", lo + int(rng() % 300)}};
  }
  case 5:
    return {{"type", "boolean"}};
  case 6:
    return {{"type", {"string", "null"}}, {"maxLength", 3}};
  case 7:
    return {{"enum", {1, "two", nullptr, true}}};
  case 8: {
    return {{"type", "array"},
            {"items", random_schema(rng, depth + 1)},
            {"minItems", rng() % 2},
            {"maxItems", 1 + rng() % 3}};
  }
  case 9: {
    return {{"anyOf", {random_schema(rng, depth + 1), random_schema(rng, depth + 1)}}};
  }
  default: {
    json props = json::object(), required = json::array();
    const int n = 1 + int(rng() % 3);
    for (int i = 0; i < n; ++i) {
      const std::string name = std::string("p") + char('a' + i);
      props[name] = random_schema(rng, depth + 1);
      required.push_back(name);
    }
    return {{"type", "object"},
            {"properties", props},
            {"required", required},
            {"additionalProperties", false}};
  }
  }
}

json object_schema(std::mt19937 &rng) {
  json s;
  do s = random_schema(rng, 0);
  while (s.value("type", json()) != "object");
  return s;
}

// The recursive case: a tree through $defs.
json tree_schema() {
  return json::parse(R"({
    "type": "object",
    "properties": {"root": {"$ref": "#/$defs/node"}},
    "required": ["root"], "additionalProperties": false,
    "$defs": {"node": {
      "type": "object",
      "properties": {"v": {"type": "integer", "minimum": 0, "maximum": 9},
                     "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 1}},
      "required": ["v", "kids"], "additionalProperties": false}}})");
}

// One batch through python3-jsonschema: per case, "" or what is wrong.
std::vector<std::string> judge(const std::vector<std::pair<json, std::string>> &cases) {
  json in = json::array();
  for (const auto &[schema, text] : cases) in.push_back({{"schema", schema}, {"text", text}});
  const std::string file =
      (fs::temp_directory_path() / ("offgraph-judge-" + std::to_string(::getpid()) + ".json"))
          .string();
  std::ofstream(file) << in.dump();
  const std::string cmd = "/usr/bin/python3 " + std::string(OFFGRAPH_SOURCE_DIR) +
                          "/tests/server/validate_json.py " + file;
  std::string out;
  if (FILE *p = ::popen(cmd.c_str(), "r")) {
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    EXPECT_EQ(::pclose(p), 0) << "python3-jsonschema missing? " << cmd;
  }
  fs::remove(file);
  json verdicts = json::parse(out, nullptr, false);
  EXPECT_TRUE(verdicts.is_array() && verdicts.size() == cases.size()) << out;
  std::vector<std::string> v;
  if (verdicts.is_array())
    for (const auto &x : verdicts) v.push_back(x.get<std::string>());
  v.resize(cases.size(), "no verdict");
  return v;
}

json chat_request(double temperature, int seed) {
  json r = chat(400, "Answer in JSON, please.");
  r["temperature"] = temperature, r["seed"] = seed;
  // A random model would reason forever; under a grammar, "none" is enforced.
  r["reasoning_effort"] = "none";
  return r;
}

TEST(Structured, EveryAnswerValidatesAsResponseFormatAndAsStrictToolArguments) {
  Running run(*shared().model, small_engine(1024), opts("structured"));
  std::mt19937 rng(2026);
  std::vector<json> schemas{tree_schema()};
  for (int i = 0; i < 11; ++i) schemas.push_back(object_schema(rng));
  std::vector<std::pair<json, std::string>> cases;
  std::vector<std::string> where;
  int stops = 0;
  for (size_t i = 0; i < schemas.size(); ++i) {
    for (double temperature : {0.0, 1.0}) {
      json r = chat_request(temperature, int(i));
      r["response_format"] = {
          {"type", "json_schema"},
          {"json_schema", {{"name", "answer"}, {"strict", true}, {"schema", schemas[i]}}}};
      auto [s, b] = run.post("/v1/chat/completions", r);
      ASSERT_EQ(s, 200) << schemas[i].dump() << "\n" << b.dump();
      const json &choice = b["choices"][0];
      EXPECT_EQ(choice["finish_reason"], "stop") << b.dump();
      stops += choice["finish_reason"] == "stop";
      cases.push_back({schemas[i], choice["message"]["content"].get<std::string>()});
      where.push_back("response_format, schema " + std::to_string(i) +
                      " at t=" + std::to_string(temperature));

      json t = chat_request(temperature, int(i));
      t["tools"] = {
          {{"type", "function"},
           {"function", {{"name", "record"}, {"strict", true}, {"parameters", schemas[i]}}}}};
      t["tool_choice"] = "required";
      t["parallel_tool_calls"] = false;
      auto [s2, b2] = run.post("/v1/chat/completions", t);
      ASSERT_EQ(s2, 200) << b2.dump();
      const json &m = b2["choices"][0]["message"];
      ASSERT_TRUE(m.contains("tool_calls")) << b2.dump();
      EXPECT_EQ(m["tool_calls"].size(), 1u) << b2.dump();
      EXPECT_EQ(b2["choices"][0]["finish_reason"], "tool_calls");
      EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "record");
      cases.push_back({schemas[i], m["tool_calls"][0]["function"]["arguments"].get<std::string>()});
      where.push_back("strict tool, schema " + std::to_string(i) +
                      " at t=" + std::to_string(temperature));
    }
  }
  const std::vector<std::string> verdicts = judge(cases);
  for (size_t i = 0; i < cases.size(); ++i)
    EXPECT_EQ(verdicts[i], "") << where[i] << "\nschema " << cases[i].first.dump() << "\ntext "
                               << cases[i].second;
  EXPECT_EQ(stops, int(schemas.size()) * 2);
}

TEST(Structured, JsonObjectGrammarAndStreamingAgree) {
  Running run(*shared().model, small_engine(1024), opts("structured-forms"));
  // json_object: any object; bounded only by max_tokens, so it may be cut (finish length).
  json r = chat_request(1.0, 3);
  r["response_format"] = {{"type", "json_object"}};
  r["max_tokens"] = 60;
  auto [s, b] = run.post("/v1/chat/completions", r);
  ASSERT_EQ(s, 200) << b.dump();
  const std::string content = b["choices"][0]["message"]["content"];
  ASSERT_FALSE(content.empty());
  EXPECT_EQ(content[0], '{');
  if (b["choices"][0]["finish_reason"] == "stop") {
    EXPECT_TRUE(json::parse(content, nullptr, false).is_object()) << content;
  }

  // GBNF: on chat it binds the answer; on completions the whole text.
  json g = chat_request(1.0, 4);
  g["grammar"] = "root ::= (\"yes\" | \"no\") \" \" [0-9]{1,2}";
  for (int seed = 0; seed < 4; ++seed) {
    g["seed"] = seed;
    auto [s2, b2] = run.post("/v1/chat/completions", g);
    ASSERT_EQ(s2, 200) << b2.dump();
    const std::string text = b2["choices"][0]["message"]["content"];
    EXPECT_TRUE(text.rfind("yes ", 0) == 0 || text.rfind("no ", 0) == 0) << text;
    EXPECT_EQ(b2["choices"][0]["finish_reason"], "stop");
  }
  json c = {{"prompt", "The answer is"},
            {"max_tokens", 20},
            {"temperature", 1.0},
            {"seed", 1},
            {"grammar", "root ::= \" \" [a-c]+ \".\""}};
  auto [s3, b3] = run.post("/v1/completions", c);
  ASSERT_EQ(s3, 200) << b3.dump();
  const std::string text = b3["choices"][0]["text"];
  ASSERT_GE(text.size(), 3u);
  EXPECT_EQ(text[0], ' ');
  EXPECT_EQ(text.find_first_not_of("abc", 1), text.size() - 1) << text;

  // Streaming gives the same answer as a whole response, n = 2 two valid ones.
  std::mt19937 rng(5);
  json st = chat_request(1.0, 8);
  st["response_format"] = {
      {"type", "json_schema"},
      {"json_schema", {{"name", "x"}, {"strict", true}, {"schema", object_schema(rng)}}}};
  auto [s4, whole] = run.post("/v1/chat/completions", st);
  ASSERT_EQ(s4, 200);
  st["stream"] = true;
  auto streamed = run.client->Post("/v1/chat/completions", st.dump(), "application/json");
  ASSERT_TRUE(streamed);
  std::string joined;
  for (const std::string &d : sse_data(streamed->body))
    if (d != "[DONE]") {
      json chunk = json::parse(d);
      if (!chunk["choices"].empty() && chunk["choices"][0]["delta"].contains("content"))
        joined += chunk["choices"][0]["delta"]["content"].get<std::string>();
    }
  EXPECT_EQ(joined, whole["choices"][0]["message"]["content"]);
  st.erase("stream");
  st["n"] = 2;
  auto [s5, two] = run.post("/v1/chat/completions", st);
  ASSERT_EQ(s5, 200);
  ASSERT_EQ(two["choices"].size(), 2u);
  const json schema = st["response_format"]["json_schema"]["schema"];
  const auto verdicts = judge({{schema, two["choices"][0]["message"]["content"]},
                               {schema, two["choices"][1]["message"]["content"]}});
  EXPECT_EQ(verdicts[0], "");
  EXPECT_EQ(verdicts[1], "");
}

// With reasoning allowed, the model may reason first: the reasoning is free text (a random model
// rarely closes it, so those answers run to max_tokens), and an answer, when there is one,
// conforms. AtemGrammar.ReasoningAllowsEveryOrdinaryToken checks the mask inside reasoning.
TEST(Structured, ReasoningStaysFreeAndTheAnswerConforms) {
  Running run(*shared().model, small_engine(1024), opts("structured-reasoning"));
  const json schema = {{"type", "object"},
                       {"properties", {{"ok", {{"type", "boolean"}}}}},
                       {"required", {"ok"}},
                       {"additionalProperties", false}};
  int reasoned = 0, answered = 0;
  std::vector<std::pair<json, std::string>> answers;
  for (int seed = 0; seed < 8; ++seed) {
    json r = chat(40, "Think, then answer.");
    r["temperature"] = 1.0, r["seed"] = seed;
    r["response_format"] = {{"type", "json_schema"},
                            {"json_schema", {{"name", "x"}, {"strict", true}, {"schema", schema}}}};
    auto [s, b] = run.post("/v1/chat/completions", r);
    ASSERT_EQ(s, 200) << b.dump();
    const json &m = b["choices"][0]["message"];
    if (m.contains("reasoning_content") && m["reasoning_content"].is_string() &&
        !m["reasoning_content"].get<std::string>().empty())
      ++reasoned;
    if (b["choices"][0]["finish_reason"] == "stop") {
      ++answered;
      answers.push_back({schema, m["content"].get<std::string>()});
    }
  }
  EXPECT_GT(reasoned, 0);
  for (const std::string &v : judge(answers)) EXPECT_EQ(v, "");
  std::printf("%d of 8 reasoned, %d answered within 40 tokens\n", reasoned, answered);
}

} // namespace
} // namespace offgraph::server::testing
