// Attribute/item access, the str/dict/list methods the immutable sandbox allows, and operators,
// each following CPython's behaviour for the values templates handle.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "text/template/jinja_builtins.h"

namespace offgraph::text::jinja {
namespace {

// Jinja2's object_type_repr, quoted for "has no attribute" and bare for "has no element".
std::string type_repr(const Value &v, bool quoted = true) {
  std::string r = v.is_none() ? "None" : std::string(v.type_name()) + " object";
  return quoted ? "'" + r + "'" : r;
}

// Python's str.strip family, by code point: Unicode whitespace, or the characters of `chars`.
std::string strip_chars(const std::string &s, const Value &chars, bool left, bool right) {
  std::vector<std::string> set;
  if (chars.is_string()) set = utf8_chars(chars.as_string());
  auto strip = [&](const std::string &ch) {
    return chars.is_string() ? std::find(set.begin(), set.end(), ch) != set.end()
                             : utf8_is_space(ch);
  };
  auto cs = utf8_chars(s);
  size_t b = 0, e = cs.size();
  if (left)
    while (b < e && strip(cs[b])) ++b;
  if (right)
    while (e > b && strip(cs[e - 1])) --e;
  std::string out;
  for (size_t i = b; i < e; ++i) out += cs[i];
  return out;
}

List split(const std::string &s, const Value &sep, int64_t maxsplit, bool from_right) {
  List out;
  if (!sep.is_string()) {
    // Runs of whitespace; leading and trailing whitespace ignored.
    std::vector<std::pair<size_t, size_t>> words; // byte ranges
    size_t pos = 0;
    bool in_word = false;
    for (const std::string &ch : utf8_chars(s)) {
      bool space = utf8_is_space(ch);
      if (!space && !in_word) words.emplace_back(pos, pos);
      in_word = !space;
      pos += ch.size();
      if (in_word) words.back().second = pos;
    }
    if (maxsplit >= 0 && static_cast<int64_t>(words.size()) > maxsplit + 1) {
      if (from_right) {
        size_t keep = words.size() - static_cast<size_t>(maxsplit);
        std::string head = strip_chars(s.substr(0, words[keep - 1].second), Value(), true, false);
        out.push_back(Value(head));
        for (size_t k = keep; k < words.size(); ++k)
          out.push_back(Value(s.substr(words[k].first, words[k].second - words[k].first)));
      } else {
        for (size_t k = 0; k < static_cast<size_t>(maxsplit); ++k)
          out.push_back(Value(s.substr(words[k].first, words[k].second - words[k].first)));
        out.push_back(Value(strip_chars(s.substr(words[maxsplit].first), Value(), false, true)));
      }
      return out;
    }
    for (auto [b, e] : words) out.push_back(Value(s.substr(b, e - b)));
    return out;
  }
  const std::string &d = sep.as_string();
  if (d.empty()) throw TemplateError("empty separator");
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t p = s.find(d); p != std::string::npos; p = s.find(d, start)) {
    parts.push_back(s.substr(start, p - start));
    start = p + d.size();
  }
  parts.push_back(s.substr(start));
  if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) > maxsplit + 1) {
    std::vector<std::string> merged;
    size_t m = static_cast<size_t>(maxsplit);
    if (from_right) {
      std::string head = parts[0];
      for (size_t k = 1; k < parts.size() - m; ++k) head += d + parts[k];
      merged.push_back(head);
      for (size_t k = parts.size() - m; k < parts.size(); ++k) merged.push_back(parts[k]);
    } else {
      for (size_t k = 0; k < m; ++k) merged.push_back(parts[k]);
      std::string tail = parts[m];
      for (size_t k = m + 1; k < parts.size(); ++k) tail += d + parts[k];
      merged.push_back(tail);
    }
    parts = merged;
  }
  for (auto &p : parts) out.push_back(Value(p));
  return out;
}

std::string replace_all(const std::string &s, const std::string &from, const std::string &to,
                        int64_t count) {
  std::string out;
  if (from.empty()) {
    // Python inserts `to` between characters and at both ends.
    auto chars = utf8_chars(s);
    int64_t n = 0;
    for (const auto &c : chars) {
      if (count < 0 || n++ < count) out += to;
      out += c;
    }
    if (count < 0 || n < count) out += to;
    return out;
  }
  size_t start = 0;
  int64_t n = 0;
  for (size_t p = s.find(from); p != std::string::npos && (count < 0 || n < count);
       p = s.find(from, start), ++n) {
    out += s.substr(start, p - start) + to;
    start = p + from.size();
  }
  return out + s.substr(start);
}

