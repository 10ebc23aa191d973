#include "text/atem/atem_grammar.h"

#include "sample/grammar_exclude.h"
#include "sample/json_schema.h"
#include "text/atem/atem_parser.h"
#include <algorithm>

namespace offgraph::text {

namespace {

using sample::Element;
using sample::GrammarBuilder;
using sample::Sequence;
using ojson = nlohmann::ordered_json;

constexpr std::string_view kParamEnd = "</atem:parameter>";
// The fallback for raw argument text (raw_string_value): no '<' at all, where every marker the
// parser reads inside a call block (the parameter's end, an invoke, a chat marker) begins.
constexpr std::string_view kRawStop = "<";
// What a raw value under a caller's grammar must not spell: the tags the call parser reads
// (parse_function_calls: a parameter's end, an invoke's start and end) and the chat markers the
// message parser reads in text (AtemParser). Exact strings, not '<': code keeps its brackets.
const std::vector<std::string> kRawInputMarkers = [] {
  std::vector<std::string> out(atem::kCallTagPrefixes.begin(), atem::kCallTagPrefixes.end());
  out.insert(out.end(), atem::kChatMarkers.begin(), atem::kChatMarkers.end());
  return out;
}();

// Free text: bytes that never spell "<|", where every marker the ATEM parser reads in the text
// begins (it reads a marker written as ordinary tokens as the marker itself); no special token.
//   text ::= "" | [^<] text | "<" after-lt ;  after-lt ::= "" | "<" after-lt | [^<|] text
Element free_text(GrammarBuilder &b) {
  sample::ByteSet not_lt, neither;
  not_lt.set_range(0, 255);
  not_lt.bits['<' >> 6] &= ~(uint64_t(1) << ('<' & 63));
  neither = not_lt;
  neither.bits['|' >> 6] &= ~(uint64_t(1) << ('|' & 63));
  const uint32_t text = b.declare("text"), after_lt = b.declare("text-after-lt");
  b.define(text, {{},
                  {b.bytes(not_lt), GrammarBuilder::ref(text)},
                  {b.byte('<'), GrammarBuilder::ref(after_lt)}});
  b.define(after_lt, {{},
                      {b.byte('<'), GrammarBuilder::ref(after_lt)},
                      {b.bytes(neither), GrammarBuilder::ref(text)}});
  return GrammarBuilder::ref(text);
}

// The argument block of a strict tool: one element per property, in schema order. The server's
// parser keeps a property whose type admits strings as raw text (AtemParser), so such a value is
// written raw (a string); every other value is JSON.
Result<Sequence> strict_body(GrammarBuilder &b, const Tokenizer &t, const TurnSpec::Tool &tool,
                             const std::string &field, size_t &budget) {
  const ojson &params = tool.parameters;
  auto refuse = [&](const std::string &what) { return Status::error(field + ": " + what); };
  if (!params.is_object() || params.value("type", ojson()) != "object")
    return refuse("a strict tool's parameters must be a schema of type 'object'");
  sample::JsonSchemaCompiler compiler(b, params, {.strict = true, .escape_lt = true});
  // The whole schema is checked as strict mode requires, though the block writes only its
  // properties: additionalProperties false and every property required.
  if (auto whole = compiler.value(params, "#"); !whole.ok()) return refuse(whole.message());
  Sequence body = marked(b, t, "<atem:function_calls>\n<atem:invoke name=\"" + tool.name + "\">\n");
  if (params.contains("properties")) {
    for (const auto &[name, schema] : params["properties"].items()) {
      const std::string path = "#/properties/" + name;
      // The parser reads the name up to the next '"' and the tag up to the next '>'.
      if (name.find_first_of("\"<>") != std::string::npos || name.empty())
        return refuse("the property name at " + path +
                      " holds '\"', '<' or '>' (or is empty), which ATEM cannot write");
      Result<Element> value = Status::error("");
      if (tool.raw_input) {
        if (!accepts_string(schema) || params["properties"].size() != 1)
          return refuse("a tool with a raw input grammar has one string property");
        auto filtered = sample::exclude_substrings(*tool.raw_input, kRawInputMarkers);
        if (!filtered.ok()) return refuse("the input grammar: " + filtered.message());
        value = b.embed(*filtered);
      } else if (accepts_string(schema)) {
        ojson as_string = schema;
        as_string["type"] = "string";
        value = raw_string_value(b, compiler, params, as_string, path, budget, kRawInputMarkers,
                                 kRawStop);
      } else {
        value = compiler.value(schema, path);
      }
      if (!value.ok()) return refuse(value.message());
      body = join({body,
                   marked(b, t, "<atem:parameter name=\"" + name + "\">"),
                   {*value},
                   marked(b, t, std::string(kParamEnd) + "\n")});
    }
  }
  return join({body, marked(b, t, "</atem:invoke>\n</atem:function_calls>")});
}

} // namespace

Result<sample::Grammar> atem_turn_grammar(const Tokenizer &t, const TurnSpec &spec) {
  if (!spec.answer && spec.tools.empty())
    return Status::error("tool_choice: the turn must call a tool, and there are no tools");
  GrammarBuilder b;
  const Element text = free_text(b);
  const Sequence next_message = marked(b, t, "<|eom|><|start|>assistant");
  std::vector<Sequence> finals;
  std::optional<sample::JsonSchemaCompiler> answer_compiler;
  if (spec.answer) {
    auto content = answer_content(b, spec, text, answer_compiler);
    if (!content.ok()) return content.status();
    finals.push_back(
        join({marked(b, t, " to=user<|message|>"), {*content}, marked(b, t, "<|eot|>")}));
  }
  if (!spec.tools.empty()) {
    std::vector<Sequence> calls;
    size_t budget = kExcludedRulesPerTurn; // raw strings' marker-free products, all tools together
    for (size_t i = 0; i < spec.tools.size(); ++i) {
      const TurnSpec::Tool &tool = spec.tools[i];
      // The parser reads a recipient up to '<' or a space, and the invoke's name up to '"'.
      if (tool.name.empty() ||
          tool.name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                      "0123456789_.:-") != std::string::npos)
        return Status::error("tools[" + std::to_string(i) + "].function.name: '" + tool.name +
                             "' holds characters other than letters, digits, '_', '.', ':' and "
                             "'-', which a constrained ATEM call cannot write");
      // Not strict: the block is opened as the template writes it, then free text.
      Sequence body =
          join({marked(b, t, "<atem:function_calls>\n<atem:invoke name=\"" + tool.name + "\">\n"),
                {text}});
      if (tool.strict || tool.raw_input) {
        auto strict =
            strict_body(b, t, tool, "tools[" + std::to_string(i) + "].function.parameters", budget);
        if (!strict.ok()) return strict.status();
        body = std::move(strict).value();
      }
      calls.push_back(join({marked(b, t, " to=" + tool.name + "<|message|>"), body}));
    }
    const Element call = b.choice("call", std::move(calls));
    const Element more = *b.repeat("more-calls", join({next_message, {call}}), 0,
                                   spec.parallel_calls ? sample::kUnbounded : 0);
    finals.push_back(join({{call, more}, marked(b, t, "<|eot|>")}));
  }
  Sequence turn;
  if (spec.reasoning) {
    const Sequence reasoning = join({marked(b, t, " to=self<|message|>"), {text}, next_message});
    turn.push_back(*b.repeat("reasoning", reasoning, 0, sample::kUnbounded));
  }
  turn.push_back(b.choice("final", std::move(finals)));
  const Element root = b.rule("turn", {std::move(turn)});
  return std::move(b).finish(root.value);
}

Result<AtemWarmUp> atem_warm_up_turn(const Tokenizer &t) {
  TurnSpec spec;
  spec.content = TurnSpec::Content::kJsonObject;
  auto grammar = atem_turn_grammar(t, spec);
  if (!grammar.ok()) return grammar.status();
  AtemWarmUp out{std::move(grammar).value(), {}};
  const std::string turn =
      " to=self<|message|>The user asks for JSON: an object with a \"name\" (a string) and "
      "\"n\", a list of numbers like 1, -2.5 and 3e4.\n\nCheck: nothing else is needed. "
      "<|eom|><|start|>assistant to=user<|message|>"
      "{\"name\": \"caf\xC3\xA9 \\u003c\\\"q\\\"\", \"n\": [1, -2.5, 3e4], \"ok\": true}<|eot|>";
  // Spelled as marked() spells the grammar's literals: control tokens as themselves.
  for (int32_t id : t.encode(turn, false, true)) {
    if (t.is_control(id)) {
      out.symbols.push_back(256 + id);
      continue;
    }
    for (char c : t.decode({id})) out.symbols.push_back(int32_t(uint8_t(c)));
  }
  return out;
}

} // namespace offgraph::text
