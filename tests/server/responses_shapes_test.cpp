// The Responses API's output items and stream events without a server: items in the order the
// model wrote them, one open at a time, every event numbered, output_item.done items equal to
// the final output, a namespace tool's call split back into name and namespace, the summary
// streamed when asked, reasoning sealed for the client to send back.
#include "server/responses.h"

#include <gtest/gtest.h>

namespace offgraph::server::responses {
namespace {

ChoiceOutput::Delta delta(std::string reasoning, std::string content, json calls = json::array()) {
  ChoiceOutput::Delta d;
  d.reasoning = std::move(reasoning), d.content = std::move(content), d.tool_calls = calls;
  return d;
}

json call(const std::string &name, const std::string &args) {
  return {{"index", 0},
          {"id", "call_0"},
          {"type", "function"},
          {"function", {{"name", name}, {"arguments", args}}}};
}

TEST(ResponsesShapes, ItemsInOrderWithNumberedEvents) {
  OutputBuilder b("9", true, true, json{{"mcp.read", {{"namespace", "mcp"}, {"name", "read"}}}});
  std::vector<json> events;
  for (const auto &d : {delta("Think", ""), delta(" more.", "Hi"), delta("", " there."),
                        delta("", "", json::array({call("mcp.read", R"({"path":"a"})")})),
                        delta("", "", json::array({call("plain", "{}")}))})
    for (json &e : b.add(d)) events.push_back(std::move(e));
  for (json &e : b.close()) events.push_back(std::move(e));
  const json &out = b.output();
  ASSERT_EQ(out.size(), 4u) << out.dump();
  EXPECT_EQ(out[0]["type"], "reasoning");
  EXPECT_EQ(out[0]["content"][0]["text"], "Think more.");
  EXPECT_EQ(out[0]["summary"][0]["text"], "Think more.");
  EXPECT_EQ(out[0]["encrypted_content"], encrypt_reasoning("Think more."));
  EXPECT_EQ(out[1]["type"], "message");
  EXPECT_EQ(out[1]["content"][0]["text"], "Hi there.");
  EXPECT_EQ(out[1]["status"], "completed");
  EXPECT_EQ(out[2]["name"], "read");
  EXPECT_EQ(out[2]["namespace"], "mcp");
  EXPECT_EQ(out[2]["arguments"], R"({"path":"a"})");
  EXPECT_EQ(out[3]["name"], "plain");
  EXPECT_FALSE(out[3].contains("namespace"));
  EXPECT_NE(out[2]["call_id"], out[3]["call_id"]);
  int64_t seq = 0;
  int open = -1, calls_done = 0;
  std::string summary;
  for (const json &e : events) {
    EXPECT_EQ(e["sequence_number"], seq++) << e.dump();
    const std::string type = e["type"];
    if (type == "response.output_item.added") {
      EXPECT_EQ(open, -1) << "two items open";
      open = e["output_index"];
    } else if (type == "response.output_item.done") {
      EXPECT_EQ(e["output_index"], open);
      EXPECT_EQ(e["item"], out[size_t(open)]);
      open = -1;
    } else {
      EXPECT_EQ(e["output_index"], open) << e.dump();
    }
    if (type == "response.reasoning_summary_text.delta") summary += e["delta"].get<std::string>();
    if (type == "response.function_call_arguments.done") { // named, as OpenAI's event is
      EXPECT_EQ(e["name"], out[size_t(open)]["name"]) << e.dump();
      EXPECT_EQ(e["arguments"], out[size_t(open)]["arguments"]) << e.dump();
      ++calls_done;
    }
  }
  EXPECT_EQ(calls_done, 2);
  EXPECT_EQ(open, -1);
  EXPECT_EQ(summary, "Think more.");
}

TEST(ResponsesShapes, NoSummaryOrSealUnlessAsked) {
  OutputBuilder b("1", false, false, json::object());
  std::vector<json> events = b.add(delta("Hmm.", ""));
  for (json &e : b.close()) events.push_back(std::move(e));
  ASSERT_EQ(b.output().size(), 1u);
  EXPECT_TRUE(b.output()[0]["summary"].empty());
  EXPECT_FALSE(b.output()[0].contains("encrypted_content"));
  for (const json &e : events)
    EXPECT_EQ(e["type"].get<std::string>().find("summary"), std::string::npos) << e.dump();
}

TEST(ResponsesShapes, TheStoreKeepsTheLastAndDropsTheLeastRecentlyUsed) {
  Store store(2);
  Stored a, b, c;
  a.response = {{"id", "a"}}, b.response = {{"id", "b"}}, c.response = {{"id", "c"}};
  store.put("a", a);
  store.put("b", b);
  ASSERT_TRUE(store.get("a")); // a is now the most recent: b goes next
  store.put("c", c);
  EXPECT_TRUE(store.get("a"));
  EXPECT_FALSE(store.get("b"));
  EXPECT_EQ(store.get("c")->response["id"], "c");
  EXPECT_TRUE(store.erase("c"));
  EXPECT_FALSE(store.erase("c"));
  Store none(0);
  none.put("x", a);
  EXPECT_FALSE(none.get("x"));
}

} // namespace
} // namespace offgraph::server::responses
