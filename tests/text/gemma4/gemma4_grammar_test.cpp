// The Gemma 4 turn grammar on the real Gemma 4 vocabulary (<turn|> and <|tool_response> are
// control tokens; <|tool_call>, <|channel> and <|"|> are user-defined, so text): what the
// template writes for a call the grammar allows, what the grammar allows Gemma4Parser reads back,
// and the schema's bounds, the call order and the markers hold.
#include "text/gemma4/gemma4_grammar.h"

#include "sample/grammar_matcher.h"
#include "text/chat/chat_format.h"
#include "text/gemma4/gemma4_parser.h"
#include "text/template/chat_template.h"

#include "../turn_grammar_harness.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

namespace offgraph::text {
namespace {

using ojson = nlohmann::ordered_json;

const testing::TurnGrammarHarness &harness() {
  static const testing::TurnGrammarHarness h("ggml-vocab-gemma-4.gguf", gemma4_turn_grammar);
  return h;
}
const Tokenizer &tokenizer() { return harness().tokenizer(); }
std::shared_ptr<const sample::CompiledGrammar> compile(const TurnSpec &spec) {
  return harness().compile(spec);
}

// Feeds `text` as the model writes it: the vocabulary's tokens, control ones included.
bool accept(sample::GrammarMatcher &m, std::string_view text) {
  for (int32_t id : tokenizer().encode(text, false, true))
    if (!m.accept_token(id)) return false;
  return true;
}
bool accepts(const std::shared_ptr<const sample::CompiledGrammar> &g, std::string_view text) {
  sample::GrammarMatcher m(g);
  return accept(m, text) && m.can_end();
}
bool refuses_prefix(const std::shared_ptr<const sample::CompiledGrammar> &g,
                    std::string_view text) {
  sample::GrammarMatcher m(g);
  return !accept(m, text);
}

ojson weather() {
  return ojson::parse(R"({"type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20},
                   "days": {"type": "integer", "minimum": 1, "maximum": 7},
                   "units": {"enum": ["c", "f"]},
                   "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
                   "where": {"type": "object", "properties": {"lat": {"type": "number"},
                             "ok": {"type": "boolean"}}, "required": ["lat", "ok"],
                             "additionalProperties": false},
                   "note": {"type": ["string", "null"]}},
    "required": ["city", "days", "units", "tags", "where", "note"],
    "additionalProperties": false})");
}

// The template's own rendering of a call (what a model trained on it writes).
std::string template_call(const std::string &name, const ojson &args) {
  std::ifstream in(std::string(OFFGRAPH_TEMPLATE_FIXTURES) + "/google-gemma-4-31B-it.jinja");
  std::stringstream ss;
  ss << in.rdbuf();
  ojson ctx = {
      {"bos_token", ""},
      {"messages",
       ojson::array({{{"role", "user"}, {"content", "go"}},
                     {{"role", "assistant"},
                      {"tool_calls",
                       ojson::array({{{"type", "function"},
                                      {"function", {{"name", name}, {"arguments", args}}}}})}}})}};
  auto out = render_chat_template(ss.str(), ctx);
  EXPECT_TRUE(out.ok()) << out.message();
  return out->substr(out->find("<|tool_call>"));
}

TEST(Gemma4Grammar, ThoughtIsFreeThenTheAnswerFollowsItsSchema) {
  TurnSpec spec;
  spec.content = TurnSpec::Content::kJsonSchema;
  spec.schema = ojson::parse(R"({"type": "object", "properties": {"n": {"type": "integer"}},
                                 "required": ["n"]})");
  auto g = compile(spec);
  EXPECT_TRUE(
      accepts(g, "<|channel>thought\nThink {about} \"it\" <b>.\n<channel|>{\"n\": 4}<turn|>"));
  EXPECT_TRUE(accepts(g, "{\"n\": -2}<turn|>")); // thinking may be skipped
  EXPECT_TRUE(refuses_prefix(g, "Sure!"));
  EXPECT_TRUE(refuses_prefix(g, "{\"n\": \"4\"}"));
  // The reasoning never spells a marker the parser reads.
  for (const char *marker : {"<turn|>", "<|tool_call>", "<tool_call|>", "<|channel>"})
    EXPECT_TRUE(refuses_prefix(g, std::string("<|channel>thought\na") + marker)) << marker;
  // Thinking off: the prompt closed the channel, so the turn opens none.
  spec.reasoning = false;
  auto off = compile(spec);
  EXPECT_TRUE(refuses_prefix(off, "<|channel>"));
  EXPECT_TRUE(accepts(off, "{\"n\": 1}<turn|>"));
}

