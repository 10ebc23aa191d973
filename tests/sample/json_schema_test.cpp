// JSON Schema to grammar. Soundness first: vectors from Python's jsonschema (every text the
// grammar accepts must be valid; every valid text in the grammar's own canonical form must be
// accepted), then hand cases for numbers, strings and patterns, the refusals (each names its
// keyword and path), raw strings, and random schemas that must compile or fail without crashing.
#include "sample/json_schema.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

namespace offgraph::sample {
namespace {

using ojson = nlohmann::ordered_json;

Grammar compile(const std::string &schema, JsonSchemaOptions options = {}) {
  auto g = json_schema_grammar(ojson::parse(schema), options);
  EXPECT_TRUE(g.ok()) << schema << ": " << g.message();
  if (!g.ok()) return Grammar{};
  return std::move(g).value();
}

bool accepts(const Grammar &g, std::string_view text) {
  if (g.rules.empty()) return false;
  auto r = grammar_accepts(g, text);
  EXPECT_TRUE(r.ok()) << r.message();
  return r.ok() && *r;
}

std::string refusal(const std::string &schema, JsonSchemaOptions options = {}) {
  auto g = json_schema_grammar(ojson::parse(schema), options);
  EXPECT_FALSE(g.ok()) << schema << " compiled";
  return g.ok() ? std::string() : g.message();
}

// ---- vectors ----

struct Instance {
  std::string text;
  bool json = false, valid = false, canonical = false;
};
struct VectorCase {
  std::string name;
  ojson schema;
  bool strict = false;
  std::vector<Instance> instances;
};

std::vector<VectorCase> load_vectors() {
  const auto path =
      std::filesystem::path(OFFGRAPH_SAMPLE_TEST_DIR) / "vectors" / "json_schema_vectors.json";
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  std::vector<VectorCase> out;
  const ojson doc = ojson::parse(ss.str());
  for (const ojson &c : doc["cases"]) {
    VectorCase v;
    v.name = c["name"].get<std::string>();
    v.schema = c["schema"];
    v.strict = c.value("strict", false);
    for (const ojson &i : c["instances"])
      v.instances.push_back({i["text"].get<std::string>(), i["json"].get<bool>(),
                             i["valid"].get<bool>(), i["canonical"].get<bool>()});
    out.push_back(std::move(v));
  }
  return out;
}

// A random sentence of the grammar: alternatives drawn at random until the text grows long or
// deep, then the shortest way out.
class Sampler {
public:
  explicit Sampler(const Grammar &g) : g_(g), height_(g.rules.size(), kFar) {
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < g.rules.size(); ++r)
        for (const Sequence &alt : g.rules[r].alternatives)
          if (const uint32_t h = height(alt); h != kFar && h + 1 < height_[r]) {
            height_[r] = h + 1;
            changed = true;
          }
    }
  }
  std::string sample(std::mt19937 &rng) {
    std::string out;
    expand(g_.root, 0, rng, out);
    return out;
  }

private:
  static constexpr uint32_t kFar = 0xFFFFFFFFu;
  // How deep the shortest way through `alt` goes; kFar if there is none (an empty byte set is
  // a dead end).
  uint32_t height(const Sequence &alt) const {
    uint32_t h = 0;
    for (const Element &e : alt) {
      if (e.kind == Element::Kind::kRule) h = std::max(h, height_[e.value]);
      if (e.kind == Element::Kind::kBytes && g_.byte_sets[e.value].empty()) return kFar;
    }
    return h;
  }
  void expand(uint32_t rule, int depth, std::mt19937 &rng, std::string &out) {
    const auto &alts = g_.rules[rule].alternatives;
    const Sequence *pick = &alts[rng() % alts.size()];
    if (depth > 24 || out.size() > 400 || height(*pick) == kFar)
      for (const Sequence &alt : alts)
        if (height(alt) < height(*pick)) pick = &alt;
    for (const Element &e : *pick) {
      if (e.kind == Element::Kind::kRule) {
        expand(e.value, depth + 1, rng, out);
      } else if (e.kind == Element::Kind::kBytes) {
        const ByteSet &set = g_.byte_sets[e.value];
        std::vector<uint8_t> members;
        for (unsigned c = 0; c < 256; ++c)
          if (set.test(uint8_t(c))) members.push_back(uint8_t(c));
        // Prefer printable ASCII where the set has it, so that texts stay readable.
        std::vector<uint8_t> plain;
        for (uint8_t c : members)
          if (c >= 0x20 && c < 0x7F) plain.push_back(c);
        const auto &from = !plain.empty() && rng() % 4 ? plain : members;
        if (!from.empty()) out += char(from[rng() % from.size()]);
      }
    }
  }
  const Grammar &g_;
  std::vector<uint32_t> height_;
};

// Writes random sentences of each vector schema's grammar, for json_schema_vectors.py to label
// (OFFGRAPH_GRAMMAR_SAMPLES=path sample_tests --gtest_also_run_disabled_tests ...).
TEST(JsonSchemaVectors, DISABLED_WriteGrammarSamples) {
  const char *path = std::getenv("OFFGRAPH_GRAMMAR_SAMPLES");
  ASSERT_NE(path, nullptr);
  ojson out = ojson::object();
  std::mt19937 rng(99);
  for (const VectorCase &c : load_vectors()) {
    auto g = json_schema_grammar(c.schema, {.strict = c.strict});
    ASSERT_TRUE(g.ok()) << c.name << ": " << g.message();
    Sampler sampler(*g);
    std::set<std::string> texts;
    const int n = std::getenv("OFFGRAPH_GRAMMAR_SAMPLE_COUNT")
                      ? std::atoi(std::getenv("OFFGRAPH_GRAMMAR_SAMPLE_COUNT"))
                      : 40;
    for (int i = 0; i < n; ++i) texts.insert(sampler.sample(rng));
    out[c.name] = ojson::array();
    for (const std::string &t : texts) out[c.name].push_back(t);
  }
  std::ofstream(path) << out.dump(1, ' ', false, ojson::error_handler_t::replace) << "\n";
}

TEST(JsonSchemaVectors, SoundAgainstJsonschemaAndCompleteOnCanonicalForms) {
  const std::vector<VectorCase> cases = load_vectors();
  ASSERT_GE(cases.size(), 50u);
  size_t instances = 0, accepted = 0, valid = 0, canonical_valid = 0;
  for (const VectorCase &c : cases) {
    auto g = json_schema_grammar(c.schema, {.strict = c.strict});
    ASSERT_TRUE(g.ok()) << c.name << ": " << g.message();
    for (const Instance &i : c.instances) {
      ++instances;
      auto r = grammar_accepts(*g, i.text);
      ASSERT_TRUE(r.ok()) << c.name << ": " << r.message();
      valid += i.valid;
      if (*r) {
        ++accepted;
        EXPECT_TRUE(i.json && i.valid) << c.name << ": accepted an invalid instance: " << i.text;
      }
      if (i.canonical && i.valid) {
        ++canonical_valid;
        EXPECT_TRUE(*r) << c.name << ": rejected a valid canonical instance: " << i.text;
      }
    }
  }
  std::cout << cases.size() << " schemas, " << instances << " instances: " << valid << " valid, "
            << accepted << " accepted, " << canonical_valid << " valid canonical\n";
  EXPECT_GE(instances, 2000u);
  EXPECT_GE(accepted, 500u);
}

