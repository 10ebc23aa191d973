// What fuzzing found, as readable tests (the raw inputs are replayed from fuzz/regressions/ by the
// fuzz.<target>.replay tests). Each names the target and the property it broke.
#include "text/atem/atem_parser.h"
#include "text/chat/chat_prompt.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace offgraph::text {
namespace {

// Feeds `text` in two pieces cut at `cut` and returns the message and every delta.
ChatMessage feed_cut(const std::string &text, size_t cut, std::vector<ChatEvent> &events) {
  AtemParser p;
  for (auto &e : p.feed(text.substr(0, cut))) events.push_back(e);
  for (auto &e : p.feed(text.substr(cut))) events.push_back(e);
  for (auto &e : p.finish()) events.push_back(e);
  return p.message();
}

// atem: a header without <|message|> that ends in a marker just inside the header length limit
// was text to the user when the stream was cut inside that marker, and nothing when it was not.
TEST(FuzzRegressions, AtemHeaderLengthDoesNotDependOnWhereTheStreamIsCut) {
  const std::string header = "assistant to=weather.get " + std::string(230, 'x');
  const std::string text = " to=self<|message|>hm<|eom|><|start|>" + header + "<|eot|>";
  const ChatMessage whole = parse_atem(text);
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    std::vector<ChatEvent> events;
    const ChatMessage split = feed_cut(text, cut, events);
    ASSERT_EQ(split.content, whole.content) << "cut at " << cut;
    ASSERT_EQ(split.reasoning_content, whole.reasoning_content) << "cut at " << cut;
    ASSERT_EQ(split.ended, whole.ended) << "cut at " << cut;
  }
}

// atem: text either side of a <|start|> (two messages to the user) was joined into one delta,
// which then read "<|message|>".
TEST(FuzzRegressions, AtemNoDeltaSpellsAMarkerAcrossMessages) {
  const std::string text = " to=calc.add<|<|start|>message|><atem:funct";
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    std::vector<ChatEvent> events;
    (void)feed_cut(text, cut, events);
    for (const ChatEvent &e : events)
      EXPECT_EQ(e.text.find("<|message|>"), std::string::npos)
          << "cut at " << cut << ": " << e.text;
  }
}

// atem (found while triaging a request-target finding of the same kind): a tool schema whose
// parameter type is a list (JSON Schema's ["string", "null"]) or whose parts have other types
// than expected made nlohmann's value() throw out of AtemParser::feed, in the server's output path.
TEST(FuzzRegressions, AtemToolSchemasOfAnyShapeNeverThrow) {
  const std::string call = " to=f<|message|><atem:function_calls>\n<atem:invoke name=\"f\">\n"
                           "<atem:parameter name=\"s\">42</atem:parameter>\n</atem:invoke>\n"
                           "</atem:function_calls><|eot|>";
  const auto tools = [](const char *schema) {
    return nlohmann::json::parse(std::string(R"([{"type": "function", "function": )") + schema +
                                 "}]");
  };
  ChatMessage m;
  ASSERT_NO_THROW(m = parse_atem(call, tools(R"({"name": "f", "parameters": {"properties":
                                             {"s": {"type": ["string", "null"]}}}})")));
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].arguments["s"], "42"); // a string may be null, still a string
  ASSERT_NO_THROW(m = parse_atem(call, tools(R"({"name": "f", "parameters": {"properties":
                                             {"s": {"type": ["integer", "null"]}}}})")));
  EXPECT_EQ(m.tool_calls[0].arguments["s"], 42);
  for (const char *odd : {R"({"name": 5})", R"({"name": "f", "parameters": "x"})",
                          R"({"name": "f", "parameters": {"properties": [1]}})",
                          R"({"name": "f", "parameters": {"properties": {"s": {"type": {}}}}})",
                          R"({"name": "f", "parameters": {"properties": {"s": 7}}})"})
    EXPECT_NO_THROW(parse_atem(call, tools(odd))) << odd;
  EXPECT_NO_THROW(parse_atem(call, nlohmann::json::parse(R"([1, "a", null, {"function": 3}])")));
}

// chat: a message whose role is not a string made tokenize_chat throw (nlohmann's value()).
TEST(FuzzRegressions, ChatRoleOfAnyTypeNeverThrows) {
  auto tok =
      Tokenizer::from_gguf(std::string(OFFGRAPH_LLAMA_TREE) + "/models/ggml-vocab-llama-bpe.gguf");
  if (!tok.ok()) GTEST_SKIP() << tok.message();
  auto tmpl = Template::parse("{% for m in messages %}{{ m.content }}{% endfor %}");
  ASSERT_TRUE(tmpl.ok());
  for (const char *role : {"5", "null", "[\"assistant\"]", "{\"a\": 1}"}) {
    const auto ctx = nlohmann::ordered_json::parse(std::string(R"({"messages": [{"role": )") +
                                                   role + R"(, "content": "hi"}]})");
    Result<ChatTokens> r = Status::error("not run");
    EXPECT_NO_THROW(r = tokenize_chat(**tok, *tmpl, ctx)) << role;
    EXPECT_TRUE(r.ok()) << role << ": " << r.message();
  }
}

} // namespace
} // namespace offgraph::text
