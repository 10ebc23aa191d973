#include "text/gemma4/gemma4_grammar.h"

#include "sample/grammar_exclude.h"
#include "sample/json_schema.h"
#include "text/gemma4/gemma4_parser.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace offgraph::text {

namespace {

using sample::Element;
using sample::GrammarBuilder;
using sample::Sequence;
using ojson = nlohmann::ordered_json;

// OpenAI's limit on strict schemas' nesting.
constexpr int kMaxDepth = 10;

// What text must not spell: the markers the parser reads. Three begin with "<|" (so does a
// string's closing <|"|>), which is left out whole, as ATEM's free text does: exclude_substrings
// takes 63 bytes of markers at most, and the six spelled out are 67.
const std::vector<std::string> kTextMarkers = {"<|", std::string(gemma4::kChannelEnd),
                                               std::string(gemma4::kCallEnd),
                                               std::string(gemma4::kTurnEnd)};
// A string's content: the same (its closing mark begins with "<|").
const std::vector<std::string> &kStringMarkers = kTextMarkers;

// Any bytes, with `markers` taken out.
Result<Element> text_without(GrammarBuilder &b, std::span<const std::string> markers) {
  GrammarBuilder own;
  sample::ByteSet all;
  all.set_range(0, 255);
  const uint32_t text = own.declare("text");
  own.define(text, {{}, {own.bytes(all), GrammarBuilder::ref(text)}});
  auto g = std::move(own).finish(text);
  if (!g.ok()) return g.status();
  auto f = sample::exclude_substrings(*g, markers);
  if (!f.ok()) return f.status();
  return b.embed(*f);
}

// Gemma's notation for the arguments of a call: schema-driven (strict) or any mapping.
class Notation {
public:
  Notation(GrammarBuilder &b, const Tokenizer &t, const ojson &params, size_t &budget)
      : b_(b), t_(t), params_(params), json_(b, params, {.strict = true, .escape_lt = true}),
        budget_(budget) {}

  // <|"|>content<|"|>
  Sequence quoted(Element content) {
    return join({marked(b_, t_, gemma4::kQuote), {content}, marked(b_, t_, gemma4::kQuote)});
  }

  // Any value (a tool that is not strict): strings, numbers, literals, lists, mappings.
  Result<Element> any_mapping() {
    if (any_value_) return GrammarBuilder::ref(*any_mapping_);
    auto str = text_without(b_, kStringMarkers);
    if (!str.ok()) return str;
    // JSON's numbers are the notation's.
    auto num = json_.value(ojson{{"type", "number"}}, "#/number");
    if (!num.ok()) return num;
    any_value_ = b_.declare("gemma-value");
    any_mapping_ = b_.declare("gemma-mapping");
    const uint32_t list = b_.declare("gemma-list");
    sample::ByteSet key_byte;
    for (char c :
         std::string_view("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.$"))
      key_byte.set(uint8_t(c));
    auto key = b_.repeat("gemma-key", {b_.bytes(key_byte)}, 1, 128);
    if (!key.ok()) return key;
    const Element value = GrammarBuilder::ref(*any_value_);
    const Sequence entry = join({{*key}, b_.literal(":"), {value}});
    auto entries =
        b_.repeat("gemma-entries", join({b_.literal(","), entry}), 0, sample::kUnbounded);
    auto items = b_.repeat("gemma-items", join({b_.literal(","), {value}}), 0, sample::kUnbounded);
    if (!entries.ok()) return entries;
    if (!items.ok()) return items;
    b_.define(*any_mapping_,
              {b_.literal("{}"), join({b_.literal("{"), entry, {*entries}, b_.literal("}")})});
    b_.define(list,
              {b_.literal("[]"), join({b_.literal("["), {value}, {*items}, b_.literal("]")})});
    b_.define(*any_value_, {quoted(*str),
                            {*num},
                            b_.literal("true"),
                            b_.literal("false"),
                            {null_value()},
                            {GrammarBuilder::ref(list)},
                            {GrammarBuilder::ref(*any_mapping_)}});
    return GrammarBuilder::ref(*any_mapping_);
  }

