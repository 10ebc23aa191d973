// Strings: JSON string content (escapes, lengths), patterns and formats as grammars, and raw
// string content (no quotes, no escapes) that never contains a terminator.
//
// Lengths count code points of the decoded string; each escape is one code point (\u escapes
// stop short of surrogates, so a pair cannot make two escapes one code point).
#include "sample/json_schema_internal.h"

#include <algorithm>
#include <cmath>

namespace offgraph::sample::json_schema_detail {

std::string with_commas(uint64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string child(const std::string &path, std::string_view key) {
  std::string out = path + "/";
  for (char c : key) {
    if (c == '~')
      out += "~0";
    else if (c == '/')
      out += "~1";
    else
      out += c;
  }
  return out;
}

std::optional<std::u32string> decode_utf8(std::string_view text) {
  std::u32string out;
  for (size_t i = 0; i < text.size();) {
    const auto c = uint8_t(text[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > text.size()) return std::nullopt;
    uint32_t cp = n == 1 ? c : c & (0x7F >> n);
    for (size_t k = 1; k < n; ++k) {
      const auto d = uint8_t(text[i + k]);
      if ((d & 0xC0) != 0x80) return std::nullopt;
      cp = (cp << 6) | (d & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return std::nullopt;
    out.push_back(cp);
    i += n;
  }
  return out;
}

std::string encode_utf8(uint32_t c) {
  std::string s;
  if (c < 0x80) {
    s += char(c);
  } else if (c < 0x800) {
    s += char(0xC0 | (c >> 6));
    s += char(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    s += char(0xE0 | (c >> 12));
    s += char(0x80 | ((c >> 6) & 0x3F));
    s += char(0x80 | (c & 0x3F));
  } else {
    s += char(0xF0 | (c >> 18));
    s += char(0x80 | ((c >> 12) & 0x3F));
    s += char(0x80 | ((c >> 6) & 0x3F));
    s += char(0x80 | (c & 0x3F));
  }
  return s;
}

namespace {

bool finite_everywhere(const Json &v) {
  if (v.is_number_float()) return std::isfinite(v.get<double>());
  if (v.is_object() || v.is_array())
    for (const Json &i : v)
      if (!finite_everywhere(i)) return false;
  return true;
}

// ECMA-262 patterns, anchored, each the language of a format or a sound subset of it.
constexpr const char *kYear = "(?:000[1-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-9][0-9]{3})";
constexpr const char *kLeapYear =
    "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)";
constexpr const char *kMonthDay = "(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|"
                                  "(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|"
                                  "02-(?:0[1-9]|1[0-9]|2[0-8]))";
constexpr const char *kTime = "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]+)?"
                              "(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])";
constexpr const char *kOctet = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9][0-9]|[0-9])";
constexpr const char *kH16 = "[0-9A-Fa-f]{1,4}";
// Labels of 1 to 30 characters, at most 8 of them, so a name stays within 253 characters; a
// final alphabetic label, as checkers that want a top-level domain require.
constexpr const char *kLabel = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,28}[A-Za-z0-9])?";
constexpr const char *kAtom = "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]{1,20}";
constexpr const char *kPchar = "(?:[A-Za-z0-9._~!$&'()*+,;=:@-]|%[0-9A-Fa-f]{2})";

std::string date() {
  return std::string("(?:") + kYear + "-" + kMonthDay + "|" + kLeapYear + "-02-29)";
}
std::string ipv4() { return std::string(kOctet) + "(?:\\." + kOctet + "){3}"; }
std::string ipv6() {
  const std::string h = kH16, ls32 = "(?:" + h + ":" + h + "|" + ipv4() + ")";
  auto groups = [&](int n) {
    return n == 0 ? std::string() : "(?:" + h + ":){" + std::to_string(n) + "}";
  };
  auto before = [&](int n) { return "(?:(?:" + h + ":){0," + std::to_string(n) + "}" + h + ")?"; };
  std::string s = "(?:" + groups(6) + ls32 + "|::" + groups(5) + ls32;
  s += "|" + before(0) + "::" + groups(4) + ls32;
  s += "|" + before(1) + "::" + groups(3) + ls32;
  s += "|" + before(2) + "::" + groups(2) + ls32;
  s += "|" + before(3) + "::" + h + ":" + ls32;
  s += "|" + before(4) + "::" + ls32;
  s += "|" + before(5) + "::" + h;
  s += "|" + before(6) + "::)";
  return s;
}
std::string hostname(int labels) {
  return "(?:" + std::string(kLabel) + "\\.){1," + std::to_string(labels - 1) + "}[A-Za-z]{2,30}";
}
std::string uri() {
  const std::string p = kPchar, pct = "%[0-9A-Fa-f]{2}";
  const std::string userinfo = "(?:(?:[A-Za-z0-9._~!$&'()*+,;=:-]|" + pct + ")*@)?";
  const std::string host = "(?:\\[" + ipv6() + "\\]|(?:[A-Za-z0-9._~!$&'()*+,;=-]|" + pct + ")*)";
  const std::string hier = "(?://" + userinfo + host + "(?::[0-9]*)?(?:/" + p + "*)*|/(?:" + p +
                           "+(?:/" + p + "*)*)?|" + p + "+(?:/" + p + "*)*|)";
  return "[A-Za-z][A-Za-z0-9+.-]*:" + hier + "(?:\\?(?:" + p + "|[/?])*)?(?:#(?:" + p + "|[/?])*)?";
}

} // namespace

const char *format_pattern(std::string_view format) {
  static const std::vector<std::pair<std::string, std::string>> formats = {
      {"date", "^" + date() + "$"},
      {"time", std::string("^") + kTime + "$"},
      {"date-time", "^" + date() + "T" + kTime + "$"},
      {"duration", "^P(?:(?:[0-9]+D|[0-9]+M(?:[0-9]+D)?|[0-9]+Y(?:[0-9]+M(?:[0-9]+D)?)?)"
                   "(?:T(?:[0-9]+H(?:[0-9]+M(?:[0-9]+S)?)?|[0-9]+M(?:[0-9]+S)?|[0-9]+S))?"
                   "|T(?:[0-9]+H(?:[0-9]+M(?:[0-9]+S)?)?|[0-9]+M(?:[0-9]+S)?|[0-9]+S)|[0-9]+W)$"},
      {"uuid", "^[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}$"},
      {"ipv4", "^" + ipv4() + "$"},
      {"ipv6", "^" + ipv6() + "$"},
      {"hostname", "^" + hostname(8) + "$"},
      {"email", std::string("^") + kAtom + "(?:\\." + kAtom + "){0,2}@" + hostname(6) + "$"},
      {"uri", "^" + uri() + "$"},
  };
  for (const auto &[name, pattern] : formats)
    if (name == format) return pattern.c_str();
  return nullptr;
}

std::optional<std::string> dump_json(const Json &value, bool escape_lt) {
  if (!finite_everywhere(value)) return std::nullopt;
  try {
    std::string text = value.dump(-1, ' ', false, Json::error_handler_t::strict);
    if (!escape_lt) return text;
    // Outside strings JSON has no '<': every one is inside a string, where \u003c stands for it.
    std::string out;
    for (char c : text) {
      if (c == '<')
        out += "\\u003c";
      else
        out += c;
    }
    return out;
  } catch (const Json::exception &) {
    return std::nullopt;
  }
}

// One code point of JSON string content, written plainly or escaped (\u: no surrogates).
Element Compiler::json_char() {
  if (auto it = cache_.find("char"); it != cache_.end()) return it->second;
  Ranges escaped = {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}};
  if (options_.escape_lt) escaped.push_back({'<', '<'});
  Element plain = *b.code_points(escaped, true);
  ByteSet simple, hex, hex_no_d, low;
  for (char c : std::string("\"\\/bfnrt")) simple.set(uint8_t(c));
  hex.set_range('0', '9');
  hex.set_range('a', 'f');
  hex.set_range('A', 'F');
  hex_no_d.set_range('0', '9');
  hex_no_d.set_range('a', 'c');
  hex_no_d.set_range('A', 'C');
  hex_no_d.set_range('e', 'f');
  hex_no_d.set_range('E', 'F');
  low.set_range('0', '7');
  ByteSet d;
  d.set('d');
  d.set('D');
  const Element h = b.bytes(hex);
  Element u = b.choice("hex4", {{b.bytes(hex_no_d), h, h, h}, {b.bytes(d), b.bytes(low), h, h}});
  Element escape = b.choice("escape", {{b.bytes(simple)}, {b.byte('u'), u}});
  Element e = b.choice("char", {{plain}, {b.byte('\\'), escape}});
  cache_.emplace("char", e);
  return e;
}

Element Compiler::json_chars() {
  if (auto it = cache_.find("string-chars"); it != cache_.end()) return it->second;
  Element e = *b.repeat("string-chars", {json_char()}, 0, kUnbounded);
  cache_.emplace("string-chars", e);
  return e;
}

Element Compiler::code_point() {
  if (auto it = cache_.find("code-point"); it != cache_.end()) return it->second;
  Element e = b.any_code_point();
  cache_.emplace("code-point", e);
  return e;
}

Element Compiler::any_text() {
  if (auto it = cache_.find("text"); it != cache_.end()) return it->second;
  Element e = *b.repeat("text", {code_point()}, 0, kUnbounded);
  cache_.emplace("text", e);
  return e;
}

// One code point of `set`: raw, or for JSON with '"', '\' and controls escaped.
Element Compiler::char_set(const Ranges &set, Encoding enc) {
  std::string key = enc == Encoding::kJson ? "set:" : "raw-set:";
  for (const auto &[lo, hi] : set) key += std::to_string(lo) + "-" + std::to_string(hi) + ",";
  if (auto it = cache_.find(key); it != cache_.end()) return it->second;
  std::vector<Sequence> alternatives;
  if (enc == Encoding::kRaw) {
    alternatives.push_back({*b.code_points(set, false)});
  } else {
    Ranges special = {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}};
    if (options_.escape_lt) special.push_back({'<', '<'});
    const Ranges plain = subtract(set, special);
    if (!plain.empty()) alternatives.push_back({*b.code_points(plain, false)});
    auto hex_digit = [&](uint32_t v) {
      ByteSet s;
      if (v < 10) {
        s.set(uint8_t('0' + v));
      } else {
        s.set(uint8_t('a' + v - 10));
        s.set(uint8_t('A' + v - 10));
      }
      return b.bytes(s);
    };
    for (uint32_t c = 0; c <= '\\'; ++c) {
      if (!contains(set, c) || !contains(special, c)) continue;
      static constexpr std::pair<uint32_t, char> kShort[] = {{'"', '"'},  {'\\', '\\'}, {'\b', 'b'},
                                                             {'\f', 'f'}, {'\n', 'n'},  {'\r', 'r'},
                                                             {'\t', 't'}};
      for (const auto &[code, letter] : kShort)
        if (code == c) alternatives.push_back({b.byte('\\'), b.byte(uint8_t(letter))});
      Sequence u = b.literal("\\u00");
      u.push_back(hex_digit(c >> 4));
      u.push_back(hex_digit(c & 15));
      alternatives.push_back(std::move(u));
    }
    if (contains(set, '/')) alternatives.push_back(b.literal("\\/"));
  }
  Element e = alternatives.size() == 1 && alternatives[0].size() == 1
                  ? alternatives[0][0]
                  : b.choice("char-set", std::move(alternatives));
  cache_.emplace(key, e);
  return e;
}

