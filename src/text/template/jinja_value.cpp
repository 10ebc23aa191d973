#include "text/template/jinja_value.h"
#include "base/utf8.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace offgraph::text::jinja {

Value Value::dict() {
  Value v(Kind::Object);
  v.dict_ = std::make_shared<Dict>();
  return v;
}

Value Value::namespace_object() {
  Value v = dict();
  v.namespace_ = true;
  return v;
}

Value Value::function(std::string name, Function fn) {
  Value v(Kind::Callable);
  v.str_ = std::move(name);
  v.fn_ = std::make_shared<Function>(std::move(fn));
  return v;
}

bool Value::is_namespace() const { return kind_ == Kind::Object && namespace_; }

Value Value::call(CallArgs &args) const { return (*fn_)(args); }

Value Value::from_json(const nlohmann::ordered_json &j) {
  switch (j.type()) {
  case nlohmann::ordered_json::value_t::null:
    return none();
  case nlohmann::ordered_json::value_t::boolean:
    return Value(j.get<bool>());
  case nlohmann::ordered_json::value_t::number_integer:
    return Value(j.get<int64_t>());
  case nlohmann::ordered_json::value_t::number_unsigned:
    return Value(static_cast<int64_t>(j.get<uint64_t>()));
  case nlohmann::ordered_json::value_t::number_float:
    return Value(j.get<double>());
  case nlohmann::ordered_json::value_t::string:
    return Value(j.get<std::string>());
  case nlohmann::ordered_json::value_t::array: {
    List l;
    l.reserve(j.size());
    for (const auto &e : j) l.push_back(from_json(e));
    return Value(std::move(l));
  }
  case nlohmann::ordered_json::value_t::object: {
    Value d = dict();
    for (auto it = j.begin(); it != j.end(); ++it) d.as_dict().set(it.key(), from_json(it.value()));
    return d;
  }
  default:
    return none();
  }
}

nlohmann::ordered_json value_to_json(const Value &v) {
  switch (v.kind()) {
  case Kind::Bool:
    return v.as_bool();
  case Kind::Int:
    return v.as_int();
  case Kind::Float:
    return v.as_float();
  case Kind::String:
    return v.as_string();
  case Kind::Array: {
    auto a = nlohmann::ordered_json::array();
    for (const auto &e : v.as_list()) a.push_back(value_to_json(e));
    return a;
  }
  case Kind::Object: {
    auto o = nlohmann::ordered_json::object();
    for (const auto &[k, e] : v.as_dict().items) {
      Value key = Dict::decode_key(k);
      o[key.is_string() ? k : python_json_dumps(key, JsonOptions{})] = value_to_json(e);
    }
    return o;
  }
  default:
    return nullptr;
  }
}

bool Value::truthy() const {
  switch (kind_) {
  case Kind::Undefined:
  case Kind::None:
    return false;
  case Kind::Bool:
  case Kind::Int:
    return int_ != 0;
  case Kind::Float:
    return float_ != 0.0;
  case Kind::String:
    return !str_.empty();
  case Kind::Array:
    return !list_->empty();
  case Kind::Object:
    return namespace_ || !dict_->items.empty();
  case Kind::Callable:
    return true;
  }
  return false;
}

const char *Value::type_name() const {
  switch (kind_) {
  case Kind::Undefined:
    return "Undefined";
  case Kind::None:
    return "NoneType";
  case Kind::Bool:
    return "bool";
  case Kind::Int:
    return "int";
  case Kind::Float:
    return "float";
  case Kind::String:
    return "str";
  case Kind::Array:
    return "list";
  case Kind::Object:
    return namespace_ ? "Namespace" : "dict";
  case Kind::Callable:
    return "function";
  }
  return "object";
}

bool Value::same_object(const Value &o) const {
  if (kind_ != o.kind_) return false;
  if (is_list()) return list_ == o.list_;
  if (is_dict()) return dict_ == o.dict_;
  if (is_function()) return fn_ == o.fn_;
  return values_equal(*this, o);
}