bool affix_match(const std::string &s, const Value &affix, bool prefix) {
  auto one = [&](const Value &a) {
    if (!a.is_string()) throw TemplateError("startswith/endswith first arg must be str or tuple");
    const std::string &x = a.as_string();
    if (x.size() > s.size()) return false;
    return prefix ? s.compare(0, x.size(), x) == 0
                  : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (affix.is_list()) return std::any_of(affix.as_list().begin(), affix.as_list().end(), one);
  return one(affix);
}

std::string to_lower(const std::string &s) { return utf8_lower(s); }
std::string to_upper(const std::string &s) { return utf8_upper(s); }

// str.format with {} / {0} / {name} fields; format specs are not supported.
std::string str_format(const std::string &fmt, CallArgs &a) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    char c = fmt[i];
    if (c == '{' && i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      ++i;
    } else if (c == '}' && i + 1 < fmt.size() && fmt[i + 1] == '}') {
      out += '}';
      ++i;
    } else if (c == '{') {
      size_t e = fmt.find('}', i);
      if (e == std::string::npos) throw TemplateError("Single '{' encountered in format string");
      std::string field = fmt.substr(i + 1, e - i - 1);
      if (field.find(':') != std::string::npos || field.find('!') != std::string::npos)
        throw TemplateError("format specs in str.format are not supported");
      Value v;
      if (field.empty()) {
        if (auto_index >= a.positional.size())
          throw TemplateError("Replacement index out of range");
        v = a.positional[auto_index++];
      } else if (std::isdigit(static_cast<unsigned char>(field[0]))) {
        size_t k = std::stoul(field);
        if (k >= a.positional.size()) throw TemplateError("Replacement index out of range");
        v = a.positional[k];
      } else {
        v = a.get(static_cast<size_t>(-1), field);
        if (v.is_undefined()) throw TemplateError("KeyError: '" + field + "'");
      }
      out += v.str();
      i = e;
    } else {
      out += c;
    }
  }
  return out;
}

Value string_method(const std::string &s, const std::string &m, CallArgs &a) {
  if (m == "strip") return Value(strip_chars(s, a.get(0, "chars"), true, true));
  if (m == "lstrip") return Value(strip_chars(s, a.get(0, "chars"), true, false));
  if (m == "rstrip") return Value(strip_chars(s, a.get(0, "chars"), false, true));
  if (m == "split" || m == "rsplit") {
    Value n = a.get(1, "maxsplit");
    return Value(split(s, a.get(0, "sep"), n.is_number() ? n.as_int() : -1, m == "rsplit"));
  }
  if (m == "startswith") return Value(affix_match(s, a.get(0, "prefix"), true));
  if (m == "endswith") return Value(affix_match(s, a.get(0, "suffix"), false));
  if (m == "upper") return Value(to_upper(s));
  if (m == "lower") return Value(to_lower(s));
  if (m == "capitalize") {
    auto chars = utf8_chars(s);
    std::string out;
    for (size_t i = 0; i < chars.size(); ++i) out += i ? to_lower(chars[i]) : to_upper(chars[i]);
    return Value(out);
  }
  if (m == "title") {
    std::string out;
    bool prev_cased = false;
    for (const std::string &ch : utf8_chars(s)) {
      bool cased = utf8_is_cased(ch);
      out += cased ? (prev_cased ? to_lower(ch) : to_upper(ch)) : ch;
      prev_cased = cased;
    }
    return Value(out);
  }
  if (m == "replace") {
    Value n = a.get(2, "count");
    return Value(replace_all(s, a.get(0, "old").str(), a.get(1, "new").str(),
                             n.is_number() ? n.as_int() : -1));
  }
  if (m == "find" || m == "rfind" || m == "index") {
    std::string sub = a.get(0, "sub").str();
    size_t p = m == "rfind" ? s.rfind(sub) : s.find(sub);
    if (p == std::string::npos) {
      if (m == "index") throw TemplateError("substring not found");
      return Value(-1);
    }
    return Value(static_cast<int64_t>(utf8_length(s.substr(0, p))));
  }
  if (m == "count") {
    std::string sub = a.get(0, "x").str();
    if (sub.empty()) return Value(static_cast<int64_t>(utf8_length(s) + 1));
    int64_t n = 0;
    for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
    return Value(n);
  }
  if (m == "join") {
    std::string out;
    bool first = true;
    for (const Value &v : iterate(a.get(0, "iterable"))) {
      if (!v.is_string()) throw TemplateError("sequence item: expected str instance");
      out += (first ? "" : s) + v.as_string();
      first = false;
    }
    return Value(out);
  }
  if (m == "format") return Value(str_format(s, a));
  if (m == "splitlines") {
    List out;
    size_t start = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] == '\n' || s[i] == '\r') {
        out.push_back(Value(s.substr(start, i - start)));
        if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
        start = i + 1;
      }
    }
    if (start < s.size()) out.push_back(Value(s.substr(start)));
    return Value(out);
  }
  auto all = [&](int (*pred)(int)) {
    if (s.empty()) return Value(false);
    return Value(std::all_of(s.begin(), s.end(),
                             [&](char c) { return pred(static_cast<unsigned char>(c)) != 0; }));
  };
  if (m == "isdigit") return all(std::isdigit);
  if (m == "isalpha") return all(std::isalpha);
  if (m == "isalnum") return all(std::isalnum);
  if (m == "isspace") return all(std::isspace);
  if (m == "islower") return Value(!s.empty() && to_lower(s) == s && to_upper(s) != s);
  if (m == "isupper") return Value(!s.empty() && to_upper(s) == s && to_lower(s) != s);
  throw TemplateError("'str' object has no attribute '" + m + "'");
}

