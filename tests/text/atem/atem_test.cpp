// The ATEM parser on recorded Muse Glimmer streams, whole and split at every boundary: the
// aggregated message is the same, deltas never carry (part of) a marker, and text already
// emitted is never retracted.
#include "text/atem/atem_parser.h"

#include <gtest/gtest.h>

#include <random>

namespace offgraph::text {
namespace {

using nlohmann::json;

const json kTools = json::parse(R"([
  {"type": "function", "function": {"name": "weather.get", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "zip": {"type": "string"},
    "opts": {"type": "object"}}}}},
  {"type": "function", "function": {"name": "calc.add", "parameters": {"type": "object", "properties": {
    "a": {"type": "number"}, "b": {"type": "number"}}}}}
])");

struct Case {
  const char *name;
  std::string stream;
  ChatMessage want;
};

std::vector<Case> cases() {
  std::vector<Case> c;
  c.push_back({"reasoning_then_answer",
               " to=self<|message|>Let me think: 6 x 7.<|eom|><|start|>assistant "
               "to=user<|message|>The answer is 42.<|eot|>",
               {"Let me think: 6 x 7.", "The answer is 42.", {}, true}});
  c.push_back(
      {"tool_call_with_typed_arguments",
       " to=self<|message|>Need the weather.<|eom|><|start|>assistant to=weather.get<|message|>"
       "<atem:function_calls>\n<atem:invoke name=\"weather.get\">\n"
       "<atem:parameter name=\"city\">Paris</atem:parameter>\n"
       "<atem:parameter name=\"days\">3</atem:parameter>\n"
       "<atem:parameter name=\"zip\">75001</atem:parameter>\n"
       "<atem:parameter name=\"opts\">{\"unit\": \"C\", \"hourly\": [1, 2], \"alerts\": "
       "true}</atem:parameter>\n"
       "</atem:invoke>\n</atem:function_calls><|eot|>",
       {"Need the weather.",
        "",
        {{"weather.get", json{{"city", "Paris"},
                              {"days", 3},
                              {"zip", "75001"},
                              {"opts", {{"unit", "C"}, {"hourly", {1, 2}}, {"alerts", true}}}}}},
        true}});
  c.push_back(
      {"parallel_calls",
       " to=calc.add<|message|><atem:function_calls>\n<atem:invoke name=\"calc.add\">\n"
       "<atem:parameter name=\"a\">1.5</atem:parameter>\n<atem:parameter "
       "name=\"b\">-2</atem:parameter>\n"
       "</atem:invoke>\n</atem:function_calls><|eom|><|start|>assistant to=weather.get<|message|>"
       "<atem:function_calls>\n<atem:invoke name=\"weather.get\">\n"
       "<atem:parameter name=\"city\">São "
       "Paulo</atem:parameter>\n</atem:invoke>\n</atem:function_calls><|eot|>",
       {"",
        "",
        {{"calc.add", json{{"a", 1.5}, {"b", -2}}}, {"weather.get", json{{"city", "São Paulo"}}}},
        true}});
  c.push_back({"answer_with_angle_brackets",
               " to=user<|message|>Use <b>bold</b>, a<|b|> c, x < y and <|eo a<|eot|>",
               {"", "Use <b>bold</b>, a<|b|> c, x < y and <|eo a", {}, true}});
  c.push_back(
      {"multiline_string_parameter",
       " to=weather.get<|message|><atem:function_calls>\n<atem:invoke name=\"weather.get\">\n"
       "<atem:parameter name=\"city\">line one\n\"quoted\" line two\n</atem:parameter>\n"
       "</atem:invoke>\n</atem:function_calls><|eot|>",
       {"", "", {{"weather.get", json{{"city", "line one\n\"quoted\" line two\n"}}}}, true}});
  c.push_back({"reasoning_without_closing_then_tool",
               " to=self<|message|>I should add them to=calc.add<|message|><atem:function_calls>\n"
               "<atem:invoke name=\"calc.add\">\n<atem:parameter name=\"a\">2</atem:parameter>\n"
               "<atem:parameter "
               "name=\"b\">3</atem:parameter>\n</atem:invoke>\n</atem:function_calls><|eot|>",
               {"I should add them ", "", {{"calc.add", json{{"a", 2}, {"b", 3}}}}, true}});
  c.push_back({"no_recipient_means_user",
               "<|message|>Plain answer.<|end_of_text|>",
               {"", "Plain answer.", {}, true}});
  c.push_back({"cut_off_by_max_tokens",
               " to=self<|message|>Thinking... to=us",
               {"Thinking... to=us", "", {}, false}});
  // Found by review: a stream cut right after the model opened its next message used to loop
  // forever; it ends with the header dropped.
  c.push_back({"cut_after_next_header",
               " to=self<|message|>t<|eom|><|start|>assistant",
               {"t", "", {}, false}});
  c.push_back({"long_text_after_header_opening",
               " to=self<|message|>t<|eom|><|start|>assistant" + std::string(300, 'x'),
               {"t", "assistant" + std::string(300, 'x'), {}, false}});
  // "to=NAME" glued to earlier text is not a header, whether it arrives in one piece or later.
  c.push_back({"glued_recipient_is_text",
               " to=user<|message|>abcto=fn.x<|message|>y<|eot|>",
               {"", "abcto=fn.xy", {}, true}});
  c.push_back({"text_without_protocol",
               "just words, no markers",
               {"", "just words, no markers", {}, false}});
  c.push_back({"unicode_and_emoji",
               " to=user<|message|>héllo 世界 🎉 to=nobody here<|eot|>",
               {"", "héllo 世界 🎉 to=nobody here", {}, true}});
  return c;
}