  Result<Element> value(const ojson &schema, const std::string &path, int depth) {
    auto refuse = [&](const std::string &what) { return Status::error(what + " at " + path); };
    if (depth > kMaxDepth) return refuse("the schema nests deeper than 10 levels");
    if (!schema.is_object()) return refuse("a schema that is not an object");
    for (const char *k : {"$ref", "oneOf", "allOf", "not", "if", "patternProperties", "prefixItems",
                          "contains", "uniqueItems", "dependentSchemas"})
      if (schema.contains(k))
        return refuse(std::string("keyword '") + k +
                      "', which Gemma 4's call notation here cannot "
                      "enforce,");
    if (schema.contains("anyOf")) {
      const ojson &any = schema["anyOf"];
      if (!any.is_array() || any.empty()) return refuse("'anyOf' that is not a non-empty list");
      std::vector<Sequence> alternatives;
      for (size_t i = 0; i < any.size(); ++i) {
        auto v = value(any[i], path + "/anyOf/" + std::to_string(i), depth + 1);
        if (!v.ok()) return v;
        alternatives.push_back({*v});
      }
      return b_.choice(path, std::move(alternatives));
    }
    if (schema.contains("enum") || schema.contains("const")) {
      const ojson values =
          schema.contains("const") ? ojson::array({schema["const"]}) : schema["enum"];
      if (!values.is_array() || values.empty()) return refuse("an empty 'enum'");
      std::vector<Sequence> alternatives;
      for (const ojson &v : values) {
        auto spelled = literal(v, path);
        if (!spelled.ok()) return spelled.status();
        alternatives.push_back(std::move(spelled).value());
      }
      return b_.choice(path, std::move(alternatives));
    }
    if (!schema.contains("type")) return refuse("a schema without 'type'");
    const ojson &type = schema["type"];
    if (type.is_array()) {
      std::vector<Sequence> alternatives;
      for (const ojson &one : type) {
        ojson single = schema;
        single["type"] = one;
        auto v = value(single, path, depth + 1);
        if (!v.ok()) return v;
        alternatives.push_back({*v});
      }
      if (alternatives.empty()) return refuse("an empty 'type' list");
      return b_.choice(path, std::move(alternatives));
    }
    if (type == "string") {
      auto v = raw_string_value(b_, json_, params_, schema, path, budget_, kStringMarkers, "<");
      if (!v.ok()) return v;
      return b_.rule(path, {quoted(*v)});
    }
    if (type == "null") return null_value();
    if (type == "integer" || type == "number" || type == "boolean")
      return json_.value(schema, path); // JSON spells these as the notation does
    if (type == "array") return array(schema, path, depth);
    if (type == "object") return object(schema, path, depth);
    return refuse("type '" + type.dump() + "', which is not a JSON Schema type,");
  }

private:
  // JSON's null, or None as the template prints it (what a model trained on it writes).
  Element null_value() {
    if (!null_) null_ = b_.choice("gemma-null", {b_.literal("null"), b_.literal("None")});
    return *null_;
  }

  // A value of enum or const, spelled as the template's format_argument writes it.
  Result<Sequence> literal(const ojson &v, const std::string &path) {
    if (v.is_string()) {
      const std::string s = v.get<std::string>();
      for (const std::string &m : kStringMarkers)
        if (s.find(m) != std::string::npos)
          return Status::error("an enum value at " + path + " holds '" + m + "'");
      return quoted(b_.rule(path + "/enum-string", {b_.literal(s)}));
    }
    if (v.is_null()) return Sequence{null_value()};
    if (v.is_number() || v.is_boolean()) return b_.literal(v.dump());
    return Status::error("an enum value at " + path + " that is a list or an object");
  }

