// The ATEM turn grammar on a real vocabulary (llama-bpe, where the markers are text) and on one
// with the markers as special tokens: reasoning is free, the answer and strict tool arguments
// conform, and what the grammar lets a model write, the server's ATEM parser reads back.
#include "text/atem/atem_grammar.h"

#include "sample/grammar_matcher.h"
#include "sample/json_schema.h"
#include "text/atem/atem_parser.h"

#include "../turn_grammar_harness.h"

#include <gtest/gtest.h>

namespace offgraph::text {
namespace {

using ojson = nlohmann::ordered_json;

const testing::TurnGrammarHarness &harness() {
  static const testing::TurnGrammarHarness h("ggml-vocab-llama-bpe.gguf", atem_turn_grammar);
  return h;
}
const Tokenizer &tokenizer() { return harness().tokenizer(); }
std::shared_ptr<const sample::GrammarVocabulary> vocabulary() { return harness().vocabulary(); }
std::shared_ptr<const sample::CompiledGrammar> compile(const TurnSpec &spec) {
  return harness().compile(spec);
}

ojson weather() {
  return ojson::parse(R"({"type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20},
                   "days": {"type": "integer", "minimum": 1, "maximum": 7},
                   "units": {"enum": ["c", "f"]},
                   "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
                   "note": {"type": ["string", "null"]}},
    "required": ["city", "days", "units", "tags", "note"], "additionalProperties": false})");
}

TEST(AtemGrammar, ReasoningAllowsEveryOrdinaryToken) {
  TurnSpec spec;
  spec.content = TurnSpec::Content::kJsonObject;
  sample::GrammarMatcher m(compile(spec));
  ASSERT_TRUE(m.accept_bytes(" to=self<|message|>"));
  std::vector<uint64_t> bits;
  ASSERT_TRUE(m.fill_mask(bits).ok());
  const auto &texts = vocabulary()->texts();
  size_t ordinary = 0, allowed = 0;
  for (size_t t = 0; t < texts.bytes.size(); ++t) {
    const bool bit = (bits[t >> 6] >> (t & 63)) & 1;
    allowed += bit;
    if (texts.special[t] || texts.bytes[t].empty()) {
      EXPECT_FALSE(bit) << "special token " << t << " inside reasoning";
      continue;
    }
    ++ordinary;
    EXPECT_TRUE(bit) << "token " << t << " '" << texts.bytes[t] << "' refused inside reasoning";
  }
  EXPECT_EQ(allowed, ordinary);
  // Then the answer: JSON only, and the reasoning text may hold anything, braces included.
  ASSERT_TRUE(
      m.accept_bytes("let me think {about} \"it\"<|eom|><|start|>assistant to=user<|message|>"));
  EXPECT_FALSE(sample::GrammarMatcher(m).accept_bytes("Sure!"));
  ASSERT_TRUE(m.accept_bytes("{\"a\": [1, 2.5, \"x\"]}<|eot|>"));
  EXPECT_TRUE(m.can_end());
}