void expect_same(const ChatMessage &got, const ChatMessage &want, const std::string &where) {
  EXPECT_EQ(got.reasoning_content, want.reasoning_content) << where;
  EXPECT_EQ(got.content, want.content) << where;
  EXPECT_EQ(got.ended, want.ended) << where;
  ASSERT_EQ(got.tool_calls.size(), want.tool_calls.size()) << where;
  for (size_t i = 0; i < got.tool_calls.size(); ++i) {
    EXPECT_EQ(got.tool_calls[i].name, want.tool_calls[i].name) << where;
    EXPECT_EQ(got.tool_calls[i].arguments, want.tool_calls[i].arguments) << where;
  }
}

// Feeds `chunks` and checks the stream's invariants on the way.
ChatMessage run_chunks(const std::vector<std::string> &chunks, const std::string &where) {
  AtemParser p(kTools);
  std::string reasoning, content;
  size_t calls = 0;
  auto check = [&](const std::vector<ChatEvent> &events) {
    for (const ChatEvent &e : events) {
      for (const char *marker :
           {"<|eot|>", "<|eom|>", "<|start|>", "<|message|>", "<|end_of_text|>"})
        EXPECT_EQ(e.text.find(marker), std::string::npos) << where << ": delta carries " << marker;
      if (e.kind == ChatEvent::Kind::Reasoning) reasoning += e.text;
      if (e.kind == ChatEvent::Kind::Content) content += e.text;
      if (e.kind == ChatEvent::Kind::ToolCall) ++calls;
    }
    // Deltas are the aggregate: nothing emitted is ever taken back.
    EXPECT_EQ(reasoning, p.message().reasoning_content) << where;
    EXPECT_EQ(content, p.message().content) << where;
  };
  for (const std::string &c : chunks) check(p.feed(c));
  check(p.finish());
  EXPECT_EQ(calls, p.message().tool_calls.size()) << where;
  return p.message();
}

TEST(Atem, WholeStreams) {
  for (const Case &c : cases()) expect_same(parse_atem(c.stream, kTools), c.want, c.name);
}

TEST(Atem, SplitAtEveryBoundaryInTwo) {
  for (const Case &c : cases())
    for (size_t cut = 0; cut <= c.stream.size(); ++cut) {
      const std::string where = std::string(c.name) + " cut at " + std::to_string(cut);
      expect_same(run_chunks({c.stream.substr(0, cut), c.stream.substr(cut)}, where), c.want,
                  where);
      if (HasFailure()) return;
    }
}

TEST(Atem, ByteByByteAndRandomChunks) {
  std::mt19937_64 rng(3);
  for (const Case &c : cases()) {
    std::vector<std::string> bytes;
    for (char ch : c.stream) bytes.emplace_back(1, ch);
    expect_same(run_chunks(bytes, std::string(c.name) + " byte by byte"), c.want, c.name);
    for (int trial = 0; trial < 50; ++trial) {
      std::vector<std::string> chunks;
      for (size_t at = 0; at < c.stream.size();) {
        const size_t n = std::uniform_int_distribution<size_t>(1, 9)(rng);
        chunks.push_back(c.stream.substr(at, n));
        at += n;
      }
      expect_same(run_chunks(chunks, c.name), c.want, c.name);
    }
  }
}

TEST(Atem, EndOfTurnEventAndNothingAfter) {
  AtemParser p;
  auto ev = p.feed(" to=user<|message|>Done.<|eot|> trailing junk to=self<|message|>x");
  ASSERT_FALSE(ev.empty());
  EXPECT_EQ(ev.back().kind, ChatEvent::Kind::EndOfTurn);
  p.finish();
  EXPECT_EQ(p.message().content, "Done.");
  EXPECT_EQ(p.message().reasoning_content, "");
}

TEST(Atem, UnknownToolKeepsJsonLookingValuesAsJson) {
  auto m =
      parse_atem(" to=other<|message|><atem:function_calls>\n<atem:invoke name=\"other\">\n"
                 "<atem:parameter name=\"n\">12</atem:parameter>\n<atem:parameter name=\"s\">12 "
                 "apples</atem:parameter>\n"
                 "<atem:parameter "
                 "name=\"z\">null</atem:parameter>\n</atem:invoke>\n</atem:function_calls><|eot|>");
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].arguments, (json{{"n", 12}, {"s", "12 apples"}, {"z", nullptr}}));
}

} // namespace
} // namespace offgraph::text
