// Numbers: JSON number syntax, integer ranges as digit-string grammars, integer-valued bounds on
// numbers, and multipleOf on integers.
//
// A range of canonical digit strings splits by length, then, within one length, at the first
// digit where the bounds differ: the low digit followed by a suffix at least the low bound's,
// the digits between followed by anything, the high digit followed by a suffix at most the high
// bound's. Bounded numbers have no exponent, so that the integer part decides the comparison.
#include "sample/json_schema_internal.h"

#include <cmath>
#include <limits>

namespace offgraph::sample::json_schema_detail {
namespace {

constexpr double kMaxBound = 1e18; // bounds fit int64 with room for +-1
// At most 100 integer digits and a two-digit exponent: every number written is a finite double
// (nlohmann refuses larger ones) and every integer one Python parses (4,300 digits at most).
constexpr uint32_t kMaxIntegerDigits = 100, kMaxExponentDigits = 2;
// multipleOf: at most 15 digits, so that the value stays exact in a double too.
constexpr uint64_t kMaxMultipleOf = 100, kMaxMultipleDigits = 15;

struct Bound {
  int64_t value = 0;
  bool exclusive = false;
  const char *keyword = "";
};

std::string text_of(const Json &v) {
  return v.dump(-1, ' ', false, Json::error_handler_t::replace);
}

// The bound's value as a long double if it is a number within kMaxBound.
Result<long double> bound_value(const Json &v, const char *key, const std::string &path) {
  if (!v.is_number()) return error("'" + std::string(key) + "' at " + path + " must be a number");
  long double x = v.is_number_unsigned()  ? (long double)v.get<uint64_t>()
                  : v.is_number_integer() ? (long double)v.get<int64_t>()
                                          : (long double)v.get<double>();
  if (!std::isfinite(x) || std::fabs(x) > kMaxBound)
    return error("'" + std::string(key) + "' at " + path + " is " + text_of(v) +
                 "; bounds beyond 10^18 are not supported");
  return x;
}

} // namespace

Element Compiler::any_integer() {
  if (auto it = cache_.find("integer"); it != cache_.end()) return it->second;
  ByteSet nonzero, digit;
  nonzero.set_range('1', '9');
  digit.set_range('0', '9');
  Element digits = *b.repeat("digits", {b.bytes(digit)}, 0, kMaxIntegerDigits - 1);
  Element natural = b.choice("natural", {{b.byte('0')}, {b.bytes(nonzero), digits}});
  Element e = b.choice("integer", {{natural}, {b.byte('-'), natural}});
  cache_.emplace("integer", e);
  cache_.emplace("natural", natural);
  return e;
}

Element Compiler::any_number() {
  if (auto it = cache_.find("number"); it != cache_.end()) return it->second;
  any_integer();
  const Element natural = cache_.at("natural");
  ByteSet digit, e, sign;
  digit.set_range('0', '9');
  e.set('e');
  e.set('E');
  sign.set('+');
  sign.set('-');
  Element digits = *b.repeat("digits1", {b.bytes(digit)}, 1, kUnbounded);
  Element fraction = b.optional("fraction", {b.byte('.'), digits});
  Element exponent = b.optional(
      "exponent", {b.bytes(e), b.optional("sign", {b.bytes(sign)}),
                   *b.repeat("exponent-digits", {b.bytes(digit)}, 1, kMaxExponentDigits)});
  Element number =
      b.rule("number", {{natural, fraction, exponent}, {b.byte('-'), natural, fraction, exponent}});
  cache_.emplace("number", number);
  cache_.emplace("digits1", digits);
  return number;
}

// Digit strings of one length from `lo` to `hi` (lo <= hi), leading zeros allowed.
Element Compiler::fixed_digits_range(const std::string &lo, const std::string &hi) {
  const std::string key = "digits:" + lo + ":" + hi;
  if (auto it = cache_.find(key); it != cache_.end()) return it->second;
  size_t i = 0;
  while (i < lo.size() && lo[i] == hi[i]) ++i;
  Sequence prefix = b.literal(lo.substr(0, i));
  Element e;
  if (i == lo.size()) {
    e = b.rule("digits", {prefix});
  } else {
    auto digits = [&](char from, char to) {
      ByteSet s;
      s.set_range(uint8_t(from), uint8_t(to));
      return b.bytes(s);
    };
    const size_t rest = lo.size() - i - 1;
    std::vector<Sequence> alternatives;
    if (rest == 0) {
      alternatives.push_back({digits(lo[i], hi[i])});
    } else {
      const std::string lo_rest = lo.substr(i + 1), hi_rest = hi.substr(i + 1);
      const bool lo_zero = lo_rest == std::string(rest, '0');
      const bool hi_nine = hi_rest == std::string(rest, '9');
      const char from = char(lo[i] + (lo_zero ? 0 : 1)), to = char(hi[i] - (hi_nine ? 0 : 1));
      if (!lo_zero)
        alternatives.push_back(
            {digits(lo[i], lo[i]), fixed_digits_range(lo_rest, std::string(rest, '9'))});
      if (from <= to) {
        Sequence s = {digits(from, to)};
        for (size_t k = 0; k < rest; ++k) s.push_back(digits('0', '9'));
        alternatives.push_back(std::move(s));
      }
      if (!hi_nine)
        alternatives.push_back(
            {digits(hi[i], hi[i]), fixed_digits_range(std::string(rest, '0'), hi_rest)});
    }
    Element tail = b.choice("digits", std::move(alternatives));
    prefix.push_back(tail);
    e = b.rule("digits", {prefix});
  }
  cache_.emplace(key, e);
  return e;
}

// Canonical decimal integers (no leading zeros) from lo to hi (nullopt: no upper bound).
Element Compiler::digits_range(uint64_t lo, std::optional<uint64_t> hi) {
  const std::string key =
      "range:" + std::to_string(lo) + ":" + (hi ? std::to_string(*hi) : std::string("inf"));
  if (auto it = cache_.find(key); it != cache_.end()) return it->second;
  const std::string a = std::to_string(lo);
  std::vector<Sequence> alternatives;
  const size_t longest = hi ? std::to_string(*hi).size() : a.size();
  for (size_t n = a.size(); n <= longest; ++n) {
    const std::string from = n == a.size() ? a : "1" + std::string(n - 1, '0');
    const std::string to = hi && n == longest ? std::to_string(*hi) : std::string(n, '9');
    alternatives.push_back({fixed_digits_range(from, to)});
  }
  if (!hi) {
    ByteSet nonzero, digit;
    nonzero.set_range('1', '9');
    digit.set_range('0', '9');
    alternatives.push_back(
        {b.bytes(nonzero), *repeat("digits", {b.bytes(digit)}, a.size(), kMaxIntegerDigits - 1)});
  }
  Element e = b.choice("range", std::move(alternatives));
  cache_.emplace(key, e);
  return e;
}

Result<Element> Compiler::multiple_of(uint64_t k, const std::string &path) {
  const std::string key = "multiple:" + std::to_string(k);
  if (auto it = cache_.find(key); it != cache_.end()) return it->second;
  // state(r, n): n digits written (1 to kMaxMultipleDigits), the number so far r modulo k.
  std::vector<uint32_t> rules(k * kMaxMultipleDigits);
  for (uint32_t &r : rules) r = b.declare(path + "/multipleOf");
  auto state = [&](uint64_t r, uint64_t n) { return GrammarBuilder::ref(rules[(n - 1) * k + r]); };
  // Digits from `first` on, after which the number is r' modulo k, grouped by r'.
  auto steps = [&](uint64_t r, char first, uint64_t n) {
    std::map<uint64_t, ByteSet> by_target;
    for (char d = first; d <= '9'; ++d) by_target[(10 * r + uint64_t(d - '0')) % k].set(uint8_t(d));
    std::vector<Sequence> out;
    for (const auto &[target, set] : by_target) out.push_back({b.bytes(set), state(target, n)});
    return out;
  };
  for (uint64_t n = 1; n <= kMaxMultipleDigits; ++n)
    for (uint64_t r = 0; r < k; ++r) {
      std::vector<Sequence> alternatives;
      if (n < kMaxMultipleDigits) alternatives = steps(r, '0', n + 1);
      if (r == 0) alternatives.push_back({});
      if (alternatives.empty()) alternatives.push_back({b.bytes(ByteSet{})}); // a dead end
      b.define(rules[(n - 1) * k + r], std::move(alternatives));
    }
  std::vector<Sequence> natural = steps(0, '1', 1);
  natural.push_back({b.byte('0')});
  Element n = b.choice("multiple", std::move(natural));
  Element e = b.choice("multiple", {{n}, {b.byte('-'), n}});
  cache_.emplace(key, e);
  return e;
}

namespace {

// Tighter of two lower (or upper) bounds: the larger (smaller) value; on a tie, the exclusive.
void tighten(std::optional<Bound> &have, Bound b, bool lower) {
  if (!have || (lower ? b.value > have->value : b.value < have->value) ||
      (b.value == have->value && b.exclusive))
    have = b;
}

} // namespace

Result<Element> Compiler::number_value(const Json &schema, const std::string &path, bool integer) {
  struct Key {
    const char *name;
    bool lower, exclusive;
  };
  constexpr Key kKeys[] = {{"minimum", true, false},
                           {"exclusiveMinimum", true, true},
                           {"maximum", false, false},
                           {"exclusiveMaximum", false, true}};
  std::optional<Bound> lo, hi;
  const char *first_bound = nullptr;
  for (const Key &k : kKeys) {
    auto it = schema.find(k.name);
    if (it == schema.end()) continue;
    if (!first_bound) first_bound = k.name;
    auto x = bound_value(*it, k.name, path);
    if (!x) return x.status();
    if (integer) {
      // The integers within the bound, as an inclusive bound.
      long double v = k.lower ? (k.exclusive ? std::floor(*x) + 1 : std::ceil(*x))
                              : (k.exclusive ? std::ceil(*x) - 1 : std::floor(*x));
      tighten(k.lower ? lo : hi, {int64_t(v), false, k.name}, k.lower);
    } else {
      if (std::floor(*x) != *x)
        return error("'" + std::string(k.name) + "' at " + path + " is " + text_of(*it) +
                     "; only integer bounds are supported on numbers");
      tighten(k.lower ? lo : hi, {int64_t(*x), k.exclusive, k.name}, k.lower);
    }
  }
  if (auto it = schema.find("multipleOf"); it != schema.end()) {
    if (!it->is_number() || it->get<double>() <= 0)
      return error("'multipleOf' at " + path + " must be a number above 0");
    if (first_bound)
      return error("keyword 'multipleOf' at " + path + " alongside '" + first_bound +
                   "' is not supported");
    const double k = it->get<double>();
    if (std::floor(k) != k || k > double(kMaxMultipleOf))
      return error("'multipleOf' at " + path + " is " + text_of(*it) +
                   "; only integers from 1 to " + with_commas(kMaxMultipleOf) + " are supported");
    return multiple_of(uint64_t(k), path);
  }
  if (!lo && !hi) return integer ? any_integer() : any_number();
  if (lo && hi &&
      (lo->value > hi->value || (lo->value == hi->value && (lo->exclusive || hi->exclusive))))
    return error("'" + std::string(hi->keyword) + "' at " + path + " and '" + lo->keyword +
                 "' leave no " + (integer ? "integer" : "number") + " between them");

  ByteSet digit, nonzero;
  digit.set_range('0', '9');
  nonzero.set_range('1', '9');
  std::vector<Sequence> alternatives;
  if (integer) {
    if (!hi || hi->value >= 0)
      alternatives.push_back(
          {digits_range(uint64_t(std::max<int64_t>(lo ? lo->value : 0, 0)),
                        hi ? std::optional<uint64_t>(hi->value) : std::nullopt)});
    if (!lo || lo->value < 0)
      alternatives.push_back(
          {b.byte('-'), digits_range(hi && hi->value < 0 ? uint64_t(-hi->value) : 1,
                                     lo ? std::optional<uint64_t>(-lo->value) : std::nullopt)});
    return b.choice(path, std::move(alternatives));
  }

  any_number();
  const Element some_digits = cache_.at("digits1");
  const Element fraction = b.optional("fraction", {b.byte('.'), some_digits});
  const Element zero_fraction =
      b.optional("zero-fraction", {b.byte('.'), *b.repeat("zeros", {b.byte('0')}, 1, kUnbounded)});
  const Element nonzero_fraction =
      b.rule("nonzero-fraction",
             {{b.byte('.'), *b.repeat("zeros", {b.byte('0')}, 0, kUnbounded), b.bytes(nonzero),
               *b.repeat("digits", {b.bytes(digit)}, 0, kUnbounded)}});
  // |x| with x's sign fixed: at least `low` (exclusive or not), at most `high` if any.
  auto magnitude = [&](Bound low, std::optional<Bound> high, Sequence sign) {
    const uint64_t low_any = uint64_t(low.value) + (low.exclusive ? 1 : 0);
    if (!high || int64_t(low_any) <= high->value - 1) {
      Sequence s = sign;
      s.push_back(
          digits_range(low_any, high ? std::optional<uint64_t>(high->value - 1) : std::nullopt));
      s.push_back(fraction);
      alternatives.push_back(std::move(s));
    }
    if (high && !high->exclusive &&
        (high->value > low.value || (high->value == low.value && !low.exclusive))) {
      Sequence s = sign;
      for (Element e : b.literal(std::to_string(high->value))) s.push_back(e);
      s.push_back(zero_fraction);
      alternatives.push_back(std::move(s));
    }
    if (low.exclusive && (!high || high->value > low.value)) {
      Sequence s = sign;
      for (Element e : b.literal(std::to_string(low.value))) s.push_back(e);
      s.push_back(nonzero_fraction);
      alternatives.push_back(std::move(s));
    }
  };
  // x >= 0, then x < 0 as '-' and its magnitude (so "-0" is never written).
  if (!hi || hi->value > 0 || (hi->value == 0 && !hi->exclusive)) {
    Bound low = lo && lo->value >= 0 ? *lo : Bound{0, false, ""};
    magnitude(low, hi, {});
  }
  if (!lo || lo->value < 0) {
    Bound low = hi && hi->value < 0 ? Bound{-hi->value, hi->exclusive, ""} : Bound{0, true, ""};
    std::optional<Bound> high;
    if (lo) high = Bound{-lo->value, lo->exclusive, ""};
    magnitude(low, high, {b.byte('-')});
  }
  if (alternatives.empty())
    return error("'" + std::string(first_bound) + "' at " + path + " leaves no number");
  return b.choice(path, std::move(alternatives));
}

} // namespace offgraph::sample::json_schema_detail