  Result<Element> array(const ojson &schema, const std::string &path, int depth) {
    Result<Element> item = Status::error("");
    if (schema.contains("items"))
      item = value(schema["items"], path + "/items", depth + 1);
    else
      item = Status::error("an array without 'items' at " + path);
    if (!item.ok()) return item;
    const auto bound = [&](const char *k, uint32_t fallback) -> Result<uint32_t> {
      if (!schema.contains(k)) return fallback;
      if (!schema[k].is_number_unsigned() || schema[k].get<uint64_t>() > 1000)
        return Status::error(std::string("'") + k + "' at " + path + " must be 0 to 1000");
      return uint32_t(schema[k].get<uint64_t>());
    };
    auto lo = bound("minItems", 0);
    auto hi = bound("maxItems", sample::kUnbounded);
    if (!lo.ok()) return lo.status();
    if (!hi.ok()) return hi.status();
    if (*hi < *lo) return Status::error("'maxItems' below 'minItems' at " + path);
    std::vector<Sequence> alternatives;
    if (*lo == 0) alternatives.push_back(b_.literal("[]"));
    if (*hi > 0) {
      auto rest =
          b_.repeat(path + "/items-rest", join({b_.literal(","), {*item}}), *lo > 0 ? *lo - 1 : 0,
                    *hi == sample::kUnbounded ? sample::kUnbounded : *hi - 1);
      if (!rest.ok()) return rest;
      alternatives.push_back(join({b_.literal("["), {*item}, {*rest}, b_.literal("]")}));
    }
    return b_.choice(path, std::move(alternatives));
  }

  Result<Element> object(const ojson &schema, const std::string &path, int depth) {
    auto refuse = [&](const std::string &what) { return Status::error(what + " at " + path); };
    if (schema.value("additionalProperties", ojson(true)) != false)
      return refuse("a strict object must say additionalProperties: false; it does not");
    const ojson props = schema.value("properties", ojson::object());
    if (!props.is_object()) return refuse("'properties' that is not an object");
    // dictsort: the template writes keys sorted without regard to case (Jinja's default; stable,
    // so "a" and "A" keep the schema's order), and so the model does. ASCII letters only are
    // folded: Python lowers every script.
    std::vector<std::pair<std::string, const ojson *>> sorted;
    for (const auto &[k, v] : props.items()) sorted.emplace_back(k, &v);
    const auto folded = [](const std::string &k) {
      std::string out = k;
      for (char &c : out)
        if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
      return out;
    };
    std::stable_sort(sorted.begin(), sorted.end(), [&](const auto &x, const auto &y) {
      return folded(x.first) < folded(y.first);
    });
    const ojson required = schema.value("required", ojson::array());
    for (const auto &[k, v] : sorted) {
      if (std::find(required.begin(), required.end(), k) == required.end())
        return refuse("a strict object must list every property in 'required'; '" + k + "' is not");
      if (k.empty() || k.find_first_of(":{}[],<\"' \n\t") != std::string::npos)
        return refuse("the property name '" + k + "' holds a character Gemma 4's bare keys cannot");
    }
    Sequence body = b_.literal("{");
    bool first = true;
    for (const auto &[k, v] : sorted) {
      auto val = value(*v, path + "/properties/" + k, depth + 1);
      if (!val.ok()) return val;
      body = join({body, b_.literal((first ? "" : ",") + k + ":"), {*val}});
      first = false;
    }
    body = join({body, b_.literal("}")});
    return b_.rule(path, {body});
  }