std::string python_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's layout: fixed for 1e-4 <= |d| < 1e16.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  int exp = std::stoi(sci.substr(e + 1));
  bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  std::string out;
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    } else if (static_cast<size_t>(exp + 1) >= digits.size()) {
      out = digits + std::string(exp + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += eb;
  }
  return neg ? "-" + out : out;
}

static std::string repr_string(const std::string &s) {
  char quote = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c == static_cast<unsigned char>(quote))
      out += std::string("\\") + quote;
    else if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\t')
      out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else
      out += static_cast<char>(c);
  }
  return out + quote;
}

std::string Value::repr() const {
  if (is_string()) return repr_string(str_);
  return str();
}

std::string Value::str() const {
  switch (kind_) {
  case Kind::Undefined:
    return "";
  case Kind::None:
    return "None";
  case Kind::Bool:
    return int_ ? "True" : "False";
  case Kind::Int:
    return std::to_string(int_);
  case Kind::Float:
    return python_float_repr(float_);
  case Kind::String:
    return str_;
  case Kind::Array: {
    std::string out = tuple_ ? "(" : "[";
    for (size_t i = 0; i < list_->size(); ++i) out += (i ? ", " : "") + (*list_)[i].repr();
    if (tuple_ && list_->size() == 1) out += ",";
    return out + (tuple_ ? ")" : "]");
  }
  case Kind::Object: {
    std::string out = namespace_ ? "<Namespace {" : "{";
    bool first = true;
    for (const auto &[k, v] : dict_->items) {
      out += (first ? "" : ", ") + Dict::decode_key(k).repr() + ": " + v.repr();
      first = false;
    }
    return out + (namespace_ ? "}>" : "}");
  }
  case Kind::Callable:
    return "<function " + str_ + ">";
  }
  return "";
}

bool values_equal(const Value &a, const Value &b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_float() == b.as_float();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
  case Kind::Undefined:
  case Kind::None:
    return true;
  case Kind::String:
    return a.as_string() == b.as_string();
  case Kind::Array: {
    const auto &x = a.as_list(), &y = b.as_list();
    if (x.size() != y.size() || a.is_tuple() != b.is_tuple()) return false;
    for (size_t i = 0; i < x.size(); ++i)
      if (!values_equal(x[i], y[i])) return false;
    return true;
  }
  case Kind::Object: {
    const auto &x = a.as_dict(), &y = b.as_dict();
    if (x.items.size() != y.items.size()) return false;
    for (const auto &[k, v] : x.items) {
      const Value *o = y.find(k);
      if (!o || !values_equal(v, *o)) return false;
    }
    return true;
  }
  default:
    return a.same_object(b);
  }
}

bool value_less(const Value &a, const Value &b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_float() < b.as_float();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();
  if (a.is_list() && b.is_list()) {
    const auto &x = a.as_list(), &y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!values_equal(x[i], y[i])) return value_less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  throw TemplateError(std::string("'<' not supported between instances of '") + a.type_name() +
                      "' and '" + b.type_name() + "'");
}

Value CallArgs::get(size_t pos, const std::string &name) const {
  if (pos < positional.size()) return positional[pos];
  for (const auto &[k, v] : keyword)
    if (k == name) return v;
  return Value::undefined();
}

bool CallArgs::has(size_t pos, const std::string &name) const {
  if (pos < positional.size()) return true;
  return std::any_of(keyword.begin(), keyword.end(),
                     [&](const auto &kv) { return kv.first == name; });
}

static uint32_t decode_utf8(const std::string &s) {
  auto b = [&](size_t i) { return static_cast<uint32_t>(static_cast<unsigned char>(s[i])); };
  if (s.size() == 1) return b(0);
  if (s.size() == 2) return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
  if (s.size() == 3) return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
  return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
}