TEST(Gemma4Grammar, StrictArgumentsAreWhatTheTemplateWritesAndTheParserReads) {
  TurnSpec spec;
  spec.answer = false; // tool_choice required
  spec.tools = {{"get_weather", weather(), true, {}}, {"free_tool", ojson::object(), false, {}}};
  auto g = compile(spec);
  const ojson args = ojson::parse(R"({"city": "Paris <centre>", "days": 3, "units": "c",
      "tags": ["a:b", "{x}"], "where": {"lat": 48.5, "ok": true}, "note": null})");
  const std::string call = template_call("get_weather", args);
  ASSERT_EQ(call.substr(call.size() - std::string("<|tool_response>").size()), "<|tool_response>");
  EXPECT_TRUE(accepts(g, call)) << call;
  EXPECT_TRUE(accepts(g, "<|channel>thought\nCall it.<channel|>" + call));
  const ChatMessage m = parse_gemma4(call);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].arguments, nlohmann::json::parse(args.dump()));
  const std::string open = "<|tool_call>call:get_weather{city:<|\"|>P<|\"|>,days:";
  EXPECT_TRUE(refuses_prefix(g, open + "8"));                           // out of range
  EXPECT_TRUE(refuses_prefix(g, "<|tool_call>call:get_weather{days:")); // not sorted
  EXPECT_TRUE(refuses_prefix(g, "Sure"));                               // a call is required
  EXPECT_TRUE(refuses_prefix(g, "<|tool_call>call:other{"));            // not a tool
  // A string holds '<' and braces, never its own closing mark's look-alikes or a marker.
  const std::string city = "<|tool_call>call:get_weather{city:<|\"|>a";
  EXPECT_FALSE(refuses_prefix(g, city + "<b> {c}"));
  for (const char *marker : {"<tool_call|>", "<turn|>", "<|channel>"})
    EXPECT_TRUE(refuses_prefix(g, city + marker)) << marker;
  // A tool that is not strict takes any mapping in the notation, and calls may follow each other.
  const std::string loose = template_call(
      "free_tool", ojson::parse(R"({"q": "x", "n": [1, 2.5, {"deep": null}], "b": false})"));
  const std::string both =
      loose.substr(0, loose.size() - std::string("<|tool_response>").size()) + call;
  EXPECT_TRUE(accepts(g, both)) << both;
  EXPECT_EQ(parse_gemma4(both).tool_calls.size(), 2u);
  // One call only (parallel_tool_calls false).
  spec.parallel_calls = false;
  auto single = compile(spec);
  EXPECT_TRUE(accepts(single, call));
  EXPECT_FALSE(accepts(single, both));
}

// Keys in the order Jinja's dictsort writes them (case folded), and markers spelled in ordinary
// bytes refused as well as the control tokens.
TEST(Gemma4Grammar, KeysFollowTheTemplatesCaseFoldedOrder) {
  const ojson params = ojson::parse(R"({"type": "object", "properties": {
      "maxResults": {"type": "integer"}, "B": {"type": "boolean"}, "a": {"type": "string"},
      "max_tokens": {"type": "integer"}},
    "required": ["maxResults", "B", "a", "max_tokens"], "additionalProperties": false})");
  TurnSpec spec;
  spec.answer = false;
  spec.tools = {{"f", params, true, {}}};
  auto g = compile(spec);
  const std::string call = template_call(
      "f", ojson::parse(R"({"maxResults": 1, "B": true, "a": "x", "max_tokens": 2})"));
  EXPECT_NE(call.find("{a:<|\"|>x<|\"|>,B:true,max_tokens:2,maxResults:1}"), std::string::npos)
      << call;
  EXPECT_TRUE(accepts(g, call)) << call;
  // <turn|> written as plain bytes (not the control token) inside a string is refused too.
  sample::GrammarMatcher m(g);
  ASSERT_TRUE(accept(m, "<|tool_call>call:f{a:<|\"|>x"));
  EXPECT_FALSE(m.accept_bytes("<turn|>"));
  EXPECT_FALSE(m.accept_bytes("<channel|>"));
  EXPECT_TRUE(m.accept_bytes("<b>|"));
}

TEST(Gemma4Grammar, RefusesWhatTheNotationCannotEnforceByName) {
  TurnSpec spec;
  spec.tools = {{"f",
                 ojson::parse(R"({"type": "object", "properties": {"a": {"oneOf": [
      {"type": "string"}, {"type": "integer"}]}}, "required": ["a"],
      "additionalProperties": false})"),
                 true,
                 {}}};
  auto g = gemma4_turn_grammar(tokenizer(), spec);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.message().find("tools[0].function.parameters"), std::string::npos) << g.message();
  EXPECT_NE(g.message().find("'oneOf'"), std::string::npos) << g.message();
  spec.tools[0].parameters = ojson::parse(R"({"type": "object", "properties": {"a":
      {"type": "string"}}, "required": [], "additionalProperties": false})");
  g = gemma4_turn_grammar(tokenizer(), spec);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.message().find("required"), std::string::npos) << g.message();
  spec.answer = false;
  spec.tools.clear();
  EXPECT_FALSE(gemma4_turn_grammar(tokenizer(), spec).ok());
}

TEST(Gemma4Grammar, TheFormatDispatchPicksIt) {
  TurnSpec spec;
  spec.content = TurnSpec::Content::kJsonObject;
  auto via_format = turn_grammar(ChatFormat::kGemma4, tokenizer(), spec);
  auto direct = gemma4_turn_grammar(tokenizer(), spec);
  ASSERT_TRUE(via_format.ok() && direct.ok());
  EXPECT_EQ(via_format->to_text(), direct->to_text());
}

} // namespace
} // namespace offgraph::text
