// The JSON Schema compiler's internals, shared by json_schema*.cpp: not an API.
#pragma once

#include "sample/json_schema.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace offgraph::sample::json_schema_detail {

using Json = nlohmann::ordered_json;

// Sorted, disjoint, non-adjacent inclusive code point intervals.
using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;
Ranges normalized(Ranges r);
Ranges unite(const Ranges &a, const Ranges &b);
Ranges subtract(const Ranges &a, const Ranges &b);
bool contains(const Ranges &r, uint32_t c);
// Every code point a pattern may produce: the BMP without surrogates (see json_schema_regex.cpp).
const Ranges &bmp();

std::string with_commas(uint64_t n);
// `path` + "/" + `key`, JSON-pointer escaped.
std::string child(const std::string &path, std::string_view key);
// The code points of valid UTF-8 `text`, or nullopt.
std::optional<std::u32string> decode_utf8(std::string_view text);
std::string encode_utf8(uint32_t c);
// Compact JSON text; fails on invalid UTF-8 or a non-finite number (which JSON cannot spell).
std::optional<std::string> dump_json(const Json &value, bool escape_lt = false);

// A pattern (ECMA-262 subset) as parsed. Sets hold the code points that ECMA-262 and Python's re
// both match there, so that the grammar is sound whichever of them checks the schema.
struct RegexNode {
  enum class Kind : uint8_t { kEmpty, kSet, kConcat, kAlt, kRepeat };
  Kind kind = Kind::kEmpty;
  Ranges set;                   // kSet
  std::vector<RegexNode> items; // kConcat, kAlt; kRepeat: the one repeated node
  uint32_t min = 0, max = 0;    // kRepeat; max may be kUnbounded
};
struct Pattern {
  struct Branch { // one top-level alternative
    bool anchored_start = false, anchored_end = false;
    RegexNode node;
  };
  std::vector<Branch> branches;
  // Length range of a matching string in code points (max may be kUnbounded).
  uint32_t min_length() const;
  uint32_t max_length() const;
  // Every code point a matching string may hold (all of them when unanchored).
  Ranges alphabet() const;
};
// `where` starts each message ("'pattern' at #/properties/a").
// `python`: the pattern is Python's re alone (a Lark terminal), not JSON Schema's engines: '.'
// matches all but '\n', and sets and their complements span every code point, not the BMP.
Result<Pattern> parse_pattern(std::string_view text, const std::string &where, bool python = false);

// How string content is written: JSON-escaped between quotes, or as its raw bytes.
enum class Encoding : uint8_t { kJson, kRaw };

struct ObjectMember {
  std::string key; // quoted, as written
  Sequence rest;   // ws ':' ws value
  bool required = false;
};

// The state of one compilation. Rules that many values share are built once (cache_).
class Compiler {
public:
  Compiler(GrammarBuilder &builder, const Json &root, JsonSchemaOptions options,
           int scratch_depth = 0);

  Result<Element> value(const Json &schema, const std::string &path, int depth);
  Result<Element> raw_string(const Json &schema, const std::string &path,
                             std::string_view terminator, int depth);
  Element any_value();
  Element any_object();
  Element ws();

  const Status &limits() const { return limits_; }
  GrammarBuilder &builder() { return b; }
  Result<Sequence> pattern_content(const Pattern &pattern, Encoding enc);

private:
  friend class NonLeading;
  // json_schema.cpp: $ref, anyOf, types, and what every value shares.
  Result<Element> dispatch(const Json &schema, const std::string &path, int depth);
  Result<Element> ref_value(const Json &schema, const std::string &path, int depth);
  Result<Element> root_ref(const Json *target, const std::string &key, int depth);
  Result<Element> any_of_value(const Json &schema, const std::string &path, int depth);
  Result<Element> typed_value(const Json &schema, const std::string &path, int depth);
  Result<std::pair<const Json *, std::string>> resolve_ref(const Json &schema,
                                                           const std::string &path);
  Sequence comma();
  Sequence colon();
  Element any_string();
  // X{min,max} for any bounds (max may be kUnbounded): builder.repeat, nested past its limit.
  Result<Element> repeat(const std::string &name, const Sequence &item, uint64_t min, uint64_t max);