// ---- numbers, against brute force ----

TEST(JsonSchemaNumbers, IntegerBoundsMatchEveryValueInAWindow) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 40; ++trial) {
    const int64_t a = int64_t(rng() % 2400) - 1200, b = a + int64_t(rng() % 1300);
    ojson schema = {{"type", "integer"}};
    const int kind = trial % 4;
    if (kind != 1) schema[trial % 3 ? "minimum" : "exclusiveMinimum"] = a;
    if (kind != 2) schema[trial % 5 ? "maximum" : "exclusiveMaximum"] = b;
    auto g = json_schema_grammar(schema);
    ASSERT_TRUE(g.ok()) << schema.dump() << ": " << g.message();
    for (int64_t v = -1600; v <= 1600; v += 1 + int64_t(rng() % 3)) {
      bool in = true;
      if (schema.contains("minimum")) in &= v >= a;
      if (schema.contains("exclusiveMinimum")) in &= v > a;
      if (schema.contains("maximum")) in &= v <= b;
      if (schema.contains("exclusiveMaximum")) in &= v < b;
      EXPECT_EQ(accepts(*g, std::to_string(v)), in) << schema.dump() << " " << v;
    }
    EXPECT_FALSE(accepts(*g, "-0") && schema.contains("minimum") && a > 0);
    EXPECT_FALSE(accepts(*g, "01"));
    EXPECT_FALSE(accepts(*g, "1.0"));
  }
}

TEST(JsonSchemaNumbers, NumberBoundsAreExactOnDecimals) {
  std::mt19937 rng(12);
  const char *fractions[] = {"", ".0", ".00", ".5", ".05", ".999", ".001"};
  for (int trial = 0; trial < 30; ++trial) {
    const int64_t a = int64_t(rng() % 60) - 30, b = a + int64_t(rng() % 25);
    const bool ax = rng() % 2, bx = rng() % 2;
    if (a == b && (ax || bx)) continue;
    ojson schema = {{"type", "number"},
                    {ax ? "exclusiveMinimum" : "minimum", a},
                    {bx ? "exclusiveMaximum" : "maximum", b}};
    auto g = json_schema_grammar(schema);
    ASSERT_TRUE(g.ok()) << schema.dump() << ": " << g.message();
    for (int64_t i = -40; i <= 40; ++i)
      for (const char *f : fractions)
        for (const char *sign : {"", "-"}) {
          const std::string text = sign + std::to_string(std::abs(i)) + f;
          const double v = std::stod(text);
          const bool in =
              (ax ? v > double(a) : v >= double(a)) && (bx ? v < double(b) : v <= double(b));
          // Sound always; complete except for "-0..." (never written).
          const bool accepted = accepts(*g, text);
          if (accepted) {
            EXPECT_TRUE(in) << schema.dump() << " " << text;
          }
          if (in && !(sign[0] == '-' && v == 0)) {
            EXPECT_TRUE(accepted) << schema.dump() << " " << text;
          }
        }
    EXPECT_FALSE(accepts(*g, std::to_string(a) + "e0"));
  }
}

TEST(JsonSchemaNumbers, MultipleOfAndPlainSyntax) {
  const Grammar g = compile(R"({"type":"integer","multipleOf":12})");
  for (int v = -300; v <= 300; ++v) EXPECT_EQ(accepts(g, std::to_string(v)), v % 12 == 0) << v;
  EXPECT_TRUE(accepts(g, "999999999999996"));   // 15 digits
  EXPECT_FALSE(accepts(g, "1200000000000000")); // 16: past what a double holds exactly
  const Grammar n = compile(R"({"type":"number"})");
  EXPECT_TRUE(accepts(n, "1" + std::string(99, '0') + "e99"));
  EXPECT_FALSE(accepts(n, "1" + std::string(100, '0')));
  EXPECT_FALSE(accepts(n, "1e100"));
  for (const char *ok : {"0", "-0", "1.5", "-12.25e+10", "3E-2", "1e5", "0.0"})
    EXPECT_TRUE(accepts(n, ok)) << ok;
  for (const char *bad : {"01", "1.", ".5", "+1", "1e", "--1", "0x10", "NaN", "1 "})
    EXPECT_FALSE(accepts(n, bad)) << bad;
}

// ---- strings ----

TEST(JsonSchemaStrings, LengthsCountCodePointsAndEscapesAsOne) {
  const Grammar g = compile(R"({"type":"string","minLength":2,"maxLength":3})");
  EXPECT_TRUE(accepts(g, "\"ab\""));
  EXPECT_TRUE(accepts(g, "\"\xC3\xA9\xF0\x9F\x98\x80\"")); // two code points
  EXPECT_TRUE(accepts(g, "\"\\n\\u00e9\\\"\""));           // three escapes
  EXPECT_FALSE(accepts(g, "\"a\""));
  EXPECT_FALSE(accepts(g, "\"abcd\""));
  EXPECT_FALSE(accepts(g, "\"\\ud83d\\ude00\"")); // a surrogate pair is refused
  EXPECT_FALSE(accepts(g, "\"a\nb\""));           // a raw control
}