Result<Sequence> Compiler::regex_node(const RegexNode &node, Encoding enc) {
  switch (node.kind) {
  case RegexNode::Kind::kEmpty:
    return Sequence{};
  case RegexNode::Kind::kSet:
    return Sequence{char_set(node.set, enc)};
  case RegexNode::Kind::kConcat: {
    Sequence out;
    for (const RegexNode &i : node.items) {
      auto s = regex_node(i, enc);
      if (!s) return s;
      out.insert(out.end(), s->begin(), s->end());
    }
    return out;
  }
  case RegexNode::Kind::kAlt: {
    std::vector<Sequence> alternatives;
    for (const RegexNode &i : node.items) {
      auto s = regex_node(i, enc);
      if (!s) return s;
      alternatives.push_back(std::move(*s));
    }
    return Sequence{b.choice("pattern", std::move(alternatives))};
  }
  case RegexNode::Kind::kRepeat: {
    auto item = regex_node(node.items[0], enc);
    if (!item) return item;
    auto r = repeat("pattern", *item, node.min, node.max);
    if (!r) return r.status();
    return Sequence{*r};
  }
  }
  return Sequence{};
}

Result<Sequence> Compiler::pattern_content(const Pattern &pattern, Encoding enc) {
  // An unanchored end lets any text stand there: JSON Schema patterns are searched for.
  const Element free = enc == Encoding::kJson ? json_chars() : any_text();
  std::vector<Sequence> alternatives;
  for (const Pattern::Branch &branch : pattern.branches) {
    Sequence s;
    if (!branch.anchored_start) s.push_back(free);
    auto body = regex_node(branch.node, enc);
    if (!body) return body;
    s.insert(s.end(), body->begin(), body->end());
    if (!branch.anchored_end) s.push_back(free);
    alternatives.push_back(std::move(s));
  }
  if (alternatives.size() == 1) return alternatives[0];
  return Sequence{b.choice("pattern", std::move(alternatives))};
}

