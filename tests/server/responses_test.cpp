// OpenAI's Responses API on a live server: the stream's events (sequence numbers, output
// indexes, output_item.done items equal to the final output), streamed = whole, function and
// namespace tools, a function_call_output turn, previous_response_id and the store (GET, DELETE,
// eviction, off), hosted tools refused or dropped and reported, cuts as incomplete, overflow as
// response.failed, reasoning carried back through encrypted_content, text.format, custom tools.
#include "live_server.h"

#include "server/responses.h"

#include <regex>

namespace offgraph::server::testing {
namespace {

struct Shared {
  std::string path = make_model(16, 5, "responses");
  std::unique_ptr<model::Model> model = std::move(model::Model::load(path)).value();
  ~Shared() { fs::remove(path); }
};
Shared &shared() {
  static Shared s;
  return s;
}

json request(int max_tokens, const std::string &user = "Hello there") {
  return {{"model", "responses-test"},
          {"max_output_tokens", max_tokens},
          {"temperature", 0},
          {"input", user}};
}

json weather_tool(bool strict = true) {
  return {{"type", "function"},
          {"name", "get_weather"},
          {"description", "Weather of a city"},
          {"strict", strict},
          {"parameters",
           {{"type", "object"},
            {"properties", {{"city", {{"type", "string"}, {"enum", {"Oslo", "Paris"}}}}}},
            {"required", {"city"}},
            {"additionalProperties", false}}}};
}

// Checks the stream's rules and returns its events' data in order.
std::vector<json> stream_events(const std::string &body) {
  std::vector<json> out;
  for (const std::string &d : sse_data(body)) out.push_back(json::parse(d));
  int64_t seq = 0;
  for (const json &e : out) EXPECT_EQ(e["sequence_number"], seq++) << e.dump();
  return out;
}

// The final response of a stream, after checking that every output_item.done item is the
// final output's item at its index.
json final_of(const std::vector<json> &events) {
  EXPECT_FALSE(events.empty());
  if (events.empty()) return json();
  EXPECT_EQ(events.front()["type"], "response.created");
  const json &last = events.back();
  const json &response = last["response"];
  for (const json &e : events) {
    if (e["type"] != "response.output_item.done") continue;
    EXPECT_EQ(e["item"], response["output"][e["output_index"].get<size_t>()]) << e.dump();
  }
  return response;
}

std::pair<int, std::string> post_raw(Running &run, const json &body) {
  auto r = run.client->Post("/v1/responses", body.dump(), "application/json");
  if (!r) return {0, ""};
  return {r->status, r->body};
}

TEST(Responses, StreamedEqualsWholeWithNumberedEvents) {
  Running run(*shared().model, small_engine(1024), opts("responses-test"));
  for (const char *user : {"Hello there", "Write a haiku about the sea"}) {
    json req = request(40, user);
    auto [s, whole] = run.post("/v1/responses", req);
    ASSERT_EQ(s, 200) << whole.dump();
    EXPECT_EQ(whole["object"], "response");
    EXPECT_EQ(whole["model"], "responses-test");
    req["stream"] = true;
    auto [s2, body] = post_raw(run, req);
    ASSERT_EQ(s2, 200) << body;
    const auto events = stream_events(body);
    const json streamed = final_of(events);
    EXPECT_EQ(events.back()["type"], "response." + streamed["status"].get<std::string>());
    // Items equal but for their ids (each response numbers its own).
    ASSERT_EQ(streamed["output"].size(), whole["output"].size()) << body;
    for (size_t i = 0; i < whole["output"].size(); ++i) {
      json a = streamed["output"][i], b = whole["output"][i];
      for (json *x : {&a, &b}) x->erase("id"), x->erase("call_id");
      EXPECT_EQ(a, b);
    }
    EXPECT_EQ(streamed["status"], whole["status"]);
    EXPECT_EQ(streamed["usage"]["output_tokens"], whole["usage"]["output_tokens"]);
    EXPECT_EQ(streamed["usage"]["input_tokens"], whole["usage"]["input_tokens"]);
    EXPECT_GT(streamed["usage"]["input_tokens_details"]["cached_tokens"].get<int>(), 0);
  }
}

TEST(Responses, CutsAreIncompleteAndOverflowFails) {
  Running run(*shared().model, small_engine(256), opts("responses-test"));
  auto [s, cut] = run.post("/v1/responses", request(5));
  ASSERT_EQ(s, 200) << cut.dump();
  EXPECT_EQ(cut["status"], "incomplete");
  EXPECT_EQ(cut["incomplete_details"]["reason"], "max_output_tokens");
  json streamed = request(5);
  streamed["stream"] = true;
  auto [s2, body] = post_raw(run, streamed);
  ASSERT_EQ(s2, 200);
  EXPECT_EQ(stream_events(body).back()["type"], "response.incomplete");
  std::string words;
  for (int i = 0; i < 300; ++i) words += "word ";
  auto [s3, over] = run.post("/v1/responses", request(4, words));
  EXPECT_EQ(s3, 400);
  EXPECT_EQ(over["error"]["code"], "context_length_exceeded") << over.dump();
  json over_stream = request(4, words);
  over_stream["stream"] = true;
  auto [s4, failed] = post_raw(run, over_stream);
  ASSERT_EQ(s4, 200) << failed;
  const auto events = stream_events(failed);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back()["type"], "response.failed");
  EXPECT_EQ(events.back()["response"]["error"]["code"], "context_length_exceeded");
}

// A call cut by max_output_tokens is a cut: status incomplete, and no function_call item with
// guessed arguments.
TEST(Responses, ToolCallCutByMaxOutputTokensIsIncomplete) {
  Running run(*shared().model, small_engine(1024), opts("responses-test"));
  json req = request(8, "What's the weather in Oslo?");
  req["tools"] = {weather_tool()};
  req["tool_choice"] = {{"type", "function"}, {"name", "get_weather"}};
  req["reasoning"] = {{"effort", "none"}};
  for (bool stream : {false, true}) {
    req["stream"] = stream;
    auto [s, body] = post_raw(run, req);
    ASSERT_EQ(s, 200) << body;
    const json r = stream ? final_of(stream_events(body)) : json::parse(body);
    EXPECT_EQ(r["status"], "incomplete") << body;
    EXPECT_EQ(r["incomplete_details"]["reason"], "max_output_tokens");
    for (const json &item : r["output"]) EXPECT_NE(item["type"], "function_call") << body;
  }
}

TEST(Responses, FunctionAndNamespaceToolsAndTheirOutputs) {
  Running run(*shared().model, small_engine(1024), opts("responses-test"));
  json req = request(120, "What's the weather in Oslo?");
  json read = {{"type", "function"},
               {"name", "read"},
               {"strict", true},
               {"parameters",
                {{"type", "object"},
                 {"properties", {{"path", {{"type", "string"}, {"enum", {"a", "b"}}}}}},
                 {"required", {"path"}},
                 {"additionalProperties", false}}}};
  json files = {{"type", "namespace"}, {"name", "mcp_files"}, {"description", "Files"}};
  files["tools"] = json::array({read});
  req["tools"] = json::array({weather_tool(), files});
  req["parallel_tool_calls"] = false;
  req["reasoning"] = {{"effort", "none"}};
  for (const auto &[choice, name, ns] :
       {std::tuple{json{{"type", "function"}, {"name", "get_weather"}}, "get_weather", ""},
        std::tuple{json{{"type", "function"}, {"name", "mcp_files.read"}}, "read", "mcp_files"}}) {
    req["tool_choice"] = choice;
    auto [s, r] = run.post("/v1/responses", req);
    ASSERT_EQ(s, 200) << r.dump();
    EXPECT_EQ(r["status"], "completed") << r.dump();
    const json &call = r["output"].back();
    ASSERT_EQ(call["type"], "function_call") << r.dump();
    EXPECT_EQ(call["name"], name);
    if (*ns) {
      EXPECT_EQ(call["namespace"], ns);
    } else {
      EXPECT_FALSE(call.contains("namespace"));
    }
    EXPECT_TRUE(json::parse(call["arguments"].get<std::string>()).is_object());
    // The call's output, replayed as items: answered, the conversation read from the cache.
    json next = request(8);
    next["tools"] = req["tools"];
    next["reasoning"] = req["reasoning"];
    next["input"] = json::array({{{"role", "user"}, {"content", "What's the weather in Oslo?"}}});
    for (const json &item : r["output"]) next["input"].push_back(item);
    next["input"].push_back(
        {{"type", "function_call_output"}, {"call_id", call["call_id"]}, {"output", "Sunny"}});
    auto [s2, r2] = run.post("/v1/responses", next);
    ASSERT_EQ(s2, 200) << r2.dump();
    EXPECT_GT(r2["usage"]["input_tokens_details"]["cached_tokens"].get<int>(), 0) << r2.dump();
  }
  json orphan = request(4);
  orphan["input"] = {{{"type", "function_call_output"}, {"call_id", "nope"}, {"output", "x"}}};
  auto [s3, e3] = run.post("/v1/responses", orphan);
  EXPECT_EQ(s3, 400);
  EXPECT_NE(e3["error"]["message"].get<std::string>().find("nope"), std::string::npos);
}

TEST(Responses, PreviousResponseIdAndTheStore) {
  ServerOptions so = opts("responses-test");
  so.responses_store = 2;
  Running run(*shared().model, small_engine(1024), so);
  auto [s, first] = run.post("/v1/responses", request(8, "Tell me about the sea and the wind."));
  ASSERT_EQ(s, 200);
  const std::string id = first["id"];
  json next = request(8, "And the boats?");
  next["previous_response_id"] = id;
  auto [s2, second] = run.post("/v1/responses", next);
  ASSERT_EQ(s2, 200) << second.dump();
  EXPECT_EQ(second["previous_response_id"], id);
  // The first turn's prompt and answer come back from the cache.
  EXPECT_GE(second["usage"]["input_tokens_details"]["cached_tokens"].get<int>(),
            first["usage"]["input_tokens"].get<int>())
      << second.dump();
  auto got = run.client->Get(("/v1/responses/" + id).c_str());
  ASSERT_TRUE(got);
  EXPECT_EQ(got->status, 200);
  EXPECT_EQ(json::parse(got->body)["output"], first["output"]);
  auto del = run.client->Delete(("/v1/responses/" + id).c_str());
  ASSERT_TRUE(del);
  EXPECT_EQ(json::parse(del->body)["deleted"], true);
  EXPECT_EQ(run.client->Get(("/v1/responses/" + id).c_str())->status, 404);
  auto [s3, gone] = run.post("/v1/responses", next);
  EXPECT_EQ(s3, 400);
  EXPECT_EQ(gone["error"]["code"], "previous_response_not_found");
  // Two kept: a third evicts the oldest.
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(run.post("/v1/responses", request(2)).second["id"]);
  EXPECT_EQ(run.client->Get(("/v1/responses/" + ids[0]).c_str())->status, 404);
  EXPECT_EQ(run.client->Get(("/v1/responses/" + ids[2]).c_str())->status, 200);
  json unstored = request(2);
  unstored["store"] = false;
  const std::string quiet = run.post("/v1/responses", unstored).second["id"];
  EXPECT_EQ(run.client->Get(("/v1/responses/" + quiet).c_str())->status, 404);

  ServerOptions off = opts("responses-test");
  off.responses_store = 0;
  Running none(*shared().model, small_engine(256), off);
  json keep = request(2);
  keep["store"] = true;
  auto [s4, refused] = none.post("/v1/responses", keep);
  EXPECT_EQ(s4, 400);
  EXPECT_EQ(refused["error"]["param"], "store");
  EXPECT_EQ(none.post("/v1/responses", request(2)).first, 200); // store unset: not kept
}

TEST(Responses, HostedToolsRefusedOrDroppedAndReported) {
  {
    Running run(*shared().model, small_engine(1024), opts("responses-test"));
    json req = request(4);
    req["tools"] = {{{"type", "web_search"}}};
    auto [s, e] = run.post("/v1/responses", req);
    EXPECT_EQ(s, 400);
    EXPECT_NE(e["error"]["message"].get<std::string>().find("web_search"), std::string::npos);
  }
  ServerOptions so = opts("responses-test");
  so.drop_hosted_tools = true;
  Running run(*shared().model, small_engine(1024), so);
  json req = request(4);
  req["tools"] = {{{"type", "web_search"}}, weather_tool(false)};
  auto r = run.client->Post("/v1/responses", req.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->get_header_value("X-Offgraph-Dropped-Tools"), "web_search");
  EXPECT_EQ(run.metric("offgraph_dropped_tools_total"), 1);
}

TEST(Responses, ReasoningComesBackThroughEncryptedContent) {
  Running run(*shared().model, small_engine(1024), opts("responses-test"));
  int carried = 0;
  for (const char *user :
       {"Hello there", "Why is the sky blue?", "Count to ten", "What is 17*23?"}) {
    json req = request(24, user);
    req["include"] = {"reasoning.encrypted_content"};
    req["store"] = false;
    auto [s, r] = run.post("/v1/responses", req);
    ASSERT_EQ(s, 200) << r.dump();
    for (const json &item : r["output"])
      if (item["type"] == "reasoning") {
        EXPECT_TRUE(item.contains("encrypted_content")) << item.dump();
        json next = req;
        next["input"] = json::array({{{"role", "user"}, {"content", user}}});
        for (const json &x : r["output"]) next["input"].push_back(x);
        next["input"].push_back({{"role", "user"}, {"content", "Go on."}});
        auto [s2, r2] = run.post("/v1/responses", next);
        ASSERT_EQ(s2, 200) << r2.dump();
        ++carried;
        break;
      }
  }
  // A forged one is refused by name.
  json forged = request(4);
  forged["input"] = {{{"type", "reasoning"}, {"encrypted_content", "gAAAA-elsewhere"}},
                     {{"role", "user"}, {"content", "Hi"}}};
  auto [s3, e3] = run.post("/v1/responses", forged);
  EXPECT_EQ(s3, 400);
  EXPECT_EQ(e3["error"]["param"], "input[0].encrypted_content");
  (void)carried; // the model may not reason at temperature 0: each one that did was carried
  // Carried back, the reasoning is in the prompt where Chat Completions' reasoning_content puts
  // it: the same prompt, token for token.
  json items = request(2);
  items["input"] = {{{"role", "user"}, {"content", "Hi"}},
                    {{"type", "reasoning"},
                     {"summary", json::array()},
                     {"encrypted_content", responses::encrypt_reasoning("I should greet back.")}},
                    {{"type", "message"},
                     {"role", "assistant"},
                     {"content", {{{"type", "output_text"}, {"text", "Hello!"}}}}},
                    {{"role", "user"}, {"content", "Go on."}}};
  auto [s4, r4] = run.post("/v1/responses", items);
  ASSERT_EQ(s4, 200) << r4.dump();
  json chat_body = {{"max_tokens", 1},
                    {"messages",
                     {{{"role", "user"}, {"content", "Hi"}},
                      {{"role", "assistant"},
                       {"reasoning_content", "I should greet back."},
                       {"content", "Hello!"}},
                      {{"role", "user"}, {"content", "Go on."}}}}};
  auto [s5, r5] = run.post("/v1/chat/completions", chat_body);
  ASSERT_EQ(s5, 200);
  EXPECT_EQ(r4["usage"]["input_tokens"], r5["usage"]["prompt_tokens"]);
  chat_body["messages"][1].erase("reasoning_content");
  EXPECT_LT(run.post("/v1/chat/completions", chat_body).second["usage"]["prompt_tokens"],
            r4["usage"]["input_tokens"]);
}

TEST(Responses, TextFormatConstrainsTheAnswer) {
  Running run(*shared().model, small_engine(1024), opts("responses-test"));
  json req = request(200, "Forecast?");
  req["reasoning"] = {{"effort", "none"}};
  req["text"] = {{"format",
                  {{"type", "json_schema"},
                   {"name", "forecast"},
                   {"strict", true},
                   {"schema",
                    {{"type", "object"},
                     {"properties", {{"city", {{"type", "string"}, {"enum", {"Oslo", "Rome"}}}}}},
                     {"required", {"city"}},
                     {"additionalProperties", false}}}}}};
  auto [s, r] = run.post("/v1/responses", req);
  ASSERT_EQ(s, 200) << r.dump();
  ASSERT_EQ(r["status"], "completed") << r.dump();
  const json &msg = r["output"].back();
  ASSERT_EQ(msg["type"], "message");
  const json parsed = json::parse(msg["content"][0]["text"].get<std::string>());
  EXPECT_TRUE(parsed["city"] == "Oslo" || parsed["city"] == "Rome") << parsed.dump();
  EXPECT_EQ(r["text"]["format"]["type"], "json_schema");
  json bad = request(4);
  bad["text"] = {{"verbosity", "high"}};
  EXPECT_EQ(run.post("/v1/responses", bad).first, 400);
  bad = request(4);
  bad["truncation"] = "auto";
  EXPECT_EQ(run.post("/v1/responses", bad).first, 400);
}

// Custom tools: a regex and a Lark grammar bind the input (checked with std::regex, apart from
// the grammar machinery), a text one is free; calls come back as custom_tool_call items, streamed
// through custom_tool_call_input events, and go back in as items with their outputs.
TEST(Responses, CustomToolsWithGrammarsAndTheirOutputs) {
  Running run(*shared().model, small_engine(1024), opts("responses-test"));
  const json calc = {
      {"type", "custom"},
      {"name", "calc"},
      {"description", "Adds or subtracts"},
      {"format",
       {{"type", "grammar"}, {"syntax", "regex"}, {"definition", "(add|sub) [0-9]{1,3}"}}}};
  const json ls = {
      {"type", "custom"},
      {"name", "ls"},
      {"format",
       {{"type", "grammar"},
        {"syntax", "lark"},
        {"definition",
         "start: \"ls \" NAME (\" -\" FLAG)?\nNAME: /[a-z]{1,8}/\nFLAG: \"a\"..\"z\"\n"}}}};
  const json note = {{"type", "custom"}, {"name", "note"}, {"format", {{"type", "text"}}}};
  json req = request(300, "Compute something and list files.");
  req["tools"] = json::array({calc, ls, note});
  req["parallel_tool_calls"] = false;
  req["reasoning"] = {{"effort", "none"}};
  for (const auto &[name, pattern] :
       {std::pair{"calc", "(add|sub) [0-9]{1,3}"}, std::pair{"ls", "ls [a-z]{1,8}( -[a-z])?"}}) {
    req["tool_choice"] = {{"type", "custom"}, {"name", name}};
    auto [s, r] = run.post("/v1/responses", req);
    ASSERT_EQ(s, 200) << r.dump();
    ASSERT_EQ(r["status"], "completed") << r.dump();
    const json &call = r["output"].back();
    ASSERT_EQ(call["type"], "custom_tool_call") << r.dump();
    EXPECT_EQ(call["name"], name);
    const std::string input = call["input"];
    EXPECT_TRUE(std::regex_match(input, std::regex(pattern))) << input;
    // Streamed: the same item, its input in custom_tool_call_input events.
    json streamed = req;
    streamed["stream"] = true;
    auto [s2, body] = post_raw(run, streamed);
    ASSERT_EQ(s2, 200);
    const auto events = stream_events(body);
    const json streamed_call = final_of(events)["output"].back();
    EXPECT_EQ(streamed_call["type"], "custom_tool_call");
    EXPECT_EQ(streamed_call["input"], input);
    std::string deltas;
    bool done = false;
    for (const json &e : events) {
      if (e["type"] == "response.custom_tool_call_input.delta") deltas += e["delta"];
      if (e["type"] == "response.custom_tool_call_input.done") done = e["input"] == input;
    }
    EXPECT_EQ(deltas, input);
    EXPECT_TRUE(done);
    // Back as items with the tool's output: answered, the conversation read from the cache.
    json next = request(8);
    next["tools"] = req["tools"];
    next["reasoning"] = req["reasoning"];
    next["input"] =
        json::array({{{"role", "user"}, {"content", "Compute something and list files."}}});
    for (const json &item : r["output"]) next["input"].push_back(item);
    next["input"].push_back(
        {{"type", "custom_tool_call_output"}, {"call_id", call["call_id"]}, {"output", "42"}});
    auto [s3, r3] = run.post("/v1/responses", next);
    ASSERT_EQ(s3, 200) << r3.dump();
    EXPECT_GT(r3["usage"]["input_tokens_details"]["cached_tokens"].get<int>(), 0) << r3.dump();
  }
  // A text tool's call given back, with what a patch holds (brackets, newlines, quotes).
  json given = request(8);
  given["tools"] = req["tools"];
  given["input"] =
      json::array({{{"role", "user"}, {"content", "Note it."}},
                   {{"type", "custom_tool_call"},
                    {"call_id", "c1"},
                    {"name", "note"},
                    {"input", "a <b>\n\"c\""}},
                   {{"type", "custom_tool_call_output"}, {"call_id", "c1"}, {"output", "noted"}}});
  auto [s6, r6] = run.post("/v1/responses", given);
  EXPECT_EQ(s6, 200) << r6.dump();
  // A grammar that cannot be read, or a format this server lacks: refused by name.
  json bad = request(4);
  bad["tools"] = {
      {{"type", "custom"},
       {"name", "broken"},
       {"format", {{"type", "grammar"}, {"syntax", "lark"}, {"definition", "start: x"}}}}};
  auto [s4, e4] = run.post("/v1/responses", bad);
  EXPECT_EQ(s4, 400);
  EXPECT_EQ(e4["error"]["code"], "invalid_grammar") << e4.dump();
  EXPECT_NE(e4["error"]["message"].get<std::string>().find("broken"), std::string::npos);
  bad["tools"][0]["format"] = {{"type", "grammar"}, {"syntax", "ebnf"}, {"definition", "x"}};
  auto [s5, e5] = run.post("/v1/responses", bad);
  EXPECT_EQ(s5, 400);
  EXPECT_EQ(e5["error"]["param"], "tools[0].format.syntax") << e5.dump();
}

} // namespace
} // namespace offgraph::server::testing
