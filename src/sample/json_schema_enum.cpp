// enum and const: the values, filtered by the keywords beside them, as literals.
#include "sample/json_schema_internal.h"

#include <algorithm>
#include <array>
#include <cmath>

namespace offgraph::sample::json_schema_detail {
namespace {

constexpr int kMaxScratchDepth = 2; // enum filters within enum filters
constexpr int kMaxValueDepth = 64;

// Whether a value's text is exact: an integer too large for int64 reaches us as a double that
// may differ from it, and Python's jsonschema compares such numbers exactly.
bool exact_value(const Json &v, int budget) {
  if (budget < 0) return false;
  if (v.is_number_float()) {
    const double d = v.get<double>();
    return std::isfinite(d) && !(std::floor(d) == d && std::fabs(d) >= 9007199254740992.0);
  }
  if (v.is_object() || v.is_array())
    for (const Json &i : v)
      if (!exact_value(i, budget - 1)) return false;
  return true;
}

// Keywords an enum value is checked against directly; beside others it goes through a grammar.
constexpr std::array<std::string_view, 8> kDirect = {
    "type",    "minLength",        "maxLength",        "minimum",
    "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"};
// A grammar check costs up to the cube of the text's length (Earley over nested repetitions).
constexpr size_t kMaxCheckedBytes = 256, kMaxCheckedTotal = 4096;

// A JSON integer as sign and magnitude.
struct Integer {
  bool negative;
  uint64_t magnitude;
};
Integer integer_of(const Json &v) {
  if (v.is_number_unsigned()) return {false, v.get<uint64_t>()};
  const int64_t i = v.get<int64_t>();
  return {i < 0, i < 0 ? uint64_t(-(i + 1)) + 1 : uint64_t(i)};
}
int compare(Integer a, Integer b) {
  if (a.negative != b.negative) return a.negative ? -1 : 1;
  const int m = a.magnitude < b.magnitude ? -1 : a.magnitude > b.magnitude ? 1 : 0;
  return a.negative ? -m : m;
}
// Exact comparison of JSON numbers: -1, 0, 1 (Python compares ints and floats exactly).
int compare_numbers(const Json &a, const Json &b) {
  const bool ai = !a.is_number_float(), bi = !b.is_number_float();
  if (ai && bi) return compare(integer_of(a), integer_of(b));
  if (!ai && !bi) {
    const double x = a.get<double>(), y = b.get<double>();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  const double d = ai ? b.get<double>() : a.get<double>();
  const Integer i = integer_of(ai ? a : b);
  int r; // d against i
  const double t = std::floor(d);
  if (t < -9.2e18) {
    r = -1;
  } else if (t >= 1.8e19) {
    r = 1;
  } else {
    const Integer ti = t < 0 ? Integer{true, uint64_t(-t)} : Integer{false, uint64_t(t)};
    r = compare(ti, i);
    if (r == 0 && d != t) r = 1;
  }
  return ai ? -r : r;
}

// The kDirect keywords' values are well formed.
Status check_direct(const Json &siblings, const std::string &path) {
  if (siblings.contains("type")) {
    auto types = allowed_types(siblings, path);
    if (!types) return types.status();
  }
  for (const char *k : {"minLength", "maxLength"}) {
    auto n = count_keyword(siblings, k, path);
    if (!n) return n.status();
  }
  for (const char *k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
    if (const Json *x = find(siblings, k); x && !x->is_number())
      return error("'" + std::string(k) + "' at " + path + " must be a number");
  if (const Json *m = find(siblings, "multipleOf")) {
    const bool integral =
        m->is_number_integer() ||
        (m->is_number_float() && std::floor(m->get<double>()) == m->get<double>() &&
         m->get<double>() < 1.8e19);
    if (!m->is_number() || !integral || (m->is_number_integer() && integer_of(*m).negative) ||
        m->get<double>() <= 0)
      return error("'multipleOf' at " + path + " is " +
                   m->dump(-1, ' ', false, Json::error_handler_t::replace) +
                   "; only positive integers are supported");
  }
  return ok_status();
}

// Whether `v` satisfies `siblings`, all of them keywords in kDirect, checked by check_direct.
bool satisfies(const Json &v, const Json &siblings) {
  if (const Json *t = find(siblings, "type")) {
    auto types = allowed_types(siblings, "#");
    if (!types) return false;
    if (std::none_of(types->begin(), types->end(), [&](const std::string &type) {
          return has_type(v, type) || (type == "number" && has_type(v, "integer"));
        }))
      return false;
    (void)t;
  }
  if (v.is_string()) {
    uint64_t n = 0;
    for (unsigned char c : v.get_ref<const std::string &>()) n += (c & 0xC0) != 0x80;
    auto lo = count_keyword(siblings, "minLength", "#");
    auto hi = count_keyword(siblings, "maxLength", "#");
    if (!lo || !hi || (*lo && n < **lo) || (*hi && n > **hi)) return false;
  }
  if (v.is_number()) {
    struct Bound {
      const char *key;
      bool ok_below, ok_equal; // what the value may be relative to the bound
    };
    for (const Bound &bound :
         {Bound{"minimum", false, true}, Bound{"exclusiveMinimum", false, false},
          Bound{"maximum", true, true}, Bound{"exclusiveMaximum", true, false}}) {
      const Json *x = find(siblings, bound.key);
      if (!x) continue;
      const int c = compare_numbers(v, *x);
      if (c == 0 ? !bound.ok_equal : (c < 0) != bound.ok_below) return false;
    }
    if (const Json *m = find(siblings, "multipleOf")) {
      const uint64_t k =
          m->is_number_float() ? uint64_t(m->get<double>()) : integer_of(*m).magnitude;
      if (v.is_number_float()) {
        const double d = v.get<double>();
        if (std::floor(d) != d || std::fmod(d, double(k)) != 0) return false;
      } else if (integer_of(v).magnitude % k != 0) {
        return false;
      }
    }
  }
  return true;
}

Result<std::vector<const Json *>> values_or_error(std::vector<const Json *> values,
                                                  const char *keyword, const std::string &path) {
  if (values.empty())
    return error("'" + std::string(keyword) + "' at " + path +
                 " has no value that the keywords beside it accept");
  return values;
}

} // namespace

// The enum (or const) values that also satisfy the keywords beside them. Those keywords are
// compiled on their own and each value's text is run through that grammar: a value is kept only
// if the grammar accepts it, which (the grammar being sound) proves it valid.
Result<std::vector<const Json *>> Compiler::enum_candidates(const Json &schema,
                                                            const std::string &path, int depth) {
  std::vector<const Json *> values;
  const Json *e = find(schema, "enum");
  const Json *c = find(schema, "const");
  if (e && !e->is_array()) return error("'enum' at " + path + " must be an array");
  auto exact = [&](const Json &v, const char *keyword) -> Status {
    if (exact_value(v, kMaxValueDepth)) return ok_status();
    return error("'" + std::string(keyword) + "' at " + path + " holds a value nested more than " +
                 std::to_string(kMaxValueDepth) +
                 " deep or a number that may not be exact (an integer beyond 2^53 read as a "
                 "float)");
  };
  if (c) OFFGRAPH_TRY(exact(*c, "const"));
  if (e)
    for (const Json &v : *e) OFFGRAPH_TRY(exact(v, "enum"));
  if (e) {
    for (const Json &v : *e)
      if (!c || nlohmann::json(v) == nlohmann::json(*c)) values.push_back(&v);
  } else {
    values.push_back(c);
  }
  Json siblings = Json::object();
  for (const auto &[key, v] : schema.items())
    if (key != "enum" && key != "const" && !is_annotation(key) && !is_definitions(key) &&
        key != "$id")
      siblings[key] = v;
  std::vector<const Json *> kept;
  if (siblings.empty()) return values_or_error(values, e ? "enum" : "const", path);
  if (scratch_depth_ >= kMaxScratchDepth)
    return error("'enum' at " + path + " alongside other keywords is nested too deeply");
  const bool direct =
      std::all_of(siblings.items().begin(), siblings.items().end(), [](const auto &kv) {
        return std::find(kDirect.begin(), kDirect.end(), kv.key()) != kDirect.end();
      });
  if (direct) {
    OFFGRAPH_TRY(check_direct(siblings, path));
    for (const Json *value : values)
      if (satisfies(*value, siblings)) kept.push_back(value);
    return values_or_error(kept, e ? "enum" : "const", path);
  }
  // Other keywords compile on their own and each value's text is run through their grammar: a
  // value is kept only if the grammar accepts it, which (the grammar being sound) proves it valid.
  GrammarBuilder scratch;
  Compiler check(scratch, root_, options_, scratch_depth_ + 1);
  auto v = check.value(siblings, path, depth);
  if (!v) return v.status();
  const uint32_t top = scratch.declare("check");
  scratch.define(top, {{*v}});
  auto grammar = std::move(scratch).finish(top);
  if (!grammar) return grammar.status();
  size_t total = 0;
  for (const Json *value : values) {
    auto text = dump_json(*value, options_.escape_lt);
    if (!text) continue;
    total += text->size();
    if (text->size() > kMaxCheckedBytes || total > kMaxCheckedTotal)
      return error("'" + std::string(e ? "enum" : "const") + "' at " + path +
                   " is too large to check against the keywords beside it (at most " +
                   with_commas(kMaxCheckedBytes) + " bytes a value and " +
                   with_commas(kMaxCheckedTotal) + " in all)");
    auto accepted = grammar_accepts(*grammar, *text);
    if (!accepted) return accepted.status();
    if (*accepted) kept.push_back(value);
  }
  return values_or_error(kept, e ? "enum" : "const", path);
}

Result<Element> Compiler::enum_value(const Json &schema, const std::string &path, int depth) {
  auto values = enum_candidates(schema, path, depth);
  if (!values) return values.status();
  std::vector<std::string> texts;
  for (const Json *v : *values) {
    auto text = dump_json(*v, options_.escape_lt);
    if (!text)
      return error("'" + std::string(schema.contains("enum") ? "enum" : "const") + "' at " + path +
                   " holds a value that JSON cannot spell (invalid UTF-8 or not finite)");
    if (std::find(texts.begin(), texts.end(), *text) == texts.end()) texts.push_back(*text);
  }
  return literals(path, texts);
}

} // namespace offgraph::sample::json_schema_detail