  // json_schema_enum.cpp.
  Result<Element> enum_value(const Json &schema, const std::string &path, int depth);
  Result<std::vector<const Json *>> enum_candidates(const Json &schema, const std::string &path,
                                                    int depth);

  // json_schema_objects.cpp.
  Result<Element> object_value(const Json &schema, const std::string &path, int depth);
  // One of `texts` (distinct), as a trie.
  Element literals(const std::string &name, const std::vector<std::string> &texts);
  Element object_body(const std::string &path, const std::vector<ObjectMember> &members,
                      const std::optional<Sequence> &extra_member, const Sequence &tail);
  Result<Element> array_value(const Json &schema, const std::string &path, int depth);
  Result<Element> extra_key(const std::vector<std::string> &listed);

  // json_schema_numbers.cpp.
  Result<Element> number_value(const Json &schema, const std::string &path, bool integer);
  Element any_number();
  Element any_integer();
  Element digits_range(uint64_t lo, std::optional<uint64_t> hi);
  Element fixed_digits_range(const std::string &lo, const std::string &hi);
  Result<Element> multiple_of(uint64_t k, const std::string &path);

  // json_schema_strings.cpp.
  Result<Element> string_value(const Json &schema, const std::string &path);
  Result<Sequence> string_content(const Json &schema, const std::string &path, Encoding enc,
                                  std::string_view terminator);
  Result<Sequence> regex_node(const RegexNode &node, Encoding enc);
  Element char_set(const Ranges &set, Encoding enc);
  Element json_char();
  Element json_chars(); // json_char()*
  Element code_point();
  Element any_text(); // code_point()*
  Result<Element> text_without(std::string_view terminator, uint32_t min, uint32_t max,
                               const std::string &path);
  Result<Element> raw_enum(const Json &schema, const std::string &path, std::string_view terminator,
                           int depth);

  GrammarBuilder &b;
  const Json &root_;
  JsonSchemaOptions options_;
  int scratch_depth_;
  Status limits_;
  std::map<std::string, Element> cache_;
  std::map<std::string, uint32_t> refs_; // $ref target pointer -> its rule
  // $ref targets entered since the last byte the value consumed, innermost last, and the
  // targets each target reaches that way: a cycle among them would be left recursion.
  std::vector<std::string> leading_;
  std::map<std::string, std::vector<std::string>> leading_edges_;
  std::vector<std::string> raw_chain_; // $ref targets on the way to a raw string
};

inline Status error(std::string message) { return Status::error(std::move(message)); }
inline const Json *find(const Json &object, const char *key) {
  auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}
bool is_annotation(std::string_view key);
inline bool is_definitions(std::string_view k) { return k == "$defs" || k == "definitions"; }

Status check_keywords(const Json &schema, const std::string &path, bool is_root);
// Only annotations and definitions may stand beside `keyword`.
Status check_alone(const Json &schema, const std::string &path, const char *keyword);
Result<std::vector<std::string>> allowed_types(const Json &schema, const std::string &path);
bool has_type(const Json &v, std::string_view type);
// A non-negative integer keyword (minItems, ...); nullopt when absent.
Result<std::optional<uint64_t>> count_keyword(const Json &schema, const char *key,
                                              const std::string &path);

// Clears the $ref chain while a container's members compile: their values follow a consumed
// byte, so a $ref among them back to a target being compiled is recursion, not left recursion.
class NonLeading {
public:
  explicit NonLeading(Compiler &c) : c_(c), saved_(std::move(c.leading_)) { c.leading_.clear(); }
  ~NonLeading() { c_.leading_ = std::move(saved_); }
  NonLeading(const NonLeading &) = delete;
  NonLeading &operator=(const NonLeading &) = delete;

private:
  Compiler &c_;
  std::vector<std::string> saved_;
};

// The limits OpenAI puts on a schema (property and enum counts, name lengths, nesting).
Status check_limits(const Json &root);

// The format's content pattern (anchored), or nullptr for an unsupported format.
const char *format_pattern(std::string_view format);

} // namespace offgraph::sample::json_schema_detail