const std::set<std::string> kStringMethods = {
    "strip",   "lstrip",  "rstrip",     "split",  "rsplit",     "startswith", "endswith",
    "upper",   "lower",   "capitalize", "title",  "replace",    "find",       "rfind",
    "index",   "count",   "join",       "format", "splitlines", "isdigit",    "isalpha",
    "isalnum", "isspace", "islower",    "isupper"};
const std::set<std::string> kDictMethods = {"get", "items", "keys", "values"};
const std::set<std::string> kUnsafe = {"append", "extend",     "insert",  "pop",  "remove", "clear",
                                       "update", "setdefault", "popitem", "sort", "reverse"};

Value bound(const Value &obj, const std::string &name) {
  return Value::function(name, [obj, name](CallArgs &a) -> Value {
    if (obj.is_string()) {
      Value r = string_method(obj.as_string(), name, a);
      return obj.is_markup() && r.is_string() ? Value::markup(r.as_string()) : r;
    }
    if (obj.is_dict() && kDictMethods.count(name)) {
      const Dict &d = obj.as_dict();
      if (name == "get") {
        Value key = a.get(0, "key");
        const Value *v = d.find(Dict::encode_key(key));
        if (v) return *v;
        return a.has(1, "default") ? a.get(1, "default") : Value::none();
      }
      List out;
      for (const auto &[k, v] : d.items) {
        if (name == "items")
          out.push_back(Value::tuple(List{Dict::decode_key(k), v}));
        else if (name == "keys")
          out.push_back(Dict::decode_key(k));
        else
          out.push_back(v);
      }
      return Value(out);
    }
    if (obj.is_list() && (name == "index" || name == "count")) {
      const List &l = obj.as_list();
      Value x = a.get(0, "x");
      int64_t n = 0;
      for (size_t i = 0; i < l.size(); ++i) {
        if (values_equal(l[i], x)) {
          if (name == "index") return Value(static_cast<int64_t>(i));
          ++n;
        }
      }
      if (name == "index") throw TemplateError("value is not in list");
      return Value(n);
    }
    throw TemplateError("access to attribute '" + name + "' of '" + obj.type_name() +
                        "' object is unsafe.");
  });
}

} // namespace

[[noreturn]] void fail_undefined(const Value &v) {
  throw TemplateError(v.undefined_hint().empty() ? "undefined value" : v.undefined_hint());
}

Value get_attribute(const Value &obj, const std::string &name) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (obj.is_namespace()) {
    if (const Value *v = obj.as_dict().find(name)) return *v;
  } else if (obj.is_dict()) {
    if (kDictMethods.count(name) || kUnsafe.count(name)) return bound(obj, name);
    if (const Value *v = obj.as_dict().find(name)) return *v;
  } else if (obj.is_string()) {
    if (kStringMethods.count(name)) return bound(obj, name);
  } else if (obj.is_list()) {
    if (name == "index" || name == "count" || kUnsafe.count(name)) return bound(obj, name);
  }
  return Value::undefined(type_repr(obj) + " has no attribute '" + name + "'");
}