TEST(AtemGrammar, StrictToolArgumentsAreWhatTheParserReadsBack) {
  TurnSpec spec;
  spec.answer = false; // tool_choice required
  spec.tools = {{"get_weather", weather(), true, {}}, {"free_tool", ojson::object(), false, {}}};
  auto compiled = compile(spec);
  // As the template renders a call: strings raw, other values JSON.
  const std::string body = "<atem:function_calls>\n<atem:invoke name=\"get_weather\">\n"
                           "<atem:parameter name=\"city\">Paris centre</atem:parameter>\n"
                           "<atem:parameter name=\"days\">3</atem:parameter>\n"
                           "<atem:parameter name=\"units\">\"c\"</atem:parameter>\n"
                           "<atem:parameter name=\"tags\">[\"a\\u003cb\", \"b\"]</atem:parameter>\n"
                           "<atem:parameter name=\"note\">null</atem:parameter>\n"
                           "</atem:invoke>\n</atem:function_calls>";
  sample::GrammarMatcher m(compiled);
  ASSERT_TRUE(m.accept_bytes(" to=get_weather<|message|>" + body + "<|eot|>"));
  EXPECT_TRUE(m.can_end());
  AtemParser parser(nlohmann::json::parse(
      ojson::array({{{"type", "function"},
                     {"function", {{"name", "get_weather"}, {"parameters", weather()}}}}})
          .dump()));
  parser.feed(" to=get_weather<|message|>" + body + "<|eot|>");
  parser.finish();
  const auto &calls = parser.message().tool_calls;
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].arguments.dump(),
            R"({"city":"Paris centre","days":3,"note":"null","tags":["a<b","b"],"units":"c"})");
  // Out of range, a missing parameter, another order, an answer to the user: refused.
  for (const std::string &bad :
       {std::string(" to=get_weather<|message|><atem:function_calls>\n<atem:invoke "
                    "name=\"get_weather\">\n<atem:parameter name=\"city\">P</atem:parameter>\n"
                    "<atem:parameter name=\"days\">8"),
        std::string(" to=get_weather<|message|><atem:function_calls>\n<atem:invoke "
                    "name=\"get_weather\">\n<atem:parameter name=\"days\">"),
        std::string(" to=user<|message|>")}) {
    sample::GrammarMatcher fresh(compiled);
    EXPECT_FALSE(fresh.accept_bytes(bad)) << bad;
  }
  // A string parameter never holds its own closing tag.
  sample::GrammarMatcher tag(compiled);
  EXPECT_TRUE(
      tag.accept_bytes(" to=get_weather<|message|><atem:function_calls>\n<atem:invoke "
                       "name=\"get_weather\">\n<atem:parameter name=\"city\">a</atem:param"));
  EXPECT_FALSE(sample::GrammarMatcher(tag).accept_bytes("eter>x"));
  // '<' itself is fine (code, comparisons); a marker the parsers read is not.
  const std::string city = " to=get_weather<|message|><atem:function_calls>\n<atem:invoke "
                           "name=\"get_weather\">\n<atem:parameter name=\"city\">";
  EXPECT_TRUE(
      sample::GrammarMatcher(compiled).accept_bytes(city + "a<b> <a 1<2</atem:parameter>\n"));
  for (const char *marker : {"<|eot|>", "<atem:x", "<|start|>"})
    EXPECT_FALSE(sample::GrammarMatcher(compiled).accept_bytes(city + "a" + marker)) << marker;
  // A tool that is not strict writes freely, and several calls may follow one another.
  sample::GrammarMatcher free_call(compiled);
  const std::string open = "<atem:function_calls>\n<atem:invoke name=\"free_tool\">\n";
  EXPECT_TRUE(free_call.accept_bytes(
      " to=free_tool<|message|>" + open +
      "anything at all<|eom|><|start|>assistant to=free_tool<|message|>" + open + "x<|eot|>"));
  EXPECT_TRUE(free_call.can_end());
}

// What a server does at startup (server/structured.h): after the warm-up, a turn with a schema
// the vocabulary has never seen walks the trie for few of its tables, and its masks are those of
// tables made from nothing.
TEST(AtemGrammar, WarmUpMakesTheTablesAConstrainedTurnNeeds) {
  auto texts = grammar_token_texts(tokenizer());
  auto warmed = std::make_shared<sample::GrammarVocabulary>(texts);
  ASSERT_TRUE(sample::warm_json_tables(warmed, {.escape_lt = true}).ok());
  auto turn = atem_warm_up_turn(tokenizer());
  ASSERT_TRUE(turn.ok()) << turn.message();
  auto turn_grammar = sample::compile_grammar(turn->grammar, warmed, {});
  ASSERT_TRUE(turn_grammar.ok());
  ASSERT_TRUE(sample::warm_up(*turn_grammar, turn->symbols).ok());
  EXPECT_GT(warmed->shared_tables(), 10u);

  TurnSpec spec;
  spec.content = TurnSpec::Content::kJsonSchema;
  spec.schema = weather();
  auto grammar = atem_turn_grammar(tokenizer(), spec);
  ASSERT_TRUE(grammar.ok());
  const auto ends = tokenizer().end_of_generation_ids();
  auto warm = sample::compile_grammar(*grammar, warmed, ends);
  auto cold =
      sample::compile_grammar(*grammar, std::make_shared<sample::GrammarVocabulary>(texts), ends);
  ASSERT_TRUE(warm.ok() && cold.ok());
  const std::string answer =
      " to=self<|message|>Weather for Lyon, three days.<|eom|><|start|>assistant to=user"
      "<|message|>{\"city\": \"Lyon\", \"days\": 3, \"units\": \"c\", \"tags\": [\"sun\"], "
      "\"note\": null}<|eot|>";
  sample::GrammarMatcher a(*warm), b(*cold);
  std::vector<uint64_t> bits_a, bits_b;
  for (int32_t id : tokenizer().encode(answer, false, true)) {
    ASSERT_TRUE(a.fill_mask(bits_a).ok());
    ASSERT_TRUE(b.fill_mask(bits_b).ok());
    ASSERT_EQ(bits_a, bits_b) << "before token " << id;
    ASSERT_TRUE(a.accept_token(id)) << id;
    ASSERT_TRUE(b.accept_token(id));
  }
  const sample::GrammarCompileStats w = sample::compile_stats(**warm),
                                    c = sample::compile_stats(**cold);
  EXPECT_EQ(w.computed_tables, c.computed_tables);
  EXPECT_GT(w.shared_tables + w.refined_tables, 0u);
  // The plain strings ("tags", "note") were walked at the warm-up. On this vocabulary the markers
  // are text, so the reasoning's tables reach into the answer and are this grammar's own; with
  // the markers as special tokens (the real file) they are shared too (grammar_matcher_test).
  // The bounded "city" string has a table per length left, its own (sample/README.md).
  EXPECT_LT(w.trie_nodes_walked * 3, c.trie_nodes_walked * 2)
      << w.trie_nodes_walked << " trie nodes walked warm, " << c.trie_nodes_walked << " cold";
}