  GrammarBuilder &b_;
  const Tokenizer &t_;
  const ojson &params_;
  sample::JsonSchemaCompiler json_;
  size_t &budget_;
  std::optional<uint32_t> any_value_, any_mapping_;
  std::optional<Element> null_;
};

// A call's "{...}": the strict schema's mapping, a custom tool's one raw string, or any mapping.
Result<Element> call_arguments(GrammarBuilder &b, const Tokenizer &t, const TurnSpec::Tool &tool,
                               const std::string &field, size_t &budget,
                               std::optional<Notation> &loose) {
  const ojson &params = tool.parameters;
  auto refuse = [&](const std::string &what) { return Status::error(field + ": " + what); };
  if (!tool.strict && !tool.raw_input) {
    if (!loose) loose.emplace(b, t, params, budget);
    return loose->any_mapping();
  }
  if (!params.is_object() || params.value("type", ojson()) != "object")
    return refuse("a strict tool's parameters must be a schema of type 'object'");
  if (tool.raw_input) {
    const ojson props = params.value("properties", ojson::object());
    if (props.size() != 1 || !accepts_string(props.begin().value()))
      return refuse("a tool with a raw input grammar has one string property");
    const std::string key = props.begin().key();
    auto filtered = sample::exclude_substrings(*tool.raw_input, kStringMarkers);
    if (!filtered.ok()) return refuse("the input grammar: " + filtered.message());
    Notation n(b, t, params, budget);
    return b.rule(
        field, {join({b.literal("{" + key + ":"), n.quoted(b.embed(*filtered)), b.literal("}")})});
  }
  Notation n(b, t, params, budget);
  auto v = n.value(params, "#", 0);
  if (!v.ok()) return refuse(v.message());
  return v;
}

} // namespace

Result<sample::Grammar> gemma4_turn_grammar(const Tokenizer &t, const TurnSpec &spec) {
  if (!spec.answer && spec.tools.empty())
    return Status::error("tool_choice: the turn must call a tool, and there are no tools");
  GrammarBuilder b;
  auto text = text_without(b, kTextMarkers);
  if (!text.ok()) return text.status();
  std::vector<Sequence> finals;
  std::optional<sample::JsonSchemaCompiler> answer_compiler;
  if (spec.answer) {
    auto content = answer_content(b, spec, *text, answer_compiler);
    if (!content.ok()) return content.status();
    finals.push_back(join({{*content}, marked(b, t, gemma4::kTurnEnd)}));
  }
  if (!spec.tools.empty()) {
    std::vector<Sequence> calls;
    size_t budget = kExcludedRulesPerTurn;
    std::optional<Notation> loose;
    for (size_t i = 0; i < spec.tools.size(); ++i) {
      const TurnSpec::Tool &tool = spec.tools[i];
      const std::string field = "tools[" + std::to_string(i) + "].function";
      // The parser reads the name up to '{'.
      if (tool.name.empty() || tool.name.find_first_of("{<") != std::string::npos)
        return Status::error(field + ".name: '" + tool.name +
                             "' is empty or holds '{' or '<', which a Gemma 4 call cannot write");
      auto args = call_arguments(b, t, tool, field + ".parameters", budget, loose);
      if (!args.ok()) return args.status();
      calls.push_back(join({marked(b, t, std::string(gemma4::kCall) + "call:" + tool.name),
                            {*args},
                            marked(b, t, gemma4::kCallEnd)}));
    }
    const Element call = b.choice("call", std::move(calls));
    auto more = b.repeat("more-calls", {call}, 0, spec.parallel_calls ? sample::kUnbounded : 0);
    if (!more.ok()) return more.status();
    finals.push_back(join({{call, *more}, marked(b, t, gemma4::kAwaitResponse)}));
  }
  Sequence turn;
  if (spec.reasoning)
    turn.push_back(
        b.optional("thought", join({marked(b, t, std::string(gemma4::kChannel) + "thought\n"),
                                    {*text},
                                    marked(b, t, gemma4::kChannelEnd)})));
  turn.push_back(b.choice("final", std::move(finals)));
  const Element root = b.rule("turn", {std::move(turn)});
  return std::move(b).finish(root.value);
}

} // namespace offgraph::text