Value get_item(const Value &obj, const Value &key) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (obj.is_dict() && !obj.is_namespace() &&
      (key.is_string() || key.is_number() || key.is_none())) {
    if (const Value *v = obj.as_dict().find(Dict::encode_key(key))) return *v;
  } else if (obj.is_namespace() && key.is_string()) {
    if (const Value *v = obj.as_dict().find(key.as_string())) return *v;
  } else if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = key.as_int();
    if (obj.is_list()) {
      int64_t n = static_cast<int64_t>(obj.as_list().size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return obj.as_list()[static_cast<size_t>(i)];
    } else {
      auto chars = utf8_chars(obj.as_string());
      int64_t n = static_cast<int64_t>(chars.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return Value(chars[static_cast<size_t>(i)]);
    }
    return Value::undefined(type_repr(obj, false) + " has no element " +
                            std::to_string(key.as_int()));
  }
  if (key.is_string()) return get_attribute(obj, key.as_string());
  return Value::undefined(type_repr(obj, false) + " has no element " + key.repr());
}

Value slice_value(const Value &obj, const Value &start, const Value &stop, const Value &step) {
  if (obj.is_undefined()) fail_undefined(obj);
  std::vector<Value> items;
  std::vector<std::string> chars;
  if (obj.is_string()) {
    chars = utf8_chars(obj.as_string());
  } else if (obj.is_list()) {
    items = obj.as_list();
  } else {
    throw TemplateError(std::string("'") + obj.type_name() + "' object is not subscriptable");
  }
  int64_t n = static_cast<int64_t>(obj.is_string() ? chars.size() : items.size());
  int64_t st = step.is_number() ? step.as_int() : 1;
  if (st == 0) throw TemplateError("slice step cannot be zero");
  auto clamp = [&](const Value &v, int64_t dflt) {
    if (!v.is_number()) return dflt;
    int64_t i = v.as_int();
    if (i < 0) i += n;
    if (st > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  int64_t b = clamp(start, st > 0 ? 0 : n - 1);
  int64_t e = clamp(stop, st > 0 ? n : -1);
  std::string s;
  List l;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) {
    if (obj.is_string())
      s += chars[static_cast<size_t>(i)];
    else
      l.push_back(items[static_cast<size_t>(i)]);
  }
  return obj.is_string() ? Value(s) : Value(l);
}

List iterate(const Value &v) {
  switch (v.kind()) {
  case Kind::Undefined:
    return {};
  case Kind::Array:
    return v.as_list();
  case Kind::Object: {
    List out;
    for (const auto &[k, x] : v.as_dict().items) out.push_back(Dict::decode_key(k));
    return out;
  }
  case Kind::String: {
    List out;
    for (auto &c : utf8_chars(v.as_string())) out.push_back(Value(c));
    return out;
  }
  default:
    throw TemplateError(std::string("'") + v.type_name() + "' object is not iterable");
  }
}

bool contains(const Value &container, const Value &item) {
  if (container.is_string()) {
    if (item.is_undefined()) fail_undefined(item);
    if (!item.is_string())
      throw TemplateError(std::string("'in <string>' requires string as left operand, not ") +
                          item.type_name());
    return container.as_string().find(item.as_string()) != std::string::npos;
  }
  if (container.is_dict()) return container.as_dict().find(Dict::encode_key(item)) != nullptr;
  if (container.is_undefined()) return false;
  if (!container.is_list())
    throw TemplateError(std::string("argument of type '") + container.type_name() +
                        "' is not iterable");
  for (const Value &v : container.as_list())
    if (values_equal(v, item)) return true;
  return false;
}

static std::string percent_format(const std::string &fmt, const Value &args) {
  List values = args.is_tuple() ? args.as_list() : List{args}; // only a tuple spreads
  size_t k = 0;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) throw TemplateError("incomplete format");
    char c = fmt[i];
    if (c == '%') {
      out += '%';
      continue;
    }
    if (k >= values.size()) throw TemplateError("not enough arguments for format string");
    const Value &v = values[k++];
    if (c == 's')
      out += v.str();
    else if (c == 'r')
      out += v.repr();
    else if (c == 'd' || c == 'i')
      out += std::to_string(v.as_int());
    else
      throw TemplateError(std::string("unsupported format character '") + c + "'");
  }
  if (k < values.size())
    throw TemplateError("not all arguments converted during string formatting");
  return out;
}

