// The tables most JSON answers reach, computed before the first request needs them.
#include "sample/json_schema.h"

#include "sample/grammar_matcher.h"

namespace offgraph::sample {

namespace {

using Json = nlohmann::ordered_json;

// Strings, integers, numbers, booleans, null, arrays and nested objects, in objects and arrays:
// the uses that decide what may follow each shared rule (its FOLLOW set), so that a table made
// here serves, exactly or refined, the same rule in any schema.
const char *const kSchema = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string"},
    "count": {"type": "integer"},
    "score": {"type": "number"},
    "ok": {"type": "boolean"},
    "note": {"type": ["string", "null"]},
    "tags": {"type": "array", "items": {"type": "string"}},
    "points": {"type": "array", "items": {"type": "number"}},
    "items": {"type": "array", "items": {
      "type": "object",
      "properties": {"id": {"type": "integer"}, "label": {"type": "string"}},
      "required": ["id", "label"], "additionalProperties": false}}
  },
  "required": ["name", "count", "score", "ok", "note", "tags", "points", "items"],
  "additionalProperties": false
})";

// Sample answers: compact and indented, with escapes and non-ASCII text in strings.
const char *const kInstances[] = {
    R"({"name":"Ada Lovelace","count":3,"score":-12.5,"ok":true,"note":null,"tags":["a","b c"],"points":[1,2.5e-3,-4],"items":[{"id":1,"label":"x"},{"id":22,"label":"yz"}]})",
    "{\n  \"name\": \"caf\xC3\xA9 \\\"q\\\" \\u00e9\\n\",\n  \"count\": -70,\n  \"score\": 0.25,\n"
    "  \"ok\": false,\n  \"note\": \"see\",\n  \"tags\": [],\n  \"points\": [ 3, 4 ],\n"
    "  \"items\": [\n    {\n      \"id\": 0,\n      \"label\": \"\"\n    }\n  ]\n}",
};
const char *const kObjects[] = {
    R"({"key":"value","n":[1,2.5e-3,-4,"s"],"o":{"t":true,"f":false,"z":null},"e":{}})",
    "{\n  \"a b\": \"caf\xC3\xA9 \\\"q\\\"\",\n  \"list\": [\n    {\"x\": 1.5},\n    []\n  ]\n}",
};

// A string as the whole answer (its contexts are rooted: nothing below them), and one bounded past
// kMaxRepeatBound, which the compiler splits into blocks of 10,000 characters whose ends no token
// reaches (their counting walk follows no path out of the block, grammar_counted.cpp).
const char *const kStringSchemas[] = {R"({"type": "string"})",
                                      R"({"type": "string", "maxLength": 20000})"};
const char *const kStrings[] = {R"("Ada Lovelace, caf\u00e9 \"q\" Ã©")"};

Status walk(Result<Grammar> grammar, const std::shared_ptr<const GrammarVocabulary> &vocabulary,
            const char *const *texts, size_t count, const std::atomic<bool> *cancel) {
  if (!grammar.ok()) return grammar.status();
  auto compiled = compile_grammar(std::move(grammar).value(), vocabulary, {});
  if (!compiled.ok()) return compiled.status();
  for (size_t i = 0; i < count; ++i) {
    const std::string_view text = texts[i]; // no '<', which escape_lt would refuse
    std::vector<int32_t> symbols;
    for (char c : text) symbols.push_back(int32_t(uint8_t(c)));
    if (Status s = warm_up(*compiled, symbols, cancel); !s.ok()) return s;
  }
  return ok_status();
}

} // namespace

Status warm_json_tables(const std::shared_ptr<const GrammarVocabulary> &vocabulary,
                        JsonSchemaOptions options, const std::atomic<bool> *cancel) {
  const Json schema = Json::parse(kSchema);
  if (Status s = walk(json_schema_grammar(schema, options), vocabulary, kInstances,
                      std::size(kInstances), cancel);
      !s.ok())
    return Status::error("JSON warm-up (schema): " + s.message(), StatusCode::kInternal);
  if (Status s =
          walk(json_object_grammar(options), vocabulary, kObjects, std::size(kObjects), cancel);
      !s.ok())
    return Status::error("JSON warm-up (any object): " + s.message(), StatusCode::kInternal);
  for (const char *string_schema : kStringSchemas)
    if (Status s = walk(json_schema_grammar(Json::parse(string_schema), options), vocabulary,
                        kStrings, std::size(kStrings), cancel);
        !s.ok())
      return Status::error("JSON warm-up (a string): " + s.message(), StatusCode::kInternal);
  return ok_status();
}

} // namespace offgraph::sample