// A custom tool's input under its own grammar (a Lark grammar's, here a small patch language):
// raw, angle brackets included, never a marker the parsers read; read back whole.
TEST(AtemGrammar, ARawInputGrammarBindsTheCallAndReadsBackWhole) {
  sample::GrammarBuilder gb;
  sample::ByteSet line;
  line.set_range(0x20, 0x7E);
  auto body = *gb.repeat("line", {gb.bytes(line)}, 1, sample::kUnbounded);
  sample::Sequence patch = gb.literal("*** Begin\n");
  auto lines = *gb.repeat("lines", {gb.byte('+'), body, gb.byte('\n')}, 1, sample::kUnbounded);
  patch.push_back(lines);
  const sample::Sequence end = gb.literal("*** End");
  patch.insert(patch.end(), end.begin(), end.end());
  const sample::Element root = gb.rule("patch", {patch});
  sample::Grammar input = *std::move(gb).finish(root.value);

  const ojson params = ojson::parse(R"({"type": "object",
    "properties": {"input": {"type": "string"}}, "required": ["input"],
    "additionalProperties": false})");
  TurnSpec spec;
  spec.answer = false;
  spec.tools = {{"apply_patch", params, false, input}};
  auto compiled = compile(spec);
  const std::string open = " to=apply_patch<|message|><atem:function_calls>\n<atem:invoke "
                           "name=\"apply_patch\">\n<atem:parameter name=\"input\">";
  const std::string patch_text = "*** Begin\n+template <class T> a<b>;\n+x </atem y\n*** End";
  const std::string call =
      open + patch_text + "</atem:parameter>\n</atem:invoke>\n</atem:function_calls><|eot|>";
  sample::GrammarMatcher m(compiled);
  ASSERT_TRUE(m.accept_bytes(call));
  EXPECT_TRUE(m.can_end());
  AtemParser parser(nlohmann::json::parse(
      ojson::array(
          {{{"type", "function"}, {"function", {{"name", "apply_patch"}, {"parameters", params}}}}})
          .dump()));
  parser.feed(call);
  parser.finish();
  ASSERT_EQ(parser.message().tool_calls.size(), 1u);
  EXPECT_EQ(parser.message().tool_calls[0].arguments["input"], patch_text);
  // Outside the input's grammar, or spelling a marker inside it: refused.
  for (const std::string &bad : {open + "+x\n", open + "*** Begin\n+a </atem:parameter>",
                                 open + "*** Begin\n+a <|eot|>", open + "*** Begin\n+<atem:i"}) {
    sample::GrammarMatcher fresh(compiled);
    EXPECT_FALSE(fresh.accept_bytes(bad)) << bad;
  }
}

TEST(AtemGrammar, RefusalsNameTheField) {
  TurnSpec spec;
  spec.tools = {
      {"f", ojson::parse(R"({"type":"object","properties":{"a":{"type":"string"}}})"), true, {}}};
  auto g = atem_turn_grammar(tokenizer(), spec);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.message().rfind("tools[0].function.parameters: ", 0), 0u) << g.message();
  TurnSpec none;
  none.answer = false;
  EXPECT_FALSE(atem_turn_grammar(tokenizer(), none).ok());
  TurnSpec schema;
  schema.content = TurnSpec::Content::kJsonSchema;
  schema.schema = ojson::parse(R"({"type":"object","not":{}})");
  auto s = atem_turn_grammar(tokenizer(), schema);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("response_format.json_schema.schema: "), std::string::npos);
  EXPECT_NE(s.message().find("'not'"), std::string::npos) << s.message();
}

} // namespace
} // namespace offgraph::text