namespace {
Value binary_op_unchecked(const std::string &op, const Value &a, const Value &b);
}

// A hostile template can double a string or list each loop pass; stop it before memory runs out.
Value binary_op(const std::string &op, const Value &a, const Value &b) {
  constexpr size_t kMaxString = size_t(16) << 20, kMaxList = size_t(1) << 20;
  Value r = binary_op_unchecked(op, a, b);
  if ((r.is_string() && r.as_string().size() > kMaxString) ||
      (r.is_list() && r.as_list().size() > kMaxList))
    throw TemplateError("template value too large (over 16 MiB of text or 1M list items)");
  return r;
}

namespace {
Value binary_op_unchecked(const std::string &op, const Value &a, const Value &b) {
  if (op == "~") return Value(a.str() + b.str());
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  auto unsupported = [&]() -> Value {
    if (op == "+" && a.is_string())
      throw TemplateError(std::string("can only concatenate str (not \"") + b.type_name() +
                          "\") to str");
    throw TemplateError("unsupported operand type(s) for " + op + ": '" + a.type_name() +
                        "' and '" + b.type_name() + "'");
  };
  if (a.is_number() && b.is_number()) {
    bool flt = a.is_float() || b.is_float();
    double x = a.as_float(), y = b.as_float();
    int64_t i = a.as_int(), j = b.as_int();
    if (op == "+") return flt ? Value(x + y) : Value(i + j);
    if (op == "-") return flt ? Value(x - y) : Value(i - j);
    if (op == "*") return flt ? Value(x * y) : Value(i * j);
    if (op == "/") {
      if (y == 0) throw TemplateError("division by zero");
      return Value(x / y);
    }
    if (op == "//" || op == "%") {
      if (y == 0) throw TemplateError(op == "%" ? "modulo by zero" : "division by zero");
      if (flt) {
        double q = std::floor(x / y);
        return op == "//" ? Value(q) : Value(x - q * y);
      }
      int64_t q = i / j;
      if ((i % j != 0) && ((i < 0) != (j < 0))) --q;
      return op == "//" ? Value(q) : Value(i - q * j);
    }
    if (op == "**") {
      if (!flt && j >= 0) {
        // Squaring in uint64_t: overflow wraps (Python would grow a big int) instead of being UB.
        uint64_t r = 1, base = static_cast<uint64_t>(i);
        for (uint64_t e = static_cast<uint64_t>(j); e; e >>= 1, base *= base)
          if (e & 1) r *= base;
        return Value(static_cast<int64_t>(r));
      }
      return Value(std::pow(x, y));
    }
  }
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      if (!a.is_markup() && !b.is_markup()) return Value(a.as_string() + b.as_string());
      auto esc = [](const Value &x) {
        return x.is_markup() ? x.as_string() : html_escape(x.as_string());
      };
      return Value::markup(esc(a) + esc(b));
    }
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
      List l = a.as_list();
      l.insert(l.end(), b.as_list().begin(), b.as_list().end());
      return a.is_tuple() ? Value::tuple(std::move(l)) : Value(std::move(l));
    }
  }
  if (op == "*" && (a.is_string() || a.is_list()) && (b.is_int() || b.is_bool())) {
    size_t unit = a.is_string() ? a.as_string().size() : a.as_list().size();
    if (b.as_int() > 0 && unit > 0 &&
        static_cast<uint64_t>(b.as_int()) > (uint64_t{1} << 26) / unit)
      throw TemplateError("repetition result too large");
    if (a.is_string()) {
      std::string s;
      for (int64_t k = 0; k < b.as_int(); ++k) s += a.as_string();
      return Value(s);
    }
    List l;
    for (int64_t k = 0; k < b.as_int(); ++k)
      l.insert(l.end(), a.as_list().begin(), a.as_list().end());
    return Value(l);
  }
  if (op == "*" && (b.is_string() || b.is_list()) && a.is_int()) return binary_op(op, b, a);
  if (op == "%" && a.is_string()) {
    if (!a.is_markup()) return Value(percent_format(a.as_string(), b));
    List args = b.is_tuple() ? b.as_list() : List{b};
    for (Value &x : args)
      if (!x.is_markup()) x = Value::markup(html_escape(x.str()));
    return Value::markup(percent_format(a.as_string(), Value::tuple(args)));
  }
  return unsupported();
}
} // namespace

} // namespace offgraph::text::jinja
