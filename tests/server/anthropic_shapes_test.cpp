// Anthropic's answer shapes without a server: MessageBuilder's blocks and events for deltas in
// any order (reasoning, text, calls interleaved), thinking left out when not asked for, the
// stream grammar's rules checked event by event, usage and context errors.
#include "server/anthropic.h"

#include <gtest/gtest.h>

namespace offgraph::server::anthropic {
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

// The grammar: one block open at a time, deltas of its type, signature before a thinking block
// stops; returns the content the events describe.
json replay(const std::vector<Event> &events) {
  json content = json::array();
  int open = -1;
  std::string type;
  bool signed_ = false;
  for (const Event &e : events) {
    EXPECT_EQ(e.data["type"], e.name);
    if (e.name == "content_block_start") {
      EXPECT_EQ(open, -1) << "two blocks open";
      open = e.data["index"];
      EXPECT_EQ(size_t(open), content.size());
      content.push_back(e.data["content_block"]);
      type = content.back()["type"];
      signed_ = false;
      if (type == "tool_use") content.back()["input"] = "";
    } else if (e.name == "content_block_delta") {
      EXPECT_EQ(e.data["index"], open);
      json &b = content[size_t(open)];
      const json &d = e.data["delta"];
      if (d["type"] == "thinking_delta") {
        EXPECT_EQ(type, "thinking");
        EXPECT_FALSE(signed_);
        b["thinking"] = b["thinking"].get<std::string>() + d["thinking"].get<std::string>();
      } else if (d["type"] == "signature_delta") {
        EXPECT_EQ(type, "thinking");
        b["signature"] = d["signature"], signed_ = true;
      } else if (d["type"] == "text_delta") {
        EXPECT_EQ(type, "text");
        b["text"] = b["text"].get<std::string>() + d["text"].get<std::string>();
      } else {
        EXPECT_EQ(d["type"], "input_json_delta");
        EXPECT_EQ(type, "tool_use");
        b["input"] = b["input"].get<std::string>() + d["partial_json"].get<std::string>();
      }
    } else if (e.name == "content_block_stop") {
      EXPECT_EQ(e.data["index"], open);
      if (type == "thinking") {
        EXPECT_TRUE(signed_) << "no signature before the stop";
      }
      if (type == "tool_use")
        content[size_t(open)]["input"] =
            json::parse(content[size_t(open)]["input"].get<std::string>());
      open = -1;
    }
  }
  EXPECT_EQ(open, -1) << "a block left open";
  return content;
}

TEST(AnthropicShapes, BlocksFollowTheOrderTheModelWroteIn) {
  MessageBuilder b("7", true);
  std::vector<Event> events;
  for (const auto &d : {delta("Let me ", ""), delta("think.", "Here"), delta("", " it is."),
                        delta("", "", json::array({call("get_weather", R"({"city":"Oslo"})")})),
                        delta("", "Done."), delta("Again.", "")})
    for (Event &e : b.add(d)) events.push_back(std::move(e));
  for (Event &e : b.close()) events.push_back(std::move(e));
  const json content = replay(events);
  EXPECT_EQ(content, b.content());
  ASSERT_EQ(content.size(), 5u) << content.dump();
  EXPECT_EQ(content[0]["type"], "thinking");
  EXPECT_EQ(content[0]["thinking"], "Let me think.");
  EXPECT_EQ(content[0]["signature"], thinking_signature("Let me think."));
  EXPECT_EQ(content[1]["text"], "Here it is.");
  EXPECT_EQ(content[2]["type"], "tool_use");
  EXPECT_EQ(content[2]["id"], "toolu_7_0");
  EXPECT_EQ(content[2]["input"], json::parse(R"({"city":"Oslo"})"));
  EXPECT_EQ(content[3]["text"], "Done.");
  EXPECT_EQ(content[4]["thinking"], "Again.");
}

TEST(AnthropicShapes, ThinkingLeftOutWhenNotAskedFor) {
  MessageBuilder b("1", false);
  std::vector<Event> events;
  for (const auto &d : {delta("Hmm.", ""), delta("", "Hello"), delta("More.", " there")})
    for (Event &e : b.add(d)) events.push_back(std::move(e));
  for (Event &e : b.close()) events.push_back(std::move(e));
  const json content = replay(events);
  ASSERT_EQ(content.size(), 1u) << content.dump();
  EXPECT_EQ(content[0]["type"], "text");
  EXPECT_EQ(content[0]["text"], "Hello there");
}

TEST(AnthropicShapes, UsageAddsUpAndContextErrorsSayWhatClaudeCodeReads) {
  const json u = usage(100, 60, 7);
  EXPECT_EQ(u["input_tokens"], 40);
  EXPECT_EQ(u["cache_read_input_tokens"], 60);
  EXPECT_EQ(u["output_tokens"], 7);
  const ApiError over = context_error(300, 10, 256);
  EXPECT_EQ(over.status, 413);
  EXPECT_EQ(over.message.rfind("prompt is too long: 300 tokens > 255 maximum", 0), 0u);
  EXPECT_EQ(anthropic::error_body(over)["error"]["type"], "request_too_large");
  const ApiError both = context_error(200, 100, 256);
  EXPECT_EQ(both.status, 400);
  EXPECT_EQ(
      both.message.rfind("input length and `max_tokens` exceed context limit: 200 + 100 > 256", 0),
      0u);
  EXPECT_EQ(anthropic::error_body({401, "no", "", ""})["error"]["type"], "authentication_error");
  EXPECT_EQ(anthropic::error_body({503, "loading", "", ""})["error"]["type"], "overloaded_error");
}

} // namespace
} // namespace offgraph::server::anthropic
