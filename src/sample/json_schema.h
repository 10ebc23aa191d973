// JSON Schema (draft 2020-12) to Grammar: what response_format json_schema / json_object and
// strict tool arguments let a model write. The grammar is SOUND: every text it accepts is JSON
// that validates against the schema. It is not complete: it writes one spelling of each value
// (properties in schema order, compact enum and const values, numbers without exponent when
// bounded, integers without fraction, BMP-only pattern classes), and a keyword it cannot enforce
// exactly is refused by name and path, never approximated.
//
// Supported: type (names and lists), enum, const (filtered by the keywords beside them), anyOf,
// allOf of one schema, $ref (JSON pointers into the root, recursion included), $defs,
// definitions; properties, required, additionalProperties (false; a schema: extra keys with that
// schema, never a listed key; absent or true: extra keys only where no property is listed),
// items, prefixItems, minItems, maxItems, uniqueItems (false, or maxItems <= 1); minLength,
// maxLength, pattern (an ECMA-262 subset, unanchored unless anchored), format (date, time,
// date-time, duration, uuid, ipv4, ipv6, hostname, email, uri: each a sound subset); minimum,
// maximum, exclusiveMinimum, exclusiveMaximum (integer-valued on numbers), multipleOf (integers
// up to 100, without bounds, on values of up to 15 digits). Numbers have at most 100 integer
// digits and a two-digit exponent, so that every one is a finite double. Annotations are ignored.
// Everything else is refused, and so are OpenAI's limits: 5,000 properties, 1,000 enum values,
// 120,000 characters of names and values, 15,000 characters for an enum of more than 250 strings,
// 10 levels of nesting.
//
// Whitespace between tokens: "" | " " | "\n" [ \t]{0,20}, so that a model cannot pad forever.
//
// Errors are Status::error messages that name the keyword and its path, e.g.
// "keyword 'oneOf' at #/properties/a is not supported", for the server's HTTP 400. After an
// error the builder holds unfinished rules: discard it.
#pragma once

#include "base/status.h"
#include "sample/grammar.h"

#include <nlohmann/json.hpp>

#include <atomic>
#include <memory>
#include <string>
#include <string_view>

namespace offgraph::sample {

struct JsonSchemaOptions {
  // OpenAI strict mode: every object must also say additionalProperties: false and list every
  // property in required; a schema that does not is refused.
  bool strict = false;
  // Never write '<' raw: inside strings and keys it is written \u003c (JSON decodes it back), so
  // that no text of the value spells a chat format's marker (ATEM's all begin with '<').
  bool escape_lt = false;
};

namespace json_schema_detail {
class Compiler;
}

// Compiles schema parts into an existing builder, so that other grammars (a tool-call wrapper
// that writes each argument as its own element) can embed values. Rules shared between values
// (whitespace, plain strings and numbers, $ref targets) are built once per compiler.
class JsonSchemaCompiler {
public:
  // `root_schema` is what "#" refers to; it must outlive the compiler. Its limits (property and
  // enum counts, name lengths, nesting) are checked here and reported by the first value() or
  // raw_string().
  JsonSchemaCompiler(GrammarBuilder &builder, const nlohmann::ordered_json &root_schema,
                     JsonSchemaOptions options = {});
  ~JsonSchemaCompiler();
  JsonSchemaCompiler(const JsonSchemaCompiler &) = delete;
  JsonSchemaCompiler &operator=(const JsonSchemaCompiler &) = delete;

  // A JSON value conforming to `schema`, found at `path` (a JSON pointer fragment such as
  // "#/properties/a", used in messages). No whitespace before or after it.
  Result<Element> value(const nlohmann::ordered_json &schema, const std::string &path);
  // The content of a string conforming to `schema` (which must accept strings only), neither
  // quoted nor escaped, that never contains `terminator` (empty: no such rule; a caller that
  // needs several strings kept out takes them out with exclude_substrings).
  Result<Element> raw_string(const nlohmann::ordered_json &schema, const std::string &path,
                             std::string_view terminator);
  // Text that `pattern` (the syntax of 'pattern' above, read as Python's re reads it: '.' matches
  // all but '\n', every code point counts) matches whole, as if anchored at both ends, written
  // raw: a regular expression terminal of another grammar (Lark's /.../), or a custom tool's
  // regex. \d \w \s keep their ASCII members (and complements leave out all Unicode ones): a
  // subset of Python's. `where` starts each message.
  Result<Element> raw_pattern(std::string_view pattern, const std::string &where);
  Element any_value();  // any JSON value
  Element any_object(); // any JSON object
  Element whitespace(); // what may stand between tokens: "" | " " | "\n" [ \t]{0,20}

private:
  std::unique_ptr<json_schema_detail::Compiler> impl_;
};

// The whole text is one value conforming to `schema`: no whitespace before or after it, so that
// the answer ends where the value does.
Result<Grammar> json_schema_grammar(const nlohmann::ordered_json &schema,
                                    JsonSchemaOptions options = {});
// Any JSON object (response_format json_object), likewise without surrounding whitespace.
Result<Grammar> json_object_grammar(JsonSchemaOptions options = {});
// Text that `pattern` matches whole (JsonSchemaCompiler::raw_pattern): a custom tool's regex
// format.
Result<Grammar> regex_grammar(std::string_view pattern, const std::string &where);

class GrammarVocabulary;
// Computes, on sample answers, the mask tables that most JSON answers in grammars built with
// `options` reach (strings, numbers, whitespace in objects and arrays; grammar_matcher.h's
// warm_up), so that a server pays their full-vocabulary walks at startup rather than inside a
// request. An error is a bug in the samples. Stops early once `*cancel` is set.
Status warm_json_tables(const std::shared_ptr<const GrammarVocabulary> &vocabulary,
                        JsonSchemaOptions options, const std::atomic<bool> *cancel = nullptr);

} // namespace offgraph::sample