Result<Sequence> Compiler::string_content(const Json &schema, const std::string &path, Encoding enc,
                                          std::string_view terminator) {
  auto min_length = count_keyword(schema, "minLength", path);
  if (!min_length) return min_length.status();
  auto max_length = count_keyword(schema, "maxLength", path);
  if (!max_length) return max_length.status();
  const uint64_t lo = min_length->value_or(0), hi = max_length->value_or(kUnbounded);
  if (lo >= kUnbounded || (max_length->has_value() && hi >= kUnbounded))
    return Status::error("'" + std::string(lo >= kUnbounded ? "minLength" : "maxLength") + "' at " +
                         path + " is beyond " + with_commas(kUnbounded - 1));
  if (hi < lo) return Status::error("'maxLength' at " + path + " is less than 'minLength'");
  const bool bounded = lo > 0 || hi != kUnbounded;

  const auto format = schema.find("format");
  const auto pattern_text = schema.find("pattern");
  if (format != schema.end() && pattern_text != schema.end())
    return Status::error("keyword 'pattern' at " + path + " alongside 'format' is not supported");
  std::optional<Pattern> pattern;
  const char *keyword = "pattern";
  if (format != schema.end()) {
    keyword = "format";
    const char *fp = format->is_string() ? format_pattern(format->get<std::string>()) : nullptr;
    if (!fp)
      return Status::error("'format' at " + path + " is " +
                           format->dump(-1, ' ', false, Json::error_handler_t::replace) +
                           ", which is not supported");
    auto p = parse_pattern(fp, "'format' at " + path);
    if (!p) return p.status();
    pattern = std::move(*p);
  } else if (pattern_text != schema.end()) {
    if (!pattern_text->is_string())
      return Status::error("'pattern' at " + path + " must be a string");
    auto p = parse_pattern(pattern_text->get<std::string>(), "'pattern' at " + path);
    if (!p) return p.status();
    pattern = std::move(*p);
  }
  if (!pattern) {
    if (enc == Encoding::kRaw) {
      auto e = text_without(terminator, uint32_t(lo), uint32_t(hi), path);
      if (!e) return e.status();
      return Sequence{*e};
    }
    if (!bounded) return Sequence{json_chars()};
    const std::string key = "chars:" + std::to_string(lo) + ":" + std::to_string(hi);
    if (auto it = cache_.find(key); it != cache_.end()) return Sequence{it->second};
    auto e = repeat("string-chars", {json_char()}, lo, hi);
    if (!e) return e.status();
    cache_.emplace(key, *e);
    return Sequence{*e};
  }

  if (bounded && !(pattern->min_length() >= lo && pattern->max_length() <= hi)) {
    // One class repeated, anchored at both ends, takes the length bounds into its repetition.
    Pattern::Branch *only = pattern->branches.size() == 1 ? &pattern->branches[0] : nullptr;
    RegexNode *node = only && only->anchored_start && only->anchored_end ? &only->node : nullptr;
    if (node && node->kind == RegexNode::Kind::kSet) {
      RegexNode r;
      r.kind = RegexNode::Kind::kRepeat;
      r.min = r.max = 1;
      r.items = {std::move(*node)};
      *node = std::move(r);
    }
    if (!node || node->kind != RegexNode::Kind::kRepeat ||
        node->items[0].kind != RegexNode::Kind::kSet)
      return Status::error("keyword '" + std::string(lo > 0 ? "minLength" : "maxLength") + "' at " +
                           path + " alongside '" + keyword +
                           "' is not supported (unless the pattern is one anchored class "
                           "repeated, or keeps to the length by itself)");
    node->min = uint32_t(std::max<uint64_t>(node->min, lo));
    node->max = uint32_t(std::min<uint64_t>(node->max, hi));
    if (node->min > node->max)
      return Status::error("'" + std::string(keyword) + "' at " + path +
                           " and the length keywords leave no string");
  }
  if (enc == Encoding::kRaw) {
    auto cps = decode_utf8(terminator);
    const Ranges alphabet = pattern->alphabet();
    if (!cps || (!cps->empty() && std::all_of(cps->begin(), cps->end(),
                                              [&](uint32_t c) { return contains(alphabet, c); })))
      return Status::error("'" + std::string(keyword) + "' at " + path +
                           " could match text containing the terminator");
  }
  return pattern_content(*pattern, enc);
}