TEST(JsonSchemaStrings, PatternsAreUnanchoredUnlessAnchored) {
  const Grammar g = compile(R"({"type":"string","pattern":"ab+c"})");
  EXPECT_TRUE(accepts(g, "\"xxabbbcyy\""));
  EXPECT_TRUE(accepts(g, "\"abc\""));
  EXPECT_FALSE(accepts(g, "\"ac\""));
  const Grammar a = compile(R"({"type":"string","pattern":"^ab+c$"})");
  EXPECT_TRUE(accepts(a, "\"abbc\""));
  EXPECT_FALSE(accepts(a, "\"xabc\""));
  EXPECT_FALSE(accepts(a, "\"abcx\""));
  const Grammar q = compile(R"({"type":"string","pattern":"^[\"\\\\]{2}$"})");
  EXPECT_TRUE(accepts(q, R"("\"\\")"));
  EXPECT_TRUE(accepts(q, R"("\u0022\u005C")"));
  EXPECT_FALSE(accepts(q, R"("\"")"));
  const Grammar n = compile(R"({"type":"string","pattern":"^[^a]$"})");
  EXPECT_TRUE(accepts(n, "\"b\""));
  EXPECT_TRUE(accepts(n, "\"\\n\""));
  EXPECT_FALSE(accepts(n, "\"a\""));
  EXPECT_FALSE(accepts(n, "\"\xF0\x9F\x98\x80\"")); // beyond the BMP: engines disagree
  const Grammar e = compile(R"({"type":"string","pattern":"^(a*)*b$"})"); // nullable repetition
  EXPECT_TRUE(accepts(e, "\"aab\""));
  EXPECT_TRUE(accepts(e, "\"b\""));
}

TEST(JsonSchemaStrings, FormatsAcceptTheirSubsetOnly) {
  const Grammar d = compile(R"({"type":"string","format":"date"})");
  EXPECT_TRUE(accepts(d, "\"2024-02-29\""));
  EXPECT_TRUE(accepts(d, "\"2000-02-29\""));
  EXPECT_FALSE(accepts(d, "\"1900-02-29\""));
  EXPECT_FALSE(accepts(d, "\"2023-02-29\""));
  EXPECT_FALSE(accepts(d, "\"2023-04-31\""));
  EXPECT_FALSE(accepts(d, "\"0000-01-01\""));
  const Grammar ip = compile(R"({"type":"string","format":"ipv6"})");
  for (const char *ok : {"::", "::1", "1::", "1:2:3:4:5:6:7:8", "1:2:3:4:5:6:1.2.3.4", "a::b:c"})
    EXPECT_TRUE(accepts(ip, std::string("\"") + ok + "\"")) << ok;
  for (const char *bad : {":::", "1:2:3:4:5:6:7:8:9", "1::2::3", "12345::", "1:2:3:4:5:6:7"})
    EXPECT_FALSE(accepts(ip, std::string("\"") + bad + "\"")) << bad;
}

// ---- refusals: each names the keyword and its path ----

TEST(JsonSchemaRefusals, NameTheKeywordAndPath) {
  struct Case {
    const char *schema;
    const char *message; // the start of the message, or a part of it after '~'
  };
  const Case cases[] = {
      {R"({"oneOf":[{"type":"null"}]})", "keyword 'oneOf' at # is not supported"},
      {R"({"properties":{"a":{"not":{}}}})", "keyword 'not' at #/properties/a is not supported"},
      {R"({"type":"object","properties":{"a":{"allOf":[{},{}]}}})",
       "keyword 'allOf' at #/properties/a is supported only with one subschema"},
      {R"({"if":{},"then":{}})", "keyword 'if' at # is not supported"},
      {R"({"type":"array","items":{"uniqueItems":true}})",
       "keyword 'uniqueItems' at #/items is not supported"},
      {R"({"patternProperties":{"a":{}}})", "keyword 'patternProperties' at # is not supported"},
      {R"({"propertyNames":{}})", "keyword 'propertyNames' at # is not supported"},
      {R"({"contains":{}})", "keyword 'contains' at # is not supported"},
      {R"({"minProperties":1})", "keyword 'minProperties' at # is not supported"},
      {R"({"dependentRequired":{}})", "keyword 'dependentRequired' at # is not supported"},
      {R"({"unevaluatedProperties":false})",
       "keyword 'unevaluatedProperties' at # is not supported"},
      {R"({"$dynamicRef":"#"})", "keyword '$dynamicRef' at # is not supported"},
      {R"({"properties":{"a":{"$id":"x"}}})", "keyword '$id' at #/properties/a is not supported"},
      {R"({"nullable":true})", "keyword 'nullable' at # is not supported"},
      {R"({"type":"array","items":[{}]})", "keyword 'items' at # as an array"},
      {R"({"type":"object","anyOf":[{}]})",
       "keyword 'type' at # alongside 'anyOf' is not supported"},
      {R"({"$ref":"#/$defs/a","type":"string","$defs":{"a":{}}})",
       "keyword 'type' at # alongside '$ref' is not supported"},
      {R"({"type":"string","format":"regex"})",
       "'format' at # is \"regex\", which is not supported"},
      {R"({"type":"string","format":"date","pattern":"x"})",
       "keyword 'pattern' at # alongside 'format' is not supported"},
      {R"j({"type":"string","pattern":"(a)\\1"})j",
       "'pattern' at #: a backreference is not supported"},
      {R"j({"type":"string","pattern":"a(?=b)"})j", "'pattern' at #: lookaround is not supported"},
      {R"j({"type":"string","pattern":"a(?<!b)"})j", "'pattern' at #: lookaround is not supported"},
      {R"({"type":"string","pattern":"\\bword"})",
       "'pattern' at #: a word boundary assertion ('\\b') is not supported"},
      {R"({"type":"string","pattern":"a^b"})",
       "'pattern' at #: an anchor ('^') inside the pattern"},
      {R"j({"type":"string","pattern":"(a$)"})j",
       "'pattern' at #: an anchor ('$') inside the pattern"},
      {R"j({"type":"string","pattern":"(?<n>a)"})j",
       "'pattern' at #: a named group is not supported"},
      {R"j({"type":"string","pattern":"(?i)a"})j", "'pattern' at #: a group modifier"},
      {R"({"type":"string","pattern":"a{,3}"})", "'pattern' at #: a '{' that is not a quantifier"},
      {R"({"type":"string","pattern":"a**"})", "'pattern' at #: a quantifier after a quantifier"},
      {R"({"type":"string","pattern":"a{3,2}"})", "'pattern' at #: the pattern has a quantifier"},
      {R"j({"type":"string","pattern":"(ab"})j",
       "'pattern' at #: the pattern has an unterminated group"},
      {R"({"type":"string","pattern":"[ab"})",
       "'pattern' at #: the pattern has an unterminated class"},
      {R"({"type":"string","pattern":"[]"})", "'pattern' at #: an empty class"},
      {R"({"type":"string","pattern":"\\p{L}"})", "'pattern' at #: a Unicode property escape"},
      {R"({"type":"string","pattern":"[\\d-z]"})",
       "'pattern' at #: a class range with a class escape"},
      {R"({"type":"string","pattern":"\\uD83D"})", "'pattern' at #: a surrogate escape"},
      {R"({"type":"string","pattern":"a{20000}"})",
       "'pattern' at #: a quantifier bound above 10,000"},
      {R"({"type":"string","pattern":"[^\\s\\S]"})", "'pattern' at # matches no string"},
      {R"({"type":"string","pattern":"^[a-z]+x$","maxLength":4})",
       "keyword 'maxLength' at # alongside 'pattern' is not supported"},
      {R"({"type":"string","minLength":5,"maxLength":4})",
       "'maxLength' at # is less than 'minLength'"},
      {R"({"type":"array","minItems":3,"maxItems":2})", "'maxItems' at # is less than 'minItems'"},
      {R"({"type":"array","items":{"type":"array","minItems":3,"maxItems":2}})",
       "'maxItems' at #/items is less than 'minItems'"},
      {R"({"type":"array","prefixItems":[{}],"items":false,"minItems":2})",
       "'minItems' at # is more than the 1 items"},
      {R"({"type":"array","minItems":-1})", "'minItems' at # must be a non-negative integer"},
      {R"({"type":"integer","minimum":5,"maximum":4})",
       "'maximum' at # and 'minimum' leave no integer between them"},
      {R"({"type":"integer","minimum":1.2,"maximum":1.8})",
       "'maximum' at # and 'minimum' leave no integer between them"},
      {R"({"type":"number","exclusiveMinimum":3,"maximum":3})",
       "'maximum' at # and 'exclusiveMinimum' leave no number between them"},
      {R"({"type":"number","minimum":0.5})",
       "'minimum' at # is 0.5; only integer bounds are supported on numbers"},
      {R"({"type":"integer","maximum":1e300})", "'maximum' at # is 1e+300; bounds beyond 10^18"},
      {R"({"type":"integer","exclusiveMinimum":true})", "'exclusiveMinimum' at # must be a number"},
      {R"({"type":"number","multipleOf":0.01})", "'multipleOf' at # is 0.01; only integers"},
      {R"({"type":"integer","multipleOf":3,"minimum":0})",
       "keyword 'multipleOf' at # alongside 'minimum' is not supported"},
      {R"({"$ref":"#"})", "'$ref' at # refers back to '#' without consuming anything"},
      {R"({"$defs":{"a":{"$ref":"#/$defs/b"},"b":{"anyOf":[{"$ref":"#/$defs/a"}]}},"$ref":"#/$defs/a"})",
       "'$ref' at #/$defs/b/anyOf/0 refers back to '#/$defs/a' without consuming anything"},
      {R"({"anyOf":[{"type":"object"},{"$ref":"#"}]})", "'$ref' at #/anyOf/1 refers back to '#'"},
      {R"({"$ref":"#/$defs/missing"})",
       "'$ref' at # refers to '#/$defs/missing', which does not exist"},
      {R"({"$ref":"other.json#/a"})", "'$ref' at # is 'other.json#/a'; only JSON pointers"},
      {R"({"$ref":"#/$defs/a%zz"})", "'$ref' at # is '#/$defs/a%zz'"},
      {R"({"$ref":"#/$defs/x","$defs":{"x":3}})",
       "'$ref' at # refers to '#/$defs/x', which is not a schema"},
      {R"({"type":"strung"})", "'type' at # names \"strung\", which is not a JSON Schema type"},
      {R"({"type":[]})", "'type' at # must be a type name"},
      {R"({"enum":[]})", "'enum' at # has no value that the keywords beside it accept"},
      {R"({"type":"string","enum":[1,2]})", "'enum' at # has no value"},
      {R"({"const":"a","enum":["b"]})", "'enum' at # has no value"},
      {R"({"type":"object","properties":{"a":false},"required":["a"]})",
       "'required' at # lists 'a', whose schema at #/properties/a is false"},
      {R"({"type":"object","required":["a"],"additionalProperties":false})",
       "'required' at # lists 'a', which is not in 'properties'"},
      {R"({"properties":{"a":3}})", "the schema at #/properties/a must be an object or a boolean"},
      {R"(false)", "the schema at # is false, which accepts no value"},
      {R"({"anyOf":[false]})", "'anyOf' at # accepts no value"},
  };
  for (const Case &c : cases) {
    const std::string m = refusal(c.schema);
    EXPECT_EQ(m.rfind(c.message, 0), 0u) << c.schema << "\n  got: " << m;
  }
}

TEST(JsonSchemaRefusals, StrictModeNeedsClosedObjectsWithEveryPropertyRequired) {
  const JsonSchemaOptions strict{.strict = true};
  EXPECT_EQ(refusal(R"({"type":"object","properties":{"a":{}},"required":["a"]})", strict),
            "'additionalProperties' at # must be false in strict mode");
  EXPECT_EQ(
      refusal(
          R"({"type":"object","properties":{"a":{"type":"object","properties":{"b":{},"c":{}},"required":["b"],"additionalProperties":false}},"required":["a"],"additionalProperties":false})",
          strict),
      "'required' at #/properties/a must list every property in strict mode; 'c' is missing");
  const Grammar g = compile(
      R"({"type":"object","properties":{"a":{"type":"integer"}},"required":["a"],"additionalProperties":false})",
      strict);
  EXPECT_TRUE(accepts(g, R"({"a":1})"));
  EXPECT_FALSE(accepts(g, R"({})"));
}

TEST(JsonSchemaRefusals, Limits) {
  ojson props = ojson::object();
  for (int i = 0; i < 5001; ++i) props["p" + std::to_string(i)] = {{"type", "null"}};
  EXPECT_EQ(json_schema_grammar({{"type", "object"}, {"properties", props}}).message(),
            "the schema has 5,001 properties; the limit is 5,000");
  ojson values = ojson::array();
  for (int i = 0; i < 1001; ++i) values.push_back(i);
  EXPECT_EQ(json_schema_grammar({{"enum", values}}).message(),
            "the schema has 1,001 enum values; the limit is 1,000");
  ojson strings = ojson::array();
  for (int i = 0; i < 251; ++i) strings.push_back(std::string(60, 'a') + std::to_string(i));
  EXPECT_EQ(json_schema_grammar({{"enum", strings}})
                .message()
                .rfind("'enum' at # has 251 string values totalling 15,", 0),
            0u);
  ojson long_names = ojson::object();
  for (int i = 0; i < 13; ++i) long_names[std::string(10000, char('a' + i))] = true;
  EXPECT_EQ(json_schema_grammar({{"properties", long_names}}).message(),
            "the schema's property names, definition names, enum values and const values total "
            "130,000 characters; the limit is 120,000");
  ojson deep = {{"type", "null"}};
  for (int i = 0; i < 11; ++i) deep = {{"type", "array"}, {"items", deep}};
  EXPECT_EQ(json_schema_grammar(deep).message(),
            "the schema nests 11 levels deep at #/items/items/items/items/items/items/items/items/"
            "items/items/items; the limit is 10");
  ojson ten = {{"type", "null"}};
  for (int i = 0; i < 10; ++i) ten = {{"type", "array"}, {"items", ten}};
  EXPECT_TRUE(json_schema_grammar(ten).ok());
  ojson nested = true;
  for (int i = 0; i < 150; ++i) nested = {{"anyOf", {nested}}};
  EXPECT_EQ(json_schema_grammar(nested).message().rfind("the schema at #/anyOf/0/", 0), 0u);
}

// ---- objects ----

TEST(JsonSchemaObjects, OptionalPropertiesKeepOrderAndCommas) {
  const Grammar g = compile(
      R"({"type":"object","properties":{"a":{"type":"null"},"b":{"type":"null"},"c":{"type":"null"}},"required":["b"]})");
  for (const char *ok : {R"({"b":null})", R"({"a":null,"b":null})", R"({"b":null,"c":null})",
                         R"({"a":null,"b":null,"c":null})", R"({ "a" : null ,
  "b": null})"})
    EXPECT_TRUE(accepts(g, ok)) << ok;
  for (const char *bad :
       {R"({})", R"({"a":null})", R"({"b":null,"a":null})", R"({,"b":null})", R"({"b":null,})",
        R"({"b":null,"d":null})", R"({"b":null,"b":null})", R"( {"b":null})", R"({"b":null}
)"})
    EXPECT_FALSE(accepts(g, bad)) << bad;
}

TEST(JsonSchemaObjects, ExtraKeysNeverRepeatAListedOne) {
  const Grammar g = compile(
      R"({"type":"object","properties":{"id":{"type":"integer"},"":{"type":"null"}},"additionalProperties":{"type":"boolean"}})");
  for (const char *ok : {R"({"id":1,"i":true})", R"({"idx":false,"x":true})",
                         R"({"":null,"d":true})", R"({"id":2,"":null,"é":true})"})
    EXPECT_TRUE(accepts(g, ok)) << ok;
  for (const char *bad : {R"({"id":true})", R"({"":true})", R"({"id":1,"id":true})",
                          R"({"i\u0064":true})", R"({"x":1})"})
    EXPECT_FALSE(accepts(g, bad)) << bad;
  const Grammar free = compile(R"({"type":"object"})");
  EXPECT_TRUE(accepts(free, R"({"a":[1,{"b":"\u00e9"}],"c":null})"));
}

TEST(JsonSchemaObjects, RecursionThroughRefs) {
  const Grammar g = compile(
      R"({"$defs":{"t":{"type":"object","properties":{"v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/t"}}},"required":["v","kids"],"additionalProperties":false}},"$ref":"#/$defs/t"})");
  EXPECT_TRUE(
      accepts(g, R"({"v":1,"kids":[{"v":2,"kids":[]},{"v":3,"kids":[{"v":4,"kids":[]}]}]})"));
  EXPECT_FALSE(accepts(g, R"({"v":1,"kids":[{"v":2}]})"));
  const Grammar root =
      compile(R"({"anyOf":[{"type":"array","items":{"$ref":"#"}},{"type":"integer"}]})");
  EXPECT_TRUE(accepts(root, "[[1,[2]],3,[]]"));
  EXPECT_FALSE(accepts(root, "[[1,[\"2\"]]]"));
}

TEST(JsonSchemaObjects, EnumValuesAreCompactAndFiltered) {
  const Grammar g = compile(R"({"enum":["a\"b",{"k":[1,2.5]},null,"\u00e9",1e2]})");
  for (const char *ok : {R"("a\"b")", R"({"k":[1,2.5]})", "null", "\"\xC3\xA9\"", "100.0"})
    EXPECT_TRUE(accepts(g, ok)) << ok;
  for (const char *bad : {R"({ "k":[1,2.5]})", R"("\u00e9")", "1e2", "100"})
    EXPECT_FALSE(accepts(g, bad)) << bad;
  const Grammar f = compile(R"({"type":"integer","minimum":3,"enum":[1,3,5.0,"x",7]})");
  EXPECT_FALSE(accepts(f, "1"));
  EXPECT_TRUE(accepts(f, "3"));
  EXPECT_TRUE(accepts(f, "5.0")); // an integer, as 2020-12 counts them
  const Grammar big = compile(
      R"({"maximum":9007199254740992,"exclusiveMinimum":0.5,"enum":[9007199254740993,9007199254740992,0.5,0.75,1,-1]})");
  EXPECT_FALSE(accepts(big, "9007199254740993"));
  EXPECT_TRUE(accepts(big, "9007199254740992"));
  EXPECT_FALSE(accepts(big, "0.5"));
  EXPECT_TRUE(accepts(big, "0.75"));
  EXPECT_TRUE(accepts(big, "1"));
  EXPECT_FALSE(accepts(big, "-1"));
  const Grammar m = compile(R"({"multipleOf":3,"enum":[9,9.0,10,"x",4.5]})");
  EXPECT_TRUE(accepts(m, "9"));
  EXPECT_TRUE(accepts(m, "9.0"));
  EXPECT_FALSE(accepts(m, "10"));
  EXPECT_TRUE(accepts(m, "\"x\""));
  EXPECT_FALSE(accepts(m, "4.5"));
  const Grammar p = compile(R"({"type":"string","pattern":"^a","enum":["ab","ba",1]})");
  EXPECT_TRUE(accepts(p, "\"ab\""));
  EXPECT_FALSE(accepts(p, "\"ba\""));
  EXPECT_FALSE(accepts(p, "1"));
  EXPECT_EQ(refusal("{\"pattern\":\"a\",\"const\":\"" + std::string(300, 'a') + "\"}"),
            "'const' at # is too large to check against the keywords beside it (at most 256 "
            "bytes a value and 4,096 in all)");
  EXPECT_FALSE(accepts(f, "\"x\""));
  EXPECT_EQ(refusal(R"({"enum":[12345678901234567890123]})").rfind("'enum' at # holds a value", 0),
            0u);
}

// ---- composition ----

TEST(JsonSchemaCompose, ValuesEmbedAndShareTheirCommonRules) {
  GrammarBuilder b;
  const ojson root = ojson::parse(
      R"({"$defs":{"s":{"type":"string"}},"properties":{"a":{"$ref":"#/$defs/s"},"b":{"type":"string"},"c":{"type":"integer"}}})");
  JsonSchemaCompiler c(b, root);
  auto a = c.value(root["properties"]["a"], "#/properties/a");
  auto s = c.value(root["properties"]["b"], "#/properties/b");
  auto n = c.value(root["properties"]["c"], "#/properties/c");
  ASSERT_TRUE(a.ok() && s.ok() && n.ok());
  const Element ws = c.whitespace();
  // "<" a ws "|" b ws "|" c ">"
  Sequence seq = b.literal("<");
  seq.insert(seq.end(), {*a, ws, b.byte('|'), *s, ws, b.byte('|'), *n, c.any_object()});
  const Element top = b.rule("top", {seq});
  auto g = std::move(b).finish(top.value);
  ASSERT_TRUE(g.ok()) << g.message();
  EXPECT_TRUE(accepts(*g, R"(<"x" |"y"|-3{"k":[]})"));
  EXPECT_FALSE(accepts(*g, R"(<"x"|"y"|3.5{})"));
  size_t strings = 0, spaces = 0;
  for (const Rule &r : g->rules) strings += r.name == "string", spaces += r.name == "ws";
  EXPECT_EQ(strings, 1u);
  EXPECT_EQ(spaces, 1u);
}

TEST(JsonSchemaCompose, JsonObjectGrammar) {
  auto g = json_object_grammar();
  ASSERT_TRUE(g.ok()) << g.message();
  EXPECT_TRUE(accepts(*g, "{}"));
  EXPECT_TRUE(accepts(*g, R"({"a": [1, {"b": null}],
  "a": "dup"})"));
  EXPECT_FALSE(accepts(*g, "[]"));
  EXPECT_FALSE(accepts(*g, " {}"));
  EXPECT_FALSE(accepts(*g, "{} "));
  EXPECT_FALSE(accepts(*g, R"({"a":1,})"));
  EXPECT_FALSE(accepts(*g, "{\"a\":1,\n" + std::string(30, ' ') + "\"b\":2}")); // bounded indent
}

// ---- raw strings ----

Grammar raw_grammar(const std::string &schema, std::string_view terminator) {
  GrammarBuilder b;
  const ojson s = ojson::parse(schema);
  JsonSchemaCompiler c(b, s);
  auto e = c.raw_string(s, "#", terminator);
  EXPECT_TRUE(e.ok()) << schema << ": " << e.message();
  if (!e.ok()) return {};
  const Element root = b.rule("root", {{*e}});
  auto g = std::move(b).finish(root.value);
  EXPECT_TRUE(g.ok()) << g.message();
  return g.ok() ? std::move(g).value() : Grammar{};
}

std::string raw_refusal(const std::string &schema, std::string_view terminator) {
  GrammarBuilder b;
  const ojson s = ojson::parse(schema);
  JsonSchemaCompiler c(b, s);
  auto e = c.raw_string(s, "#", terminator);
  EXPECT_FALSE(e.ok()) << schema;
  return e.ok() ? std::string() : e.message();
}

TEST(JsonSchemaRawString, TextNeverContainsTheTerminator) {
  std::mt19937 rng(5);
  for (const std::string terminator : {"aab", "abab", "</atem:parameter>",
                                       "\xC3\xA9"
                                       "a\xC3\xA9"}) {
    const Grammar g = raw_grammar(R"({"type":"string"})", terminator);
    const Grammar bounded =
        raw_grammar(R"({"type":"string","minLength":2,"maxLength":9})", terminator);
    const std::vector<std::string> pieces = {"a",       "b",          "<",  "/", "\xC3\xA9",
                                             "</atem:", "parameter>", "\"", "\\"};
    for (int i = 0; i < 400; ++i) {
      std::string text;
      const int n = int(rng() % 10);
      for (int k = 0; k < n; ++k) text += pieces[rng() % pieces.size()];
      if (i % 7 == 0) text.insert(rng() % (text.size() + 1), terminator);
      const bool clean = text.find(terminator) == std::string::npos;
      EXPECT_EQ(accepts(g, text), clean) << terminator << " / " << text;
      size_t cps = 0;
      for (unsigned char c : text) cps += (c & 0xC0) != 0x80;
      EXPECT_EQ(accepts(bounded, text), clean && cps >= 2 && cps <= 9)
          << terminator << " / " << text;
    }
  }
}

TEST(JsonSchemaRawString, EnumsPatternsFormatsAndRefusals) {
  const std::string end = "</atem:parameter>";
  const Grammar e = raw_grammar(R"({"enum":["a\"b","c\\d",3]})", end);
  EXPECT_TRUE(accepts(e, "a\"b"));
  EXPECT_TRUE(accepts(e, "c\\d"));
  EXPECT_FALSE(accepts(e, "\"a\\\"b\""));
  EXPECT_FALSE(accepts(e, "3"));
  const Grammar p = raw_grammar(R"({"type":"string","pattern":"^[a-z\"]{1,3}$"})", end);
  EXPECT_TRUE(accepts(p, "a\"b"));
  EXPECT_FALSE(accepts(p, "abcd"));
  const Grammar d = raw_grammar(R"({"type":"string","format":"date"})", end);
  EXPECT_TRUE(accepts(d, "2024-01-31"));
  const Grammar any = raw_grammar(
      R"({"anyOf":[{"type":"string","maxLength":2},{"type":"null"},{"$ref":"#/$defs/s"}],"$defs":{"s":{"const":"xyz"}}})",
      end);
  EXPECT_TRUE(accepts(any, "ab"));
  EXPECT_TRUE(accepts(any, "xyz"));
  EXPECT_FALSE(accepts(any, "abc"));
  EXPECT_EQ(raw_refusal(R"({"type":"string","pattern":"a"})", end),
            "'pattern' at # could match text containing the terminator");
  EXPECT_EQ(raw_refusal(R"({"type":"string","pattern":"^[</atemprs:>]+$"})", end),
            "'pattern' at # could match text containing the terminator");
  EXPECT_EQ(raw_refusal(R"({"enum":["x</atem:parameter>"]})", end),
            "'enum' at # holds a value containing the terminator");
  EXPECT_EQ(raw_refusal(R"({"type":"integer"})", end),
            "'type' at # accepts no string, so it cannot be raw text");
  EXPECT_EQ(raw_refusal(R"({"$ref":"#"})", end),
            "'$ref' at # refers back to '#' without consuming anything (left recursion)");
  // No terminator: the schema's strings as they are (a caller takes markers out itself).
  const Grammar free = raw_grammar(R"({"type":"string","pattern":"^a.c$","maxLength":3})", "");
  EXPECT_TRUE(*grammar_accepts(free, "a<c"));
  EXPECT_FALSE(*grammar_accepts(free, "a<<c"));
  const Grammar listed = raw_grammar(R"({"enum":["x</y>", "z"]})", "");
  EXPECT_TRUE(*grammar_accepts(listed, "x</y>"));
}

// RFC 8259 syntax, by hand (nlohmann refuses numbers past the double range, which JSON allows).
class JsonSyntax {
public:
  static bool valid(std::string_view t) {
    JsonSyntax p{t};
    return p.value(0) && p.i_ == t.size();
  }

private:
  explicit JsonSyntax(std::string_view t) : t_(t) {}
  bool eat(char c) {
    if (i_ < t_.size() && t_[i_] == c) return ++i_, true;
    return false;
  }
  void ws() {
    while (i_ < t_.size() && (t_[i_] == ' ' || t_[i_] == '\t' || t_[i_] == '\n' || t_[i_] == '\r'))
      ++i_;
  }
  bool digits() {
    const size_t start = i_;
    while (i_ < t_.size() && t_[i_] >= '0' && t_[i_] <= '9') ++i_;
    return i_ > start;
  }
  bool number() {
    eat('-');
    if (eat('0')) {
    } else if (i_ < t_.size() && t_[i_] >= '1' && t_[i_] <= '9') {
      digits();
    } else {
      return false;
    }
    if (eat('.') && !digits()) return false;
    if (eat('e') || eat('E')) {
      if (!eat('+')) eat('-');
      if (!digits()) return false;
    }
    return true;
  }
  bool string() {
    if (!eat('"')) return false;
    while (i_ < t_.size()) {
      const auto c = uint8_t(t_[i_++]);
      if (c == '"') return true;
      if (c < 0x20) return false;
      if (c != '\\') continue;
      if (i_ >= t_.size()) return false;
      const char e = t_[i_++];
      if (e == 'u') {
        for (int k = 0; k < 4; ++k, ++i_)
          if (i_ >= t_.size() || !std::isxdigit(uint8_t(t_[i_]))) return false;
      } else if (std::string_view("\"\\/bfnrt").find(e) == std::string_view::npos) {
        return false;
      }
    }
    return false;
  }
  bool value(int depth) {
    if (depth > 200) return false;
    ws();
    bool ok;
    if (eat('{')) {
      ws();
      ok = eat('}');
      while (!ok) {
        ws();
        if (!string()) return false;
        ws();
        if (!eat(':') || !value(depth + 1)) return false;
        ws();
        if (eat('}'))
          ok = true;
        else if (!eat(','))
          return false;
      }
    } else if (eat('[')) {
      ws();
      ok = eat(']');
      while (!ok) {
        if (!value(depth + 1)) return false;
        ws();
        if (eat(']'))
          ok = true;
        else if (!eat(','))
          return false;
      }
    } else if (i_ < t_.size() && t_[i_] == '"') {
      ok = string();
    } else if (t_.substr(i_, 4) == "true" || t_.substr(i_, 4) == "null") {
      i_ += 4;
      ok = true;
    } else if (t_.substr(i_, 5) == "false") {
      i_ += 5;
      ok = true;
    } else {
      ok = number();
    }
    ws();
    return ok;
  }
  std::string_view t_;
  size_t i_ = 0;
};

// ---- robustness: random schemas compile or are refused, never crash or hang ----

ojson random_schema(std::mt19937 &rng, int depth) {
  static const char *keys[] = {"type",
                               "enum",
                               "const",
                               "anyOf",
                               "allOf",
                               "oneOf",
                               "$ref",
                               "$defs",
                               "properties",
                               "required",
                               "additionalProperties",
                               "items",
                               "prefixItems",
                               "minItems",
                               "maxItems",
                               "minLength",
                               "maxLength",
                               "pattern",
                               "format",
                               "minimum",
                               "maximum",
                               "exclusiveMinimum",
                               "exclusiveMaximum",
                               "multipleOf",
                               "uniqueItems",
                               "title"};
  static const char *types[] = {"string", "number",  "integer", "object",
                                "array",  "boolean", "null",    "bogus"};
  static const char *refs[] = {"#",       "#/$defs/a", "#/$defs/b", "#/properties/x",
                               "#/items", "#/nope",    "x"};
  static const char *patterns[] = {"^a+$", "[0-9]{2,3}", "(x|y)*z", "^$",
                                   "(",    "a{2,1}",     "\\d\\W",  "[^\"]"};
  static const char *formats[] = {"date", "uuid", "email", "nope", "ipv6", "uri"};
  auto scalar = [&]() -> ojson {
    switch (rng() % 7) {
    case 0:
      return nullptr;
    case 1:
      return int64_t(rng() % 200) - 100;
    case 2:
      return double(rng() % 1000) / 8.0 - 50;
    case 3:
      return "s" + std::to_string(rng() % 5);
    case 4:
      return rng() % 2 == 0;
    case 5:
      return ojson::array({int64_t(rng() % 3)});
    default:
      return ojson::object();
    }
  };
  if (depth > 4 || rng() % 6 == 0)
    return rng() % 3 ? ojson(ojson::object()) : ojson(rng() % 2 == 0);
  ojson s = ojson::object();
  const int n = int(rng() % 4) + 1;
  for (int i = 0; i < n; ++i) {
    const std::string k = keys[rng() % std::size(keys)];
    ojson v;
    if (k == "type")
      v = types[rng() % std::size(types)];
    else if (k == "enum")
      v = ojson::array({scalar(), scalar(), scalar()});
    else if (k == "anyOf" || k == "allOf" || k == "oneOf" || k == "prefixItems")
      v = ojson::array({random_schema(rng, depth + 1), random_schema(rng, depth + 1)});
    else if (k == "$ref")
      v = refs[rng() % std::size(refs)];
    else if (k == "$defs")
      v = {{"a", random_schema(rng, depth + 1)}, {"b", random_schema(rng, depth + 1)}};
    else if (k == "properties")
      v = {{"x", random_schema(rng, depth + 1)}, {"y", random_schema(rng, depth + 1)}};
    else if (k == "required")
      v = rng() % 2 ? ojson::array({"x"}) : ojson::array({"y", "z"});
    else if (k == "additionalProperties" || k == "items")
      v = random_schema(rng, depth + 1);
    else if (k == "pattern")
      v = patterns[rng() % std::size(patterns)];
    else if (k == "format")
      v = formats[rng() % std::size(formats)];
    else if (k == "const" || k == "title")
      v = scalar();
    else
      v = rng() % 5 ? ojson(int64_t(rng() % 12)) : scalar();
    s[k] = v;
  }
  return s;
}

// The schemas real agent clients send (bench/grammar/corpus, captured from the pinned Claude Code
// and Codex by bench/grammar/capture_schemas.py): each compiles, plain and in OpenAI's strict
// mode, or is refused with a message that names the keyword and its path. The refusal rate is
// printed (docs/structured-output-bench.md carries it).
TEST(JsonSchemaCorpus, RealClientsSchemasCompileOrAreRefusedByName) {
  int files = 0, schemas = 0, refused = 0, refused_strict = 0;
  for (const auto &entry : std::filesystem::directory_iterator(OFFGRAPH_SCHEMA_CORPUS_DIR)) {
    if (entry.path().extension() != ".json") continue;
    ++files;
    std::ifstream in(entry.path());
    const nlohmann::ordered_json corpus = nlohmann::ordered_json::parse(in);
    ASSERT_FALSE(corpus.value("source", "").empty()) << entry.path();
    for (const auto &s : corpus.at("schemas")) {
      ++schemas;
      const std::string where =
          entry.path().filename().string() + " " + s.at("name").get<std::string>();
      for (const bool strict : {false, true}) {
        JsonSchemaOptions o;
        o.strict = strict;
        auto g = json_schema_grammar(s.at("schema"), o);
        if (g.ok()) continue;
        ++(strict ? refused_strict : refused);
        EXPECT_NE(g.message().find("#"), std::string::npos) << where << ": " << g.message();
        std::printf("[ corpus   ] %s%s: %s\n", where.c_str(), strict ? " (strict)" : "",
                    g.message().c_str());
      }
    }
  }
  EXPECT_GE(files, 2);
  EXPECT_GE(schemas, 10);
  std::printf("[ corpus   ] %d schemas in %d files: %d refused, %d refused in strict mode\n",
              schemas, files, refused, refused_strict);
}

// The pinned llama.cpp tree's JSON-schema test cases (tests/test-json-schema-to-grammar.cpp, read
// from the tree): test({ SUCCESS or FAILURE, "name", R"""(schema)""", ... }). Each compiles or is
// refused by name; a case llama.cpp itself expects to fail (an unknown type, an unbalanced pattern)
// is refused here too.
TEST(JsonSchemaCorpus, LlamaCppTestCasesCompileOrAreRefusedByName) {
#ifndef OFFGRAPH_LLAMA_TESTS_DIR
  GTEST_SKIP() << "no pinned llama.cpp tree";
#else
  std::ifstream in(std::filesystem::path(OFFGRAPH_LLAMA_TESTS_DIR) /
                   "test-json-schema-to-grammar.cpp");
  if (!in) GTEST_SKIP() << "no test-json-schema-to-grammar.cpp in " << OFFGRAPH_LLAMA_TESTS_DIR;
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  int cases = 0, refused = 0, not_json = 0;
  const std::string open = "R\"\"\"(", close = ")\"\"\"";
  for (size_t at = text.find("test({"); at != std::string::npos; at = text.find("test({", at + 1)) {
    const size_t status = text.find_first_not_of(" \n\t", at + 6);
    const bool expects_success = text.compare(status, 7, "SUCCESS") == 0;
    const size_t name_at = text.find('"', status) + 1;
    const std::string name = text.substr(name_at, text.find('"', name_at) - name_at);
    const size_t body = text.find(open, name_at);
    ASSERT_NE(body, std::string::npos) << name;
    const std::string schema_text =
        text.substr(body + open.size(), text.find(close, body) - body - open.size());
    const auto schema = ojson::parse(schema_text, nullptr, false);
    if (schema.is_discarded()) { // a case about text that is not JSON at all
      ++not_json;
      continue;
    }
    ++cases;
    auto g = json_schema_grammar(schema);
    if (!expects_success) {
      EXPECT_FALSE(g.ok()) << name << ": llama.cpp refuses it";
    }
    if (g.ok()) continue;
    ++refused;
    EXPECT_NE(g.message().find("#"), std::string::npos) << name << ": " << g.message();
    std::printf("[ corpus   ] llama.cpp '%s'%s: %s\n", name.c_str(),
                expects_success ? "" : " (llama.cpp refuses it too)", g.message().c_str());
  }
  EXPECT_GE(cases, 60);
  std::printf("[ corpus   ] %d llama.cpp cases (%d not JSON): %d refused\n", cases, not_json,
              refused);
#endif
}

TEST(JsonSchemaRobustness, PathologicalInputsFinish) {
  std::string nullables = "^(?:";
  for (int i = 0; i < 5000; ++i) nullables += "a?";
  nullables += ")*$";
  EXPECT_EQ(refusal(ojson{{"type", "string"}, {"pattern", nullables}}.dump()),
            "'pattern' at #: a pattern whose nullable repetitions expand past 100,000 nodes is not "
            "supported (at character 10007)");
  std::string deep;
  for (int i = 0; i < 150; ++i) deep += "(";
  EXPECT_EQ(refusal(ojson{{"type", "string"}, {"pattern", deep}}.dump())
                .rfind("'pattern' at #: groups nested deeper than 100", 0),
            0u);
  for (const auto &[p, text] :
       std::vector<std::pair<const char *, const char *>>{{"^((((a?)*)*)*)*$", "\"aaa\""},
                                                          {"(a{0,10000}){0,3}", "\"aab\""},
                                                          {"^(a|a|a|a)*b$", "\"aab\""},
                                                          {"", "\"aab\""}}) {
    const Grammar g = compile(ojson{{"type", "string"}, {"pattern", p}}.dump());
    EXPECT_TRUE(accepts(g, text)) << p;
  }
  EXPECT_TRUE(
      compile(R"({"type":"string","pattern":")" + std::string(20000, 'x') + "\"}").rules.size() >
      0);
  EXPECT_EQ(refusal(R"({"type":"array","maxItems":1e12})"),
            "'maxItems' at # is 1,000,000,000,000; the limit is 4,294,967,294");
  EXPECT_TRUE(
      json_schema_grammar(ojson::parse(R"({"type":"string","maxLength":3000000000})")).ok());
}

TEST(JsonSchemaRobustness, RandomSchemasCompileOrAreRefused) {
  std::mt19937 rng(2024);
  int compiled = 0;
  for (int i = 0; i < 3000; ++i) {
    const ojson schema = random_schema(rng, 0);
    auto g = json_schema_grammar(schema);
    if (!g.ok()) {
      EXPECT_FALSE(g.message().empty());
      continue;
    }
    ++compiled;
    Sampler sampler(*g);
    for (int k = 0; k < 3; ++k) {
      const std::string text = sampler.sample(rng);
      EXPECT_TRUE(accepts(*g, text)) << schema.dump() << " " << text;
      EXPECT_TRUE(JsonSyntax::valid(text)) << schema.dump() << " " << text;
    }
    GrammarBuilder b;
    JsonSchemaCompiler c(b, schema);
    (void)c.raw_string(schema, "#", "</end>");
  }
  EXPECT_GT(compiled, 300);
}

// Writes random schemas that compile, with random sentences of their grammars, for an offline
// check against jsonschema (OFFGRAPH_RANDOM_SAMPLES=path).
TEST(JsonSchemaRobustness, DISABLED_WriteRandomSchemaSamples) {
  const char *path = std::getenv("OFFGRAPH_RANDOM_SAMPLES");
  ASSERT_NE(path, nullptr);
  std::mt19937 rng(77);
  ojson out = ojson::array();
  for (int i = 0; i < 20000; ++i) {
    const ojson schema = random_schema(rng, 0);
    auto g = json_schema_grammar(schema);
    if (!g.ok()) continue;
    Sampler sampler(*g);
    ojson texts = ojson::array();
    for (int k = 0; k < 8; ++k) texts.push_back(sampler.sample(rng));
    out.push_back({{"schema", schema}, {"samples", texts}});
  }
  std::ofstream(path) << out.dump(-1, ' ', false, ojson::error_handler_t::replace) << "\n";
}

std::string random_pattern(std::mt19937 &rng, int depth) {
  static const char *atoms[] = {
      "a",     "b",    "\\d",    "\\w",    "\\s",       "\\D", "\\W",     "\\S",   ".",
      "[a-c]", "[^a]", "[^\\s]", "[\\d_]", "[^\\W\\d]", "\\.", "\\u00e9", "\\x41", "[\\b]",
      "-",     "\\/",  "\\\\",   "\"",     "[\"x]",     "\\n", "[^\\n]",  "\\t"};
  static const char *quantifiers[] = {"",    "",      "",     "*",  "+", "?",
                                      "{2}", "{1,3}", "{0,}", "*?", "+?"};
  std::string out;
  const int n = 1 + int(rng() % 4);
  for (int i = 0; i < n; ++i) {
    std::string atom = depth < 2 && rng() % 5 == 0
                           ? std::string(rng() % 2 ? "(" : "(?:") + random_pattern(rng, depth + 1) +
                                 (rng() % 3 ? "" : "|" + random_pattern(rng, depth + 1)) + ")"
                           : atoms[rng() % std::size(atoms)];
    out += atom + quantifiers[rng() % std::size(quantifiers)];
  }
  return out;
}

// Writes random patterns that compile, with random sentences of their grammars, for an offline
// check against Python's re (OFFGRAPH_PATTERN_SAMPLES=path).
TEST(JsonSchemaRobustness, DISABLED_WritePatternSamples) {
  const char *path = std::getenv("OFFGRAPH_PATTERN_SAMPLES");
  ASSERT_NE(path, nullptr);
  std::mt19937 rng(31);
  ojson out = ojson::array();
  for (int i = 0; i < 4000; ++i) {
    std::string p = random_pattern(rng, 0);
    if (rng() % 2) p = "^" + p;
    if (rng() % 2) p += "$";
    if (rng() % 6 == 0) p += "|" + random_pattern(rng, 1);
    const ojson schema = {{"type", "string"}, {"pattern", p}};
    auto g = json_schema_grammar(schema);
    if (!g.ok()) continue;
    Sampler sampler(*g);
    ojson texts = ojson::array();
    for (int k = 0; k < 12; ++k) texts.push_back(sampler.sample(rng));
    out.push_back({{"schema", schema}, {"samples", texts}});
  }
  std::ofstream(path) << out.dump(-1, ' ', false, ojson::error_handler_t::replace) << "\n";
}

} // namespace
} // namespace offgraph::sample