std::vector<std::string> utf8_chars(const std::string &s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    n = std::min(n, s.size() - i);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

// Case pairs by range: Latin-1, Latin Extended-A, Greek, Cyrillic, fullwidth Latin.
static uint32_t cp_upper(uint32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if (c < 0x80) return c;
  if ((c >= 0xE0 && c <= 0xFE && c != 0xF7)) return c - 0x20;
  if (c == 0xFF) return 0x178;
  if (c == 0xB5) return 0x39C;
  if (c == 0x131) return 'I';
  if ((c >= 0x100 && c <= 0x137) || (c >= 0x14A && c <= 0x177)) return (c & 1) ? c - 1 : c;
  if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c & 1) ? c : c - 1;
  if (c == 0x17F) return 'S';
  if (c >= 0x3B1 && c <= 0x3C9) return c == 0x3C2 ? 0x3A3 : c - 0x20;
  if (c == 0x3AC) return 0x386;
  if (c >= 0x3AD && c <= 0x3AF) return c - 0x25;
  if (c == 0x3CC) return 0x38C;
  if (c == 0x3CD || c == 0x3CE) return c - 0x3F;
  if (c >= 0x430 && c <= 0x44F) return c - 0x20;
  if (c >= 0x450 && c <= 0x45F) return c - 0x50;
  if ((c >= 0x460 && c <= 0x481) || (c >= 0x48A && c <= 0x4BF)) return (c & 1) ? c - 1 : c;
  if (c >= 0xFF41 && c <= 0xFF5A) return c - 0x20;
  return c;
}

static uint32_t cp_lower(uint32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c < 0x80) return c;
  if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 0x20;
  if (c == 0x178) return 0xFF;
  if ((c >= 0x100 && c <= 0x137) || (c >= 0x14A && c <= 0x177)) return (c & 1) ? c : c + 1;
  if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c & 1) ? c + 1 : c;
  if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 0x20;
  if (c == 0x386) return 0x3AC;
  if (c >= 0x388 && c <= 0x38A) return c + 0x25;
  if (c == 0x38C) return 0x3CC;
  if (c == 0x38E || c == 0x38F) return c + 0x3F;
  if (c >= 0x410 && c <= 0x42F) return c + 0x20;
  if (c >= 0x400 && c <= 0x40F) return c + 0x50;
  if ((c >= 0x460 && c <= 0x481) || (c >= 0x48A && c <= 0x4BF)) return (c & 1) ? c : c + 1;
  if (c >= 0xFF21 && c <= 0xFF3A) return c + 0x20;
  return c;
}

static std::string map_case(const std::string &s, bool upper) {
  std::string out;
  out.reserve(s.size());
  for (const std::string &ch : utf8_chars(s)) {
    uint32_t cp = decode_utf8(ch);
    if (upper && cp == 0xDF) {
      out += "SS";
      continue;
    }
    append_utf8(out, upper ? cp_upper(cp) : cp_lower(cp));
  }
  return out;
}

std::string utf8_upper(const std::string &s) { return map_case(s, true); }
std::string utf8_lower(const std::string &s) { return map_case(s, false); }
bool utf8_is_cased(const std::string &ch) {
  uint32_t cp = decode_utf8(ch);
  return cp == 0xDF || cp_upper(cp) != cp || cp_lower(cp) != cp;
}