Result<Element> Compiler::string_value(const Json &schema, const std::string &path) {
  bool plain = true;
  for (const char *k : {"minLength", "maxLength", "pattern", "format"})
    plain &= !schema.contains(k);
  if (plain) return any_string();
  auto content = string_content(schema, path, Encoding::kJson, {});
  if (!content) return content.status();
  Sequence s = {b.byte('"')};
  s.insert(s.end(), content->begin(), content->end());
  s.push_back(b.byte('"'));
  return b.rule(path, {std::move(s)});
}

// Text from `min` to `max` code points that never contains `terminator`: the states of a KMP
// automaton over its code points as rules (how much of the terminator the text ends with), times
// the count written so far when the length is bounded.
Result<Element> Compiler::text_without(std::string_view terminator, uint32_t min, uint32_t max,
                                       const std::string &path) {
  if (terminator.empty()) { // no terminator: any text of that length
    if (min == 0 && max == kUnbounded) return any_text();
    return repeat("text", {code_point()}, min, max);
  }
  auto t = decode_utf8(terminator);
  if (!t) return Status::error("the terminator must be valid UTF-8");
  const size_t k = t->size();
  if (max != kUnbounded && max < k) return repeat("text", {code_point()}, min, max);
  const std::string key =
      "text:" + std::string(terminator) + ":" + std::to_string(min) + ":" + std::to_string(max);
  if (auto it = cache_.find(key); it != cache_.end()) return it->second;
  const uint64_t counts = (max == kUnbounded ? uint64_t(min) : uint64_t(max)) + 1;
  constexpr uint64_t kMaxStates = 20000;
  if (counts * k > kMaxStates)
    return Status::error("'" + std::string(max == kUnbounded ? "minLength" : "maxLength") +
                         "' at " + path + " with a terminator of " + std::to_string(k) +
                         " characters needs more than " + with_commas(kMaxStates) + " rules");
  std::vector<size_t> fail(k, 0); // KMP failure function
  for (size_t i = 1, j = 0; i < k; ++i) {
    while (j > 0 && (*t)[i] != (*t)[j]) j = fail[j - 1];
    if ((*t)[i] == (*t)[j]) ++j;
    fail[i] = j;
  }
  auto step = [&](size_t s, uint32_t c) {
    while (s > 0 && (*t)[s] != c) s = fail[s - 1];
    return (*t)[s] == c ? s + 1 : 0;
  };
  std::vector<uint32_t> rules(k * counts);
  for (uint32_t &r : rules) r = b.declare("text-without");
  auto rule = [&](size_t s, uint64_t n) { return GrammarBuilder::ref(rules[n * k + s]); };
  for (uint64_t n = 0; n < counts; ++n) {
    const uint64_t next = max == kUnbounded ? std::min<uint64_t>(n + 1, min) : n + 1;
    for (size_t s = 0; s < k; ++s) {
      std::vector<Sequence> alternatives;
      if (n >= min) alternatives.push_back({});
      if (max == kUnbounded || n < max) {
        Ranges seen;
        for (size_t i = 0; i <= s; ++i) {
          const uint32_t c = (*t)[i];
          if (contains(seen, c)) continue;
          seen = unite(seen, {{c, c}});
          const size_t to = step(s, c);
          if (to == k) continue; // the terminator would be complete
          Sequence a = b.literal(encode_utf8(c));
          a.push_back(rule(to, next));
          alternatives.push_back(std::move(a));
        }
        alternatives.push_back({*b.code_points(seen, true), rule(0, next)});
      }
      b.define(rules[n * k + s], std::move(alternatives));
    }
  }
  Element e = rule(0, 0);
  cache_.emplace(key, e);
  return e;
}

