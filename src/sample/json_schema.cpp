// JSON Schema to Grammar: structure ($ref, anyOf, enum, types, objects, arrays) and the limits.
// Numbers are in json_schema_numbers.cpp, strings (patterns, formats, raw text) in
// json_schema_strings.cpp and json_schema_regex.cpp.
#include "sample/json_schema.h"

#include "sample/json_schema_internal.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <set>

namespace offgraph::sample {
namespace json_schema_detail {
namespace {

constexpr int kMaxDepth = 100; // subschemas within subschemas, through $ref and anyOf

// Keywords with no effect on validation: ignored ($id only at the root, where it changes no $ref).
constexpr std::array<std::string_view, 12> kAnnotations = {
    "title",     "description",     "examples",         "default",
    "$schema",   "$comment",        "deprecated",       "readOnly",
    "writeOnly", "contentEncoding", "contentMediaType", "contentSchema"};
constexpr std::array<std::string_view, 25> kSupported = {
    // any value
    "type", "enum", "const", "anyOf", "allOf", "$ref", "$defs", "definitions",
    // objects and arrays
    "properties", "required", "additionalProperties", "items", "prefixItems", "minItems",
    "maxItems", "uniqueItems",
    // strings
    "minLength", "maxLength", "pattern", "format",
    // numbers
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"};

template <size_t N> bool one_of(const std::array<std::string_view, N> &list, std::string_view k) {
  return std::find(list.begin(), list.end(), k) != list.end();
}
} // namespace

bool is_annotation(std::string_view k) { return one_of(kAnnotations, k); }

Status check_keywords(const Json &schema, const std::string &path, bool is_root) {
  for (const auto &[key, v] : schema.items()) {
    if (is_annotation(key) || one_of(kSupported, key)) continue;
    if (key == "$id" && is_root) continue;
    return error("keyword '" + key + "' at " + path + " is not supported");
  }
  for (const char *defs : {"$defs", "definitions"})
    if (const Json *d = find(schema, defs); d && !d->is_object())
      return error("'" + std::string(defs) + "' at " + path + " must be an object");
  return ok_status();
}

// Only annotations and definitions may stand beside `keyword`: other keywords would have to hold
// at the same time, and an intersection of grammars is not a grammar.
Status check_alone(const Json &schema, const std::string &path, const char *keyword) {
  for (const auto &[key, v] : schema.items())
    if (key != keyword && !is_annotation(key) && !is_definitions(key) && key != "$id")
      return error("keyword '" + key + "' at " + path + " alongside '" + keyword +
                   "' is not supported");
  return ok_status();
}

// A 2020-12 "integer" is any number with no fraction (1.0 too), as Python's jsonschema checks.
bool has_type(const Json &v, std::string_view type) {
  if (type == "null") return v.is_null();
  if (type == "boolean") return v.is_boolean();
  if (type == "string") return v.is_string();
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  if (type == "number") return v.is_number();
  if (type == "integer")
    return v.is_number_integer() || (v.is_number_float() && std::isfinite(v.get<double>()) &&
                                     std::floor(v.get<double>()) == v.get<double>());
  return false;
}

constexpr std::array<std::string_view, 7> kTypes = {"null",   "boolean", "object", "array",
                                                    "string", "number",  "integer"};

// The types `schema` allows; "integer" is dropped where "number" is there (it adds nothing).
Result<std::vector<std::string>> allowed_types(const Json &schema, const std::string &path) {
  const Json *t = find(schema, "type");
  std::vector<std::string> out;
  if (!t) {
    out.assign(kTypes.begin(), kTypes.end() - 1);
    return out;
  }
  std::vector<const Json *> names;
  if (t->is_string())
    names.push_back(t);
  else if (t->is_array() && !t->empty())
    for (const Json &n : *t) names.push_back(&n);
  else
    return error("'type' at " + path + " must be a type name or a non-empty array of them");
  for (const Json *n : names) {
    if (!n->is_string() || !one_of(kTypes, n->get<std::string>()))
      return error("'type' at " + path + " names " +
                   n->dump(-1, ' ', true, Json::error_handler_t::replace) +
                   ", which is not a JSON Schema type");
    if (std::find(out.begin(), out.end(), n->get<std::string>()) == out.end())
      out.push_back(n->get<std::string>());
  }
  if (std::find(out.begin(), out.end(), "number") != out.end())
    out.erase(std::remove(out.begin(), out.end(), "integer"), out.end());
  return out;
}

// A non-negative integer keyword (minItems, ...); nullopt when absent. 2.0 counts as 2.
Result<std::optional<uint64_t>> count_keyword(const Json &schema, const char *key,
                                              const std::string &path) {
  const Json *v = find(schema, key);
  if (!v) return std::optional<uint64_t>();
  if (v->is_number_unsigned()) return std::optional<uint64_t>(v->get<uint64_t>());
  if (v->is_number_integer() && v->get<int64_t>() >= 0)
    return std::optional<uint64_t>(uint64_t(v->get<int64_t>()));
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (d >= 0 && std::floor(d) == d && d < 1.8e19) return std::optional<uint64_t>(uint64_t(d));
  }
  return error("'" + std::string(key) + "' at " + path + " must be a non-negative integer");
}

namespace {

// JSON pointer fragment ("#/a/b~1c") to reference tokens; nullopt if malformed.
std::optional<std::vector<std::string>> pointer_tokens(std::string_view ref) {
  if (ref.empty() || ref[0] != '#') return std::nullopt;
  std::string decoded; // percent-decoding first: the fragment is a URI fragment
  for (size_t i = 1; i < ref.size(); ++i) {
    if (ref[i] != '%') {
      decoded += ref[i];
      continue;
    }
    auto hex = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      return -1;
    };
    if (i + 2 >= ref.size()) return std::nullopt;
    const int hi = hex(ref[i + 1]), lo = hex(ref[i + 2]);
    if (hi < 0 || lo < 0) return std::nullopt;
    decoded += char(hi * 16 + lo);
    i += 2;
  }
  std::vector<std::string> tokens;
  if (decoded.empty()) return tokens;
  if (decoded[0] != '/') return std::nullopt;
  size_t start = 1;
  while (true) {
    const size_t end = std::min(decoded.find('/', start), decoded.size());
    std::string token;
    for (size_t i = start; i < end; ++i) {
      if (decoded[i] != '~') {
        token += decoded[i];
      } else if (i + 1 < end && (decoded[i + 1] == '0' || decoded[i + 1] == '1')) {
        token += decoded[i + 1] == '0' ? '~' : '/';
        ++i;
      } else {
        return std::nullopt;
      }
    }
    tokens.push_back(std::move(token));
    if (end == decoded.size()) break;
    start = end + 1;
  }
  return tokens;
}

// ---- limits ----

struct Counts {
  uint64_t properties = 0, enum_values = 0, chars = 0;
};

uint64_t code_points(std::string_view s) {
  uint64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

constexpr uint64_t kMaxProperties = 5000, kMaxEnumValues = 1000, kMaxChars = 120000;
constexpr uint64_t kLargeEnum = 250, kMaxLargeEnumChars = 15000;
constexpr int kMaxNesting = 10;

Status walk_limits(const Json &s, const std::string &path, int nesting, int depth, Counts &c) {
  if (!s.is_object()) return ok_status();
  if (depth > kMaxDepth)
    return error("the schema at " + path + " nests more than " + std::to_string(kMaxDepth) +
                 " subschemas deep");
  if (nesting > kMaxNesting)
    return error("the schema nests " + std::to_string(nesting) + " levels deep at " + path +
                 "; the limit is " + std::to_string(kMaxNesting));
  for (const auto &[key, v] : s.items()) {
    const std::string here = child(path, key);
    if (key == "properties" && v.is_object()) {
      c.properties += v.size();
      for (const auto &[name, sub] : v.items()) {
        c.chars += code_points(name);
        OFFGRAPH_TRY(walk_limits(sub, child(here, name), nesting + 1, depth + 1, c));
      }
    } else if (is_definitions(key) && v.is_object()) {
      for (const auto &[name, sub] : v.items()) {
        c.chars += code_points(name);
        OFFGRAPH_TRY(walk_limits(sub, child(here, name), 0, depth + 1, c));
      }
    } else if (key == "enum" && v.is_array()) {
      c.enum_values += v.size();
      uint64_t strings = 0, chars = 0;
      for (const Json &e : v)
        if (e.is_string()) ++strings, chars += code_points(e.get_ref<const std::string &>());
      c.chars += chars;
      if (strings > kLargeEnum && chars > kMaxLargeEnumChars)
        return error("'enum' at " + path + " has " + with_commas(strings) +
                     " string values totalling " + with_commas(chars) +
                     " characters; the limit is " + with_commas(kMaxLargeEnumChars) +
                     " for an enum of more than " + with_commas(kLargeEnum) + " strings");
    } else if (key == "const" && v.is_string()) {
      c.chars += code_points(v.get_ref<const std::string &>());
    } else if (key == "items" || key == "additionalProperties") {
      OFFGRAPH_TRY(walk_limits(v, here, nesting + 1, depth + 1, c));
    } else if (key == "prefixItems" && v.is_array()) {
      for (size_t i = 0; i < v.size(); ++i)
        OFFGRAPH_TRY(walk_limits(v[i], child(here, std::to_string(i)), nesting + 1, depth + 1, c));
    } else if ((key == "anyOf" || key == "allOf") && v.is_array()) {
      for (size_t i = 0; i < v.size(); ++i)
        OFFGRAPH_TRY(walk_limits(v[i], child(here, std::to_string(i)), nesting, depth + 1, c));
    }
  }
  return ok_status();
}

} // namespace

Status check_limits(const Json &root) {
  Counts c;
  OFFGRAPH_TRY(walk_limits(root, "#", 0, 0, c));
  if (c.properties > kMaxProperties)
    return error("the schema has " + with_commas(c.properties) + " properties; the limit is " +
                 with_commas(kMaxProperties));
  if (c.enum_values > kMaxEnumValues)
    return error("the schema has " + with_commas(c.enum_values) + " enum values; the limit is " +
                 with_commas(kMaxEnumValues));
  if (c.chars > kMaxChars)
    return error("the schema's property names, definition names, enum values and const values "
                 "total " +
                 with_commas(c.chars) + " characters; the limit is " + with_commas(kMaxChars));
  return ok_status();
}

Compiler::Compiler(GrammarBuilder &builder, const Json &root, JsonSchemaOptions options,
                   int scratch_depth)
    : b(builder), root_(root), options_(options), scratch_depth_(scratch_depth) {
  if (scratch_depth == 0) limits_ = check_limits(root);
}

Element Compiler::ws() {
  if (auto it = cache_.find("ws"); it != cache_.end()) return it->second;
  ByteSet blank;
  blank.set(' ');
  blank.set('\t');
  Element indent = *b.repeat("indent", {b.bytes(blank)}, 0, 20);
  Element e = b.choice("ws", {{}, {b.byte(' ')}, {b.byte('\n'), indent}});
  cache_.emplace("ws", e);
  return e;
}

Sequence Compiler::comma() { return {ws(), b.byte(','), ws()}; }
Sequence Compiler::colon() { return {ws(), b.byte(':'), ws()}; }

Element Compiler::any_string() {
  if (auto it = cache_.find("string"); it != cache_.end()) return it->second;
  Element e = b.rule("string", {{b.byte('"'), json_chars(), b.byte('"')}});
  cache_.emplace("string", e);
  return e;
}

Element Compiler::any_value() {
  if (auto it = cache_.find("value"); it != cache_.end()) return it->second;
  const uint32_t value = b.declare("value");
  cache_.emplace("value", GrammarBuilder::ref(value));
  const Element v = GrammarBuilder::ref(value);
  Sequence more = comma();
  more.push_back(v);
  Element items = *b.repeat("array-items", more, 0, kUnbounded);
  Element array = b.choice("array", {{b.byte('['), ws(), b.byte(']')},
                                     {b.byte('['), ws(), v, items, ws(), b.byte(']')}});
  auto boolean = b.literal("true");
  b.define(value, {{any_object()},
                   {array},
                   {any_string()},
                   {any_number()},
                   boolean,
                   b.literal("false"),
                   b.literal("null")});
  return v;
}

Element Compiler::any_object() {
  if (auto it = cache_.find("object"); it != cache_.end()) return it->second;
  const uint32_t object = b.declare("object");
  cache_.emplace("object", GrammarBuilder::ref(object));
  Sequence member = {any_string()};
  for (Element e : colon()) member.push_back(e);
  member.push_back(any_value());
  Sequence more = comma();
  more.insert(more.end(), member.begin(), member.end());
  Element members = *b.repeat("object-members", more, 0, kUnbounded);
  Sequence full = {b.byte('{'), ws()};
  full.insert(full.end(), member.begin(), member.end());
  full.insert(full.end(), {members, ws(), b.byte('}')});
  b.define(object, {{b.byte('{'), ws(), b.byte('}')}, full});
  return GrammarBuilder::ref(object);
}

Result<Element> Compiler::repeat(const std::string &name, const Sequence &item, uint64_t min,
                                 uint64_t max) {
  constexpr uint64_t B = kMaxRepeatBound;
  if (max == kUnbounded) {
    if (min <= B) return b.repeat(name, item, uint32_t(min), kUnbounded);
    auto head = repeat(name, item, min, min);
    if (!head) return head;
    auto tail = b.repeat(name, item, 0, kUnbounded);
    if (!tail) return tail;
    return b.rule(name, {{*head, *tail}});
  }
  if (min > max || max >= kUnbounded) return error("bad repetition bounds for " + name);
  if (max <= B) {
    if (max == 0) return b.choice(name, {{}});
    return b.repeat(name, item, uint32_t(min), uint32_t(max));
  }
  // Past the builder's bound: whole blocks of B, then the rest, split so each length has one
  // parse (an ambiguous repetition would cost the matcher for nothing).
  auto block = b.repeat(name, item, uint32_t(B), uint32_t(B));
  if (!block) return block;
  if (min == max) {
    auto blocks = repeat(name, {*block}, min / B, min / B);
    if (!blocks) return blocks;
    auto rest = repeat(name, item, min % B, min % B);
    if (!rest) return rest;
    return b.rule(name, {{*blocks, *rest}});
  }
  if (min > 0) {
    auto head = repeat(name, item, min, min);
    if (!head) return head;
    auto tail = repeat(name, item, 0, max - min);
    if (!tail) return tail;
    return b.rule(name, {{*head, *tail}});
  }
  const uint64_t q = max / B, r = max % B;
  auto fewer = repeat(name, {*block}, 0, q - 1);
  auto partial = b.repeat(name, item, 0, uint32_t(B - 1));
  auto all = repeat(name, {*block}, q, q);
  auto last = repeat(name, item, 0, r);
  for (auto *p : {&fewer, &partial, &all, &last})
    if (!*p) return *p;
  return b.choice(name, {{*fewer, *partial}, {*all, *last}});
}

Result<Element> Compiler::value(const Json &schema, const std::string &path, int depth) {
  if (&schema == &root_) return root_ref(&root_, "#", depth);
  return dispatch(schema, path, depth);
}

Result<Element> Compiler::dispatch(const Json &schema, const std::string &path, int depth) {
  if (depth > kMaxDepth)
    return error("the schema at " + path + " nests more than " + std::to_string(kMaxDepth) +
                 " subschemas deep");
  if (schema.is_boolean()) {
    if (schema.get<bool>()) return any_value();
    return error("the schema at " + path + " is false, which accepts no value");
  }
  if (!schema.is_object())
    return error("the schema at " + path + " must be an object or a boolean");
  OFFGRAPH_TRY(check_keywords(schema, path, &schema == &root_));
  if (schema.contains("$ref")) return ref_value(schema, path, depth);
  if (schema.contains("anyOf")) return any_of_value(schema, path, depth);
  if (const Json *all = find(schema, "allOf")) {
    OFFGRAPH_TRY(check_alone(schema, path, "allOf"));
    if (!all->is_array() || all->size() != 1)
      return error("keyword 'allOf' at " + path + " is supported only with one subschema");
    return value((*all)[0], child(child(path, "allOf"), "0"), depth + 1);
  }
  if (schema.contains("enum") || schema.contains("const")) return enum_value(schema, path, depth);
  return typed_value(schema, path, depth);
}

Result<std::pair<const Json *, std::string>> Compiler::resolve_ref(const Json &schema,
                                                                   const std::string &path) {
  const Json &ref = schema["$ref"];
  if (!ref.is_string()) return error("'$ref' at " + path + " must be a string");
  const std::string &text = ref.get_ref<const std::string &>();
  auto tokens = pointer_tokens(text);
  if (!tokens)
    return error("'$ref' at " + path + " is '" + text +
                 "'; only JSON pointers within the schema ('#', '#/$defs/name') are supported");
  const Json *at = &root_;
  std::string key = "#";
  for (const std::string &t : *tokens) {
    key = child(key, t);
    if (at->is_object() && at->contains(t)) {
      at = &(*at)[t];
    } else if (at->is_array() && !t.empty() && t.size() < 10 &&
               std::all_of(t.begin(), t.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
               (t == "0" || t[0] != '0') && std::stoul(t) < at->size()) {
      at = &(*at)[std::stoul(t)];
    } else {
      return error("'$ref' at " + path + " refers to '" + text + "', which does not exist");
    }
  }
  if (!at->is_object() && !at->is_boolean())
    return error("'$ref' at " + path + " refers to '" + text + "', which is not a schema");
  return std::make_pair(at, key);
}

Result<Element> Compiler::ref_value(const Json &schema, const std::string &path, int depth) {
  OFFGRAPH_TRY(check_alone(schema, path, "$ref"));
  auto target = resolve_ref(schema, path);
  if (!target) return target.status();
  const std::string &key = target->second;
  // Left recursion: the target leads back, through $ref and anyOf alone, to a target still
  // waiting for its first byte.
  std::vector<std::string> stack = {key};
  std::set<std::string> seen;
  while (!stack.empty()) {
    std::string at = std::move(stack.back());
    stack.pop_back();
    if (!seen.insert(at).second) continue;
    if (std::find(leading_.begin(), leading_.end(), at) != leading_.end())
      return error("'$ref' at " + path + " refers back to '" + at +
                   "' without consuming anything (left recursion)");
    if (auto it = leading_edges_.find(at); it != leading_edges_.end())
      stack.insert(stack.end(), it->second.begin(), it->second.end());
  }
  if (!leading_.empty()) leading_edges_[leading_.back()].push_back(key);
  return root_ref(target->first, key, depth);
}

Result<Element> Compiler::root_ref(const Json *target, const std::string &key, int depth) {
  if (auto it = refs_.find(key); it != refs_.end()) return GrammarBuilder::ref(it->second);
  const uint32_t rule = b.declare(key);
  refs_.emplace(key, rule);
  leading_.push_back(key);
  Result<Element> v = dispatch(*target, key, depth + 1);
  leading_.pop_back();
  if (!v) return v;
  b.define(rule, {{*v}});
  return GrammarBuilder::ref(rule);
}

Result<Element> Compiler::any_of_value(const Json &schema, const std::string &path, int depth) {
  OFFGRAPH_TRY(check_alone(schema, path, "anyOf"));
  const Json &branches = schema["anyOf"];
  if (!branches.is_array() || branches.empty())
    return error("'anyOf' at " + path + " must be a non-empty array");
  std::vector<Sequence> alternatives;
  for (size_t i = 0; i < branches.size(); ++i) {
    if (branches[i].is_boolean() && !branches[i].get<bool>()) continue;
    auto v = value(branches[i], child(child(path, "anyOf"), std::to_string(i)), depth + 1);
    if (!v) return v;
    alternatives.push_back({*v});
  }
  if (alternatives.empty()) return error("'anyOf' at " + path + " accepts no value");
  if (alternatives.size() == 1) return alternatives[0][0];
  return b.choice(path, std::move(alternatives));
}

Result<Element> Compiler::typed_value(const Json &schema, const std::string &path, int depth) {
  auto types = allowed_types(schema, path);
  if (!types) return types.status();
  std::vector<Sequence> alternatives;
  for (const std::string &t : *types) {
    if (t == "null") {
      alternatives.push_back(b.literal("null"));
      continue;
    }
    if (t == "boolean") {
      alternatives.push_back(b.literal("true"));
      alternatives.push_back(b.literal("false"));
      continue;
    }
    Result<Element> v = t == "string" ? string_value(schema, path)
                        : t == "number" || t == "integer"
                            ? number_value(schema, path, t == "integer")
                        : t == "object" ? object_value(schema, path, depth)
                                        : array_value(schema, path, depth);
    if (!v) return v;
    alternatives.push_back({*v});
  }
  if (alternatives.size() == 1 && alternatives[0].size() == 1) return alternatives[0][0];
  return b.choice(path, std::move(alternatives));
}

} // namespace json_schema_detail

using json_schema_detail::Compiler;
using json_schema_detail::Json;

JsonSchemaCompiler::JsonSchemaCompiler(GrammarBuilder &builder, const Json &root_schema,
                                       JsonSchemaOptions options)
    : impl_(std::make_unique<Compiler>(builder, root_schema, options)) {}
JsonSchemaCompiler::~JsonSchemaCompiler() = default;

Result<Element> JsonSchemaCompiler::value(const Json &schema, const std::string &path) {
  OFFGRAPH_TRY(impl_->limits());
  return impl_->value(schema, path, 0);
}

Result<Element> JsonSchemaCompiler::raw_string(const Json &schema, const std::string &path,
                                               std::string_view terminator) {
  OFFGRAPH_TRY(impl_->limits());
  return impl_->raw_string(schema, path, terminator, 0);
}

Result<Element> JsonSchemaCompiler::raw_pattern(std::string_view pattern,
                                                const std::string &where) {
  auto parsed = json_schema_detail::parse_pattern(pattern, where, /*python=*/true);
  if (!parsed) return parsed.status();
  for (auto &branch : parsed->branches) branch.anchored_start = branch.anchored_end = true;
  auto content = impl_->pattern_content(*parsed, json_schema_detail::Encoding::kRaw);
  if (!content) return content.status();
  if (content->size() == 1) return (*content)[0];
  return impl_->builder().rule("regex", {std::move(*content)});
}

Element JsonSchemaCompiler::any_value() { return impl_->any_value(); }
Element JsonSchemaCompiler::any_object() { return impl_->any_object(); }
Element JsonSchemaCompiler::whitespace() { return impl_->ws(); }

Result<Grammar> json_schema_grammar(const Json &schema, JsonSchemaOptions options) {
  GrammarBuilder builder;
  JsonSchemaCompiler compiler(builder, schema, options);
  auto v = compiler.value(schema, "#");
  if (!v) return v.status();
  const uint32_t root = builder.declare("root");
  builder.define(root, {{*v}});
  return std::move(builder).finish(root);
}

Result<Grammar> json_object_grammar(JsonSchemaOptions options) {
  GrammarBuilder builder;
  const Json none = Json::object();
  JsonSchemaCompiler compiler(builder, none, options);
  const Element object = compiler.any_object();
  const uint32_t root = builder.declare("root");
  builder.define(root, {{object}});
  return std::move(builder).finish(root);
}

} // namespace offgraph::sample

namespace offgraph::sample {

Result<Grammar> regex_grammar(std::string_view pattern, const std::string &where) {
  GrammarBuilder builder;
  const Json none = Json::object();
  JsonSchemaCompiler compiler(builder, none, {});
  auto e = compiler.raw_pattern(pattern, where);
  if (!e) return e.status();
  const uint32_t root = builder.declare("root");
  builder.define(root, {{*e}});
  return std::move(builder).finish(root);
}

} // namespace offgraph::sample