bool utf8_is_space(const std::string &ch) {
  uint32_t c = decode_utf8(ch);
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

size_t utf8_length(const std::string &s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

static void json_string(std::string &out, const std::string &s, bool ensure_ascii) {
  out += '"';
  for (const std::string &ch : utf8_chars(s)) {
    unsigned char c = static_cast<unsigned char>(ch[0]);
    if (ch.size() == 1) {
      switch (c) {
      case '"':
        out += "\\\"";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      case '\b':
        out += "\\b";
        continue;
      case '\f':
        out += "\\f";
        continue;
      default:
        break;
      }
      if (c < 0x20 || (ensure_ascii && c >= 0x7f)) {
        char b[8];
        std::snprintf(b, sizeof b, "\\u%04x", c);
        out += b;
      } else {
        out += ch;
      }
    } else if (ensure_ascii) {
      uint32_t cp = decode_utf8(ch);
      char b[16];
      if (cp >= 0x10000) {
        cp -= 0x10000;
        std::snprintf(b, sizeof b, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
      } else {
        std::snprintf(b, sizeof b, "\\u%04x", cp);
      }
      out += b;
    } else {
      out += ch;
    }
  }
  out += '"';
}

static void dump(std::string &out, const Value &v, const JsonOptions &o, int level) {
  auto newline = [&](int lvl) {
    out += '\n';
    for (int i = 0; i < lvl; ++i) out += *o.indent;
  };
  switch (v.kind()) {
  case Kind::None:
    out += "null";
    return;
  case Kind::Bool:
    out += v.as_bool() ? "true" : "false";
    return;
  case Kind::Int:
    out += std::to_string(v.as_int());
    return;
  case Kind::Float: {
    double d = v.as_float();
    if (std::isnan(d))
      out += "NaN";
    else if (std::isinf(d))
      out += d > 0 ? "Infinity" : "-Infinity";
    else
      out += python_float_repr(d);
    return;
  }
  case Kind::String:
    json_string(out, v.as_string(), o.ensure_ascii);
    return;
  case Kind::Array: {
    const auto &l = v.as_list();
    if (l.empty()) {
      out += "[]";
      return;
    }
    out += '[';
    for (size_t i = 0; i < l.size(); ++i) {
      if (i) out += o.item_separator;
      if (o.indent) newline(level + 1);
      dump(out, l[i], o, level + 1);
    }
    if (o.indent) newline(level);
    out += ']';
    return;
  }
  case Kind::Object: {
    if (v.is_namespace()) break;
    std::vector<const std::pair<std::string, Value> *> items;
    for (const auto &kv : v.as_dict().items) items.push_back(&kv);
    if (items.empty()) {
      out += "{}";
      return;
    }
    if (o.sort_keys)
      std::stable_sort(items.begin(), items.end(),
                       [](auto *a, auto *b) { return a->first < b->first; });
    out += '{';
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += o.item_separator;
      if (o.indent) newline(level + 1);
      Value key = Dict::decode_key(items[i]->first);
      if (key.is_string()) {
        json_string(out, items[i]->first, o.ensure_ascii);
      } else {
        out += '"' + python_json_dumps(key, JsonOptions{}) + '"';
      }
      out += o.key_separator;
      dump(out, items[i]->second, o, level + 1);
    }
    if (o.indent) newline(level);
    out += '}';
    return;
  }
  default:
    break;
  }
  throw TemplateError(std::string("Object of type ") + v.type_name() + " is not JSON serializable");
}

std::string Dict::encode_key(const Value &key) {
  switch (key.kind()) {
  case Kind::String:
    return key.as_string();
  case Kind::Int:
    return "\x1f"
           "i" +
           std::to_string(key.as_int());
  case Kind::Bool:
    return std::string("\x1f"
                       "b") +
           (key.as_bool() ? "1" : "0");
  case Kind::Float:
    return "\x1f"
           "f" +
           python_float_repr(key.as_float());
  case Kind::None:
    return "\x1f"
           "n";
  default:
    throw TemplateError(std::string("unhashable type: '") + key.type_name() + "'");
  }
}

Value Dict::decode_key(const std::string &key) {
  if (key.size() < 2 || key[0] != '\x1f') return Value(key);
  std::string payload = key.substr(2);
  switch (key[1]) {
  case 'i':
    return Value(static_cast<int64_t>(std::stoll(payload)));
  case 'b':
    return Value(payload == "1");
  case 'f':
    return Value(std::stod(payload));
  default:
    return Value::none();
  }
}

std::string html_escape(const std::string &s) {
  std::string out;
  for (char c : s) {
    switch (c) {
    case '&':
      out += "&amp;";
      break;
    case '<':
      out += "&lt;";
      break;
    case '>':
      out += "&gt;";
      break;
    case '"':
      out += "&#34;";
      break;
    case '\'':
      out += "&#39;";
      break;
    default:
      out += c;
    }
  }
  return out;
}

std::string python_json_dumps(const Value &v, const JsonOptions &options) {
  std::string out;
  dump(out, v, options, 0);
  return out;
}

} // namespace offgraph::text::jinja