Result<Element> Compiler::raw_enum(const Json &schema, const std::string &path,
                                   std::string_view terminator, int depth) {
  auto values = enum_candidates(schema, path, depth);
  if (!values) return values.status();
  const char *keyword = schema.contains("enum") ? "enum" : "const";
  std::vector<std::string> seen;
  for (const Json *v : *values) {
    if (!v->is_string()) continue;
    const std::string &s = v->get_ref<const std::string &>();
    if (!decode_utf8(s))
      return Status::error("'" + std::string(keyword) + "' at " + path +
                           " holds a string that is not valid UTF-8");
    if (!terminator.empty() && s.find(terminator) != std::string::npos)
      return Status::error("'" + std::string(keyword) + "' at " + path +
                           " holds a value containing the terminator");
    if (std::find(seen.begin(), seen.end(), s) == seen.end()) seen.push_back(s);
  }
  if (seen.empty())
    return Status::error("'" + std::string(keyword) + "' at " + path + " holds no string");
  return literals(path, seen);
}

Result<Element> Compiler::raw_string(const Json &schema, const std::string &path,
                                     std::string_view terminator, int depth) {
  if (depth > 100) return Status::error("the schema at " + path + " nests too deeply");
  if (schema.is_boolean()) {
    if (schema.get<bool>()) return text_without(terminator, 0, kUnbounded, path);
    return Status::error("the schema at " + path + " is false, which accepts no value");
  }
  if (!schema.is_object())
    return Status::error("the schema at " + path + " must be an object or a boolean");
  OFFGRAPH_TRY(check_keywords(schema, path, &schema == &root_));
  if (schema.contains("$ref")) {
    OFFGRAPH_TRY(check_alone(schema, path, "$ref"));
    auto target = resolve_ref(schema, path);
    if (!target) return target.status();
    if (std::find(raw_chain_.begin(), raw_chain_.end(), target->second) != raw_chain_.end())
      return Status::error("'$ref' at " + path + " refers back to '" + target->second +
                           "' without consuming anything (left recursion)");
    raw_chain_.push_back(target->second);
    auto r = raw_string(*target->first, target->second, terminator, depth + 1);
    raw_chain_.pop_back();
    return r;
  }
  if (const Json *any = schema.contains("anyOf") ? &schema["anyOf"] : nullptr) {
    OFFGRAPH_TRY(check_alone(schema, path, "anyOf"));
    if (!any->is_array() || any->empty())
      return Status::error("'anyOf' at " + path + " must be a non-empty array");
    std::vector<Sequence> alternatives;
    for (size_t i = 0; i < any->size(); ++i) {
      const Json &branch = (*any)[i];
      if (branch.is_boolean() && !branch.get<bool>()) continue;
      if (branch.is_object() && branch.contains("type") && !branch.contains("$ref")) {
        auto types = allowed_types(branch, path);
        if (types && std::find(types->begin(), types->end(), "string") == types->end())
          continue; // accepts no string, so adds no text
      }
      auto r =
          raw_string(branch, child(child(path, "anyOf"), std::to_string(i)), terminator, depth + 1);
      if (!r) return r;
      alternatives.push_back({*r});
    }
    if (alternatives.empty()) return Status::error("'anyOf' at " + path + " accepts no string");
    return b.choice(path, std::move(alternatives));
  }
  if (schema.contains("allOf")) {
    OFFGRAPH_TRY(check_alone(schema, path, "allOf"));
    const Json &all = schema["allOf"];
    if (!all.is_array() || all.size() != 1)
      return Status::error("keyword 'allOf' at " + path + " is supported only with one subschema");
    return raw_string(all[0], child(child(path, "allOf"), "0"), terminator, depth + 1);
  }
  if (schema.contains("enum") || schema.contains("const"))
    return raw_enum(schema, path, terminator, depth);
  auto types = allowed_types(schema, path);
  if (!types) return types.status();
  if (std::find(types->begin(), types->end(), "string") == types->end())
    return Status::error("'type' at " + path + " accepts no string, so it cannot be raw text");
  auto content = string_content(schema, path, Encoding::kRaw, terminator);
  if (!content) return content.status();
  if (content->size() == 1) return (*content)[0];
  return b.rule(path, {std::move(*content)});
}

} // namespace offgraph::sample::json_schema_detail
