// Anthropic's Messages API on a live server: the stream's event grammar, streamed = whole, every
// stop reason, count_tokens against the prompt the answer computed, the conversation rendered as
// the same Chat Completions conversation is, errors in Anthropic's shape, and a tool call cut by
// max_tokens reported as a cut in both APIs.
#include "live_server.h"

namespace offgraph::server::testing {
namespace {

struct Shared {
  std::string path = make_model(16, 5, "messages");
  std::unique_ptr<model::Model> model = std::move(model::Model::load(path)).value();
  ~Shared() { fs::remove(path); }
};
Shared &shared() {
  static Shared s;
  return s;
}

json weather_tool() {
  return {{"name", "get_weather"},
          {"description", "Weather of a city"},
          {"input_schema",
           {{"type", "object"},
            {"properties", {{"city", {{"type", "string"}}}}},
            {"required", {"city"}}}}};
}

// Thinking asked for: the answers show the model's reasoning as thinking blocks.
json message(int max_tokens, const std::string &user = "Hello there") {
  return {{"model", "messages-test"},
          {"max_tokens", max_tokens},
          {"temperature", 0},
          {"thinking", {{"type", "adaptive"}}},
          {"messages", {{{"role", "user"}, {"content", user}}}}};
}

struct Sse {
  std::string name;
  json data;
};

// The named events of an SSE body, in order.
std::vector<Sse> events_of(const std::string &body) {
  std::vector<Sse> out;
  size_t at = 0;
  while ((at = body.find("event: ", at)) != std::string::npos) {
    const size_t line = body.find('\n', at);
    const std::string name = body.substr(at + 7, line - at - 7);
    const size_t data = body.find("data: ", line);
    const size_t end = body.find("\n\n", data);
    out.push_back({name, json::parse(body.substr(data + 6, end - data - 6))});
    at = end;
  }
  return out;
}

// Checks Anthropic's grammar and rebuilds the message the events describe.
json assemble(const std::vector<Sse> &events) {
  EXPECT_FALSE(events.empty());
  if (events.empty()) return json();
  EXPECT_EQ(events.front().name, "message_start");
  EXPECT_EQ(events.back().name, "message_stop");
  json msg = events.front().data["message"];
  int open = -1;
  std::string open_type;
  bool signed_thinking = false;
  for (size_t i = 1; i < events.size(); ++i) {
    const auto &[name, d] = events[i];
    EXPECT_EQ(d["type"], name) << "event " << i;
    if (name == "content_block_start") {
      EXPECT_EQ(open, -1) << "a block opened while another is open, event " << i;
      open = d["index"];
      EXPECT_EQ(size_t(open), msg["content"].size());
      open_type = d["content_block"]["type"];
      signed_thinking = false;
      msg["content"].push_back(d["content_block"]);
      if (open_type == "tool_use") msg["content"].back()["partial"] = "";
    } else if (name == "content_block_delta") {
      EXPECT_EQ(d["index"], open) << "a delta for a block that is not open, event " << i;
      if (open < 0) continue;
      json &block = msg["content"][size_t(open)];
      const std::string type = d["delta"]["type"];
      if (type == "text_delta") {
        EXPECT_EQ(open_type, "text");
        block["text"] = block["text"].get<std::string>() + d["delta"]["text"].get<std::string>();
      } else if (type == "thinking_delta") {
        EXPECT_EQ(open_type, "thinking");
        EXPECT_FALSE(signed_thinking) << "thinking after its signature";
        block["thinking"] =
            block["thinking"].get<std::string>() + d["delta"]["thinking"].get<std::string>();
      } else if (type == "signature_delta") {
        EXPECT_EQ(open_type, "thinking");
        block["signature"] = d["delta"]["signature"];
        signed_thinking = true;
      } else if (type == "input_json_delta") {
        EXPECT_EQ(open_type, "tool_use");
        block["partial"] =
            block["partial"].get<std::string>() + d["delta"]["partial_json"].get<std::string>();
      } else {
        ADD_FAILURE() << "unknown delta " << type;
      }
    } else if (name == "content_block_stop") {
      EXPECT_EQ(d["index"], open);
      if (open_type == "thinking") {
        EXPECT_TRUE(signed_thinking) << "no signature_delta";
      }
      if (open_type == "tool_use") {
        json &block = msg["content"][size_t(open)];
        block["input"] = json::parse(block["partial"].get<std::string>());
        block.erase("partial");
      }
      open = -1;
    } else if (name == "message_delta") {
      EXPECT_EQ(open, -1) << "message_delta with a block open";
      msg["stop_reason"] = d["delta"]["stop_reason"];
      msg["stop_sequence"] = d["delta"]["stop_sequence"];
      msg["usage"] = d["usage"];
    } else if (name != "ping" && name != "message_stop") {
      ADD_FAILURE() << "unexpected event " << name;
    }
  }
  return msg;
}

std::pair<int, std::string> post_raw(Running &run, const std::string &route, const json &body,
                                     const httplib::Headers &headers = {}) {
  auto r = run.client->Post(route.c_str(), headers, body.dump(), "application/json");
  if (!r) return {0, ""};
  return {r->status, r->body};
}

TEST(Messages, StreamedEqualsWholeAndFollowsTheEventGrammar) {
  Running run(*shared().model, small_engine(1024), opts("messages-test"));
  for (const char *user : {"Hello there", "Write a haiku about the sea"}) {
    json req = message(48, user);
    auto [s, whole] = run.post("/v1/messages", req);
    ASSERT_EQ(s, 200) << whole.dump();
    EXPECT_EQ(whole["type"], "message");
    EXPECT_EQ(whole["role"], "assistant");
    EXPECT_EQ(whole["model"], "messages-test");
    req["stream"] = true;
    auto [s2, body] = post_raw(run, "/v1/messages?beta=true", req);
    ASSERT_EQ(s2, 200) << body;
    const json streamed = assemble(events_of(body));
    EXPECT_EQ(streamed["content"], whole["content"]) << body;
    EXPECT_EQ(streamed["stop_reason"], whole["stop_reason"]);
    EXPECT_EQ(streamed["usage"]["output_tokens"], whole["usage"]["output_tokens"]);
    // Every token of the prompt is either computed or read from the cache, in both.
    for (const json &u : {streamed["usage"], whole["usage"]})
      EXPECT_EQ(u["input_tokens"].get<int64_t>() + u["cache_read_input_tokens"].get<int64_t>(),
                whole["usage"]["input_tokens"].get<int64_t>() +
                    whole["usage"]["cache_read_input_tokens"].get<int64_t>());
    // The same request again reads its prompt from the cache (all but the last token).
    EXPECT_GT(streamed["usage"]["cache_read_input_tokens"].get<int64_t>(), 0) << body;
  }
}

TEST(Messages, EveryStopReason) {
  Running run(*shared().model, small_engine(1024), opts("messages-test"));
  json req = message(6);
  auto [s, cut] = run.post("/v1/messages", req);
  ASSERT_EQ(s, 200) << cut.dump();
  EXPECT_EQ(cut["stop_reason"], "max_tokens");
  EXPECT_EQ(cut["usage"]["output_tokens"], 6);
  // A stop sequence taken from the greedy answer's own text ends it there.
  req["max_tokens"] = 40;
  auto [s1, full] = run.post("/v1/messages", req);
  ASSERT_EQ(s1, 200);
  std::string said;
  for (const json &b : full["content"])
    if (b["type"] == "thinking" || b["type"] == "text")
      said += b.value("thinking", "") + b.value("text", "");
  ASSERT_GE(said.size(), 12u) << full.dump();
  const std::string stop = said.substr(6, 4);
  req["stop_sequences"] = {stop};
  auto [s2, stopped] = run.post("/v1/messages", req);
  ASSERT_EQ(s2, 200);
  EXPECT_EQ(stopped["stop_reason"], "stop_sequence") << stopped.dump();
  EXPECT_EQ(stopped["stop_sequence"], stop);
  // A forced call to a strict tool: tool_use, its input an object with the required property.
  json call = message(120, "What's the weather in Paris?");
  json strict = weather_tool();
  strict["strict"] = true;
  strict["input_schema"]["additionalProperties"] = false;
  // A greedy random model never ends a free string: the city is one of a few.
  strict["input_schema"]["properties"]["city"]["enum"] = {"Oslo", "Paris", "Rome"};
  call["tools"] = {strict};
  call["tool_choice"] = {{"type", "any"}, {"disable_parallel_tool_use", true}};
  call["thinking"] = {{"type", "disabled"}};
  auto [s3, used] = run.post("/v1/messages", call);
  ASSERT_EQ(s3, 200) << used.dump();
  EXPECT_EQ(used["stop_reason"], "tool_use") << used.dump();
  const json &block = used["content"].back();
  EXPECT_EQ(block["type"], "tool_use");
  EXPECT_EQ(block["name"], "get_weather");
  EXPECT_TRUE(block["input"].is_object() && block["input"].contains("city")) << block.dump();
  EXPECT_EQ(block["id"].get<std::string>().rfind("toolu_", 0), 0u);
}

// A call cut by max_tokens is a cut in both APIs, never a call with guessed arguments (both
// asserts failed before ChoiceOutput::finish(cut)).
TEST(Messages, ToolCallCutByMaxTokensIsReportedAsACut) {
  Running run(*shared().model, small_engine(1024), opts("messages-test"));
  json call = message(8, "What's the weather in Paris?");
  call["tools"] = {weather_tool()};
  call["tool_choice"] = {{"type", "tool"}, {"name", "get_weather"}};
  call["thinking"] = {{"type", "disabled"}};
  auto [s, cut] = run.post("/v1/messages", call);
  ASSERT_EQ(s, 200) << cut.dump();
  EXPECT_EQ(cut["stop_reason"], "max_tokens");
  for (const json &b : cut["content"]) EXPECT_NE(b["type"], "tool_use") << cut.dump();

  json chat_call = chat(8, "What's the weather in Paris?");
  chat_call["tools"] = {{{"type", "function"},
                         {"function",
                          {{"name", "get_weather"},
                           {"strict", true},
                           {"parameters",
                            {{"type", "object"},
                             {"properties", {{"city", {{"type", "string"}}}}},
                             {"required", {"city"}},
                             {"additionalProperties", false}}}}}}};
  chat_call["tool_choice"] = "required";
  chat_call["reasoning_effort"] = "none";
  auto [s2, b2] = run.post("/v1/chat/completions", chat_call);
  ASSERT_EQ(s2, 200) << b2.dump();
  EXPECT_EQ(b2["choices"][0]["finish_reason"], "length");
  EXPECT_FALSE(b2["choices"][0]["message"].contains("tool_calls")) << b2.dump();
}

// count_tokens is the prompt the answer computes; an Anthropic conversation (system blocks,
// tool_use, tool_result, a mid-conversation system message) renders as its Chat Completions
// equivalent does.
TEST(Messages, CountTokensAndTheConversationAsChatCompletionsWouldRenderIt) {
  Running run(*shared().model, small_engine(1024), opts("messages-test"));
  json req = {
      {"model", "messages-test"},
      {"max_tokens", 4},
      {"temperature", 0},
      {"system", {{{"type", "text"}, {"text", "You are terse."}}}},
      {"tools", {weather_tool()}},
      {"messages",
       {{{"role", "user"}, {"content", "Weather in Oslo?"}},
        {{"role", "assistant"},
         {"content",
          {{{"type", "thinking"}, {"thinking", "Ask the tool."}, {"signature", "x"}},
           {{"type", "tool_use"},
            {"id", "toolu_1"},
            {"name", "get_weather"},
            {"input", {{"city", "Oslo"}}}}}}},
        {{"role", "user"},
         {"content",
          {{{"type", "tool_result"}, {"tool_use_id", "toolu_1"}, {"content", "Sunny, 21 C"}}}}},
        {{"role", "system"}, {"content", "Answer in French."}}}}};
  auto [s, answer] = run.post("/v1/messages", req);
  ASSERT_EQ(s, 200) << answer.dump();
  json count = req;
  count.erase("max_tokens");
  count.erase("temperature");
  auto [s2, counted] = run.post("/v1/messages/count_tokens", count);
  ASSERT_EQ(s2, 200) << counted.dump();
  const json &u = answer["usage"];
  EXPECT_EQ(counted["input_tokens"].get<int64_t>(),
            u["input_tokens"].get<int64_t>() + u["cache_read_input_tokens"].get<int64_t>());

  json openai = {
      {"messages",
       {{{"role", "system"}, {"content", "You are terse."}},
        {{"role", "user"}, {"content", "Weather in Oslo?"}},
        {{"role", "assistant"},
         {"reasoning_content", "Ask the tool."},
         {"tool_calls",
          {{{"id", "toolu_1"},
            {"type", "function"},
            {"function", {{"name", "get_weather"}, {"arguments", "{\"city\":\"Oslo\"}"}}}}}}},
        {{"role", "tool"}, {"tool_call_id", "toolu_1"}, {"content", "Sunny, 21 C"}},
        {{"role", "system"}, {"content", "Answer in French."}}}},
      {"tools",
       {{{"type", "function"},
         {"function",
          {{"name", "get_weather"},
           {"description", "Weather of a city"},
           {"parameters", weather_tool()["input_schema"]}}}}}}};
  openai["max_tokens"] = 1;
  auto [s3, chat_answer] = run.post("/v1/chat/completions", openai);
  ASSERT_EQ(s3, 200) << chat_answer.dump();
  EXPECT_EQ(counted["input_tokens"], chat_answer["usage"]["prompt_tokens"]);
}

TEST(Messages, ErrorsInAnthropicsShape) {
  ServerOptions so = opts("messages-test");
  so.api_key = "k-123";
  Running run(*shared().model, small_engine(256), so);
  const httplib::Headers key = {{"x-api-key", "k-123"}, {"anthropic-version", "2023-06-01"}};
  auto expect = [&](const std::string &route, const std::string &body, int status,
                    const std::string &type, const std::string &says,
                    const httplib::Headers &headers) {
    auto r = run.client->Post(route.c_str(), headers, body, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, status) << body << " -> " << r->body;
    json b = json::parse(r->body, nullptr, false);
    EXPECT_EQ(b["type"], "error") << r->body;
    EXPECT_EQ(b["error"]["type"], type) << r->body;
    EXPECT_NE(b["error"]["message"].get<std::string>().find(says), std::string::npos)
        << says << " not in " << r->body;
  };
  const std::string ok = message(4).dump();
  expect("/v1/messages", ok, 401, "authentication_error", "API key", {});
  expect("/v1/messages", ok, 401, "authentication_error", "not valid", {{"x-api-key", "k-12"}});
  EXPECT_EQ(run.client->Post("/v1/messages", key, ok, "application/json")->status, 200);
  EXPECT_EQ(
      run.client->Post("/v1/messages", {{"Authorization", "Bearer k-123"}}, ok, "application/json")
          ->status,
      200);
  expect("/v1/messages", "{\"model\": ", 400, "invalid_request_error", "not valid JSON", key);
  json no_max = message(4);
  no_max.erase("max_tokens");
  expect("/v1/messages", no_max.dump(), 400, "invalid_request_error", "max_tokens", key);
  json extra = message(4);
  extra["frequency_penalty"] = 1;
  expect("/v1/messages", extra.dump(), 400, "invalid_request_error", "frequency_penalty", key);
  json server_tool = message(4);
  server_tool["tools"] = {{{"type", "web_search_20250305"}, {"name", "web_search"}}};
  expect("/v1/messages", server_tool.dump(), 400, "invalid_request_error", "web_search_20250305",
         key);
  json orphan = message(4);
  orphan["messages"] = {
      {{"role", "user"}, {"content", {{{"type", "tool_result"}, {"tool_use_id", "toolu_9"}}}}}};
  expect("/v1/messages", orphan.dump(), 400, "invalid_request_error", "toolu_9", key);
  json hot = message(4);
  hot["temperature"] = 1.5;
  expect("/v1/messages", hot.dump(), 400, "invalid_request_error", "temperature", key);
  json model = message(4);
  model["model"] = "claude-opus-9";
  expect("/v1/messages", model.dump(), 404, "not_found_error", "claude-opus-9", key);
  // The context (256) overflowed, in the words Claude Code compacts on.
  std::string words;
  for (int i = 0; i < 300; ++i) words += "word ";
  expect("/v1/messages", message(4, words).dump(), 413, "request_too_large",
         "prompt is too long: ", key);
  expect("/v1/messages", message(250).dump(), 400, "invalid_request_error",
         "input length and `max_tokens` exceed context limit: ", key);
  expect("/v1/messages/nothing", ok, 404, "not_found_error", "no route", key);
  // Values of the wrong type are 400s naming them, never a 500 (nlohmann's value() throws).
  for (const auto &[bad_body, says] : std::vector<std::pair<json, std::string>>{
           {{{"role", "user"}, {"content", {{{"type", "image"}, {"source", {{"type", 5}}}}}}},
            "source.type"},
           {{{"role", "user"},
             {"content", {{{"type", "tool_result"}, {"tool_use_id", "t"}, {"is_error", "yes"}}}}},
            "tool_use_id"}}) {
    json b = message(4);
    b["messages"] = {bad_body};
    expect("/v1/messages", b.dump(), 400, "invalid_request_error", says, key);
  }
  json typed = message(4);
  typed["system"] = {{{"type", 7}, {"text", "x"}}};
  expect("/v1/messages", typed.dump(), 400, "invalid_request_error", "system[0]", key);
  typed = {{"model", "messages-test"}, {"messages", message(4)["messages"]}};
  typed["tools"] = {{{"name", "t"}, {"input_schema", json::object()}, {"defer_loading", nullptr}}};
  EXPECT_EQ(
      run.client->Post("/v1/messages/count_tokens", key, typed.dump(), "application/json")->status,
      200);
  typed["tools"][0]["defer_loading"] = "yes";
  expect("/v1/messages/count_tokens", typed.dump(), 400, "invalid_request_error", "defer_loading",
         key);
  typed = message(4);
  typed["output_config"] = {{"format", {{"type", 3}}}};
  expect("/v1/messages", typed.dump(), 400, "invalid_request_error", "output_config.format", key);
  typed = message(4);
  typed["context_management"] = {{"edits", {{{"type", 1}}}}};
  expect("/v1/messages", typed.dump(), 400, "invalid_request_error", "context_management", key);
  // A prefill (a last assistant message) is refused, not answered as a new turn.
  json prefill = message(4);
  prefill["messages"].push_back({{"role", "assistant"}, {"content", "The answer is"}});
  expect("/v1/messages", prefill.dump(), 400, "invalid_request_error", "prefill", key);
  // count_tokens counts a prompt over the context too.
  json count = {{"model", "messages-test"}, {"messages", {{{"role", "user"}, {"content", words}}}}};
  auto counted =
      run.client->Post("/v1/messages/count_tokens", key, count.dump(), "application/json");
  ASSERT_TRUE(counted);
  EXPECT_EQ(counted->status, 200) << counted->body;
  EXPECT_GT(json::parse(counted->body)["input_tokens"].get<int>(), 256);
  // A max_tokens over the context is the context error Claude Code lowers max_tokens on.
  expect("/v1/messages", message(100000).dump(), 400, "invalid_request_error",
         "input length and `max_tokens` exceed context limit: ", key);
}

// Claude Code's attribution line is metadata: two versions of it give the prompt without it, so
// sessions of different versions share their system prompt in the cache.
TEST(Messages, ClaudeCodesAttributionLineIsLeftOut) {
  Running run(*shared().model, small_engine(1024), opts("messages-test"));
  auto count = [&](const json &system) {
    json body = {{"model", "messages-test"},
                 {"system", system},
                 {"messages", {{{"role", "user"}, {"content", "Hi"}}}}};
    auto [s, b] = run.post("/v1/messages/count_tokens", body);
    EXPECT_EQ(s, 200) << b.dump();
    return b["input_tokens"].get<int64_t>();
  };
  const json rules = {{"type", "text"}, {"text", "You are an agent."}};
  auto line = [](const std::string &version) {
    return json{
        {"type", "text"},
        {"text", "x-anthropic-billing-header: cc_version=" + version + "; cc_entrypoint=sdk-cli;"}};
  };
  const int64_t plain = count(json::array({rules}));
  EXPECT_EQ(count(json::array({line("2.1.332.1c9"), rules})), plain);
  EXPECT_EQ(count(json::array({line("2.2.0.abc"), rules})), plain);
  // Only that line: the same words elsewhere are the user's.
  EXPECT_GT(count(json::array({rules, {{"type", "text"}, {"text", "billing header"}}})), plain);
}

// A follow-up turn reads the conversation so far from the cache.
TEST(Messages, ASecondTurnReadsTheFirstFromTheCache) {
  Running run(*shared().model, small_engine(1024), opts("messages-test"));
  json req = message(16, "Tell me about the sea, the wind and the boats that sail on them.");
  auto [s, first] = run.post("/v1/messages", req);
  ASSERT_EQ(s, 200) << first.dump();
  req["messages"].push_back({{"role", "assistant"}, {"content", first["content"]}});
  req["messages"].push_back({{"role", "user"}, {"content", "And the birds?"}});
  auto [s2, second] = run.post("/v1/messages", req);
  ASSERT_EQ(s2, 200) << second.dump();
  const json &u = second["usage"];
  const double total =
      double(u["input_tokens"].get<int64_t>() + u["cache_read_input_tokens"].get<int64_t>());
  EXPECT_GE(u["cache_read_input_tokens"].get<double>(), 0.6 * total) << u.dump();
}

} // namespace
} // namespace offgraph::server::testing
