// The built-in filters and tests of Jinja2 3.1 that chat templates use, plus Hugging Face's
// tojson (plain json.dumps with ensure_ascii=False, not Jinja2's HTML-safe variant).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>

#include "text/template/jinja_builtins.h"

namespace offgraph::text::jinja {
namespace {

std::string lower(const std::string &s) { return utf8_lower(s); }
std::string upper(const std::string &s) { return utf8_upper(s); }

Value call_method(const Value &obj, const std::string &name, std::vector<Value> positional) {
  CallArgs a;
  a.positional = std::move(positional);
  return get_attribute(obj, name).call(a);
}

// environment.getattr with dotted paths and integer parts, as Jinja2's make_attrgetter.
Value attr_path(const Value &v, const std::string &path) {
  Value cur = v;
  size_t start = 0;
  while (start <= path.size()) {
    size_t dot = path.find('.', start);
    std::string part =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (cur.is_undefined()) return cur;
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    cur = digits ? get_item(cur, Value(static_cast<int64_t>(std::stoll(part))))
                 : get_item(cur, Value(part));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return cur;
}

// Sort key: case-insensitive strings unless case_sensitive, as Jinja2's ignore_case.
Value sort_key(const Value &v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value(lower(v.as_string()));
  return v;
}

CallArgs shift_args(const CallArgs &a, size_t n) {
  CallArgs out;
  out.positional.assign(a.positional.begin() + static_cast<long>(std::min(n, a.positional.size())),
                        a.positional.end());
  out.keyword = a.keyword;
  return out;
}

Value select_filter(const Value &seq, CallArgs &a, bool attr_mode, bool keep_when) {
  List out;
  std::string attr;
  size_t test_pos = 0;
  if (attr_mode) {
    attr = a.get(0, "attr").str();
    test_pos = 1;
  }
  for (const Value &item : iterate(seq)) {
    Value v = attr_mode ? attr_path(item, attr) : item;
    bool ok;
    if (a.positional.size() <= test_pos) {
      ok = v.truthy();
    } else {
      CallArgs rest = shift_args(a, test_pos + 1);
      ok = apply_test(a.positional[test_pos].str(), v, rest);
    }
    if (ok == keep_when) out.push_back(item);
  }
  return Value(out);
}

std::string do_indent(const std::string &s, CallArgs &a) {
  Value w = a.get(0, "width");
  std::string pad = w.is_string()
                        ? w.as_string()
                        : std::string(w.is_number() ? static_cast<size_t>(w.as_int()) : 4, ' ');
  bool first = a.get(1, "first").truthy();
  bool blank = a.get(2, "blank").truthy();
  std::string text = s;
  // Jinja2 appends a newline after a trailing one so that splitlines keeps the empty last line.
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t p = text.find('\n'); p != std::string::npos; p = text.find('\n', start)) {
    lines.push_back(text.substr(start, p - start));
    start = p + 1;
  }
  lines.push_back(text.substr(start));
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i) out += '\n';
    bool indent = (i == 0) ? first : (blank || !lines[i].empty());
    if (i == 0 && first && !blank && lines[i].empty()) indent = first;
    out += (indent ? pad : "") + lines[i];
  }
  return out;
}

using FilterFn = Value (*)(const Value &, CallArgs &);

Value f_tojson(const Value &v, CallArgs &a) {
  JsonOptions o;
  o.ensure_ascii = a.get(0, "ensure_ascii").truthy();
  Value indent = a.get(1, "indent");
  if (indent.is_int())
    o.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, indent.as_int())), ' ');
  else if (indent.is_string())
    o.indent = indent.as_string();
  if (o.indent) o.item_separator = ",";
  Value sep = a.get(2, "separators");
  if (sep.is_list() && sep.as_list().size() == 2) {
    o.item_separator = sep.as_list()[0].str();
    o.key_separator = sep.as_list()[1].str();
  }
  o.sort_keys = a.get(3, "sort_keys").truthy();
  return Value(python_json_dumps(v, o));
}

Value f_length(const Value &v, CallArgs &) {
  if (v.is_string()) return Value(static_cast<int64_t>(utf8_length(v.as_string())));
  if (v.is_list()) return Value(static_cast<int64_t>(v.as_list().size()));
  if (v.is_dict()) return Value(static_cast<int64_t>(v.as_dict().items.size()));
  if (v.is_undefined()) return Value(0);
  throw TemplateError(std::string("object of type '") + v.type_name() + "' has no len()");
}

Value f_default(const Value &v, CallArgs &a) {
  bool boolean = a.get(1, "boolean").truthy();
  if (v.is_undefined() || (boolean && !v.truthy())) {
    Value d = a.get(0, "default_value");
    return d.is_undefined() ? Value("") : d;
  }
  return v;
}

Value f_join(const Value &v, CallArgs &a) {
  std::string sep = a.has(0, "d") ? a.get(0, "d").str() : "";
  Value attr = a.get(1, "attribute");
  std::string out;
  bool first = true;
  for (const Value &x : iterate(v)) {
    out += (first ? "" : sep) + (attr.is_undefined() ? x : attr_path(x, attr.str())).str();
    first = false;
  }
  return Value(out);
}

Value f_first(const Value &v, CallArgs &) {
  List l = iterate(v);
  return l.empty() ? Value::undefined("No first item, sequence was empty.") : l.front();
}
Value f_last(const Value &v, CallArgs &) {
  List l = iterate(v);
  return l.empty() ? Value::undefined("No last item, sequence was empty.") : l.back();
}

Value f_reverse(const Value &v, CallArgs &) {
  if (v.is_string()) {
    auto c = utf8_chars(v.as_string());
    std::string out;
    for (auto it = c.rbegin(); it != c.rend(); ++it) out += *it;
    return Value(out);
  }
  List l = iterate(v);
  std::reverse(l.begin(), l.end());
  return Value(l);
}

Value f_sort(const Value &v, CallArgs &a) {
  List l = iterate(v);
  bool rev = a.get(0, "reverse").truthy();
  bool cs = a.get(1, "case_sensitive").truthy();
  Value attr = a.get(2, "attribute");
  auto key = [&](const Value &x) {
    return sort_key(attr.is_undefined() ? x : attr_path(x, attr.str()), cs);
  };
  std::stable_sort(l.begin(), l.end(), [&](const Value &x, const Value &y) {
    return rev ? value_less(key(y), key(x)) : value_less(key(x), key(y));
  });
  return Value(l);
}

Value f_dictsort(const Value &v, CallArgs &a) {
  if (!v.is_dict()) throw TemplateError("dictsort expects a mapping");
  bool cs = a.get(0, "case_sensitive").truthy();
  std::string by = a.has(1, "by") ? a.get(1, "by").str() : "key";
  bool rev = a.get(2, "reverse").truthy();
  List l;
  for (const auto &[k, x] : v.as_dict().items)
    l.push_back(Value::tuple(List{Dict::decode_key(k), x}));
  size_t idx = by == "value" ? 1 : 0;
  std::stable_sort(l.begin(), l.end(), [&](const Value &x, const Value &y) {
    Value kx = sort_key(x.as_list()[idx], cs), ky = sort_key(y.as_list()[idx], cs);
    return rev ? value_less(ky, kx) : value_less(kx, ky);
  });
  return Value(l);
}

Value f_unique(const Value &v, CallArgs &a) {
  bool cs = a.get(0, "case_sensitive").truthy();
  Value attr = a.get(1, "attribute");
  List out, seen;
  for (const Value &x : iterate(v)) {
    Value k = sort_key(attr.is_undefined() ? x : attr_path(x, attr.str()), cs);
    if (std::none_of(seen.begin(), seen.end(),
                     [&](const Value &s) { return values_equal(s, k); })) {
      seen.push_back(k);
      out.push_back(x);
    }
  }
  return Value(out);
}

Value f_map(const Value &v, CallArgs &a) {
  List out;
  Value attr = a.get(static_cast<size_t>(-1), "attribute");
  for (const Value &x : iterate(v)) {
    if (!attr.is_undefined()) {
      Value r = attr_path(x, attr.str());
      if (r.is_undefined() && a.has(static_cast<size_t>(-1), "default"))
        r = a.get(static_cast<size_t>(-1), "default");
      out.push_back(r);
    } else {
      if (a.positional.empty()) throw TemplateError("map requires a filter argument");
      CallArgs rest = shift_args(a, 1);
      out.push_back(apply_filter(a.positional[0].str(), x, rest));
    }
  }
  return Value(out);
}

Value f_items(const Value &v, CallArgs &) {
  if (v.is_undefined()) return Value(List{});
  if (!v.is_dict()) throw TemplateError("Can only get item pairs from a mapping.");
  return call_method(v, "items", {});
}

std::string strip_whitespace(const std::string &s) {
  CallArgs none;
  return get_attribute(Value(s), "strip").call(none).str();
}

// Python's int(str) and float(str): surrounding whitespace, a sign, and underscores only between
// digits; nothing else (no hex, no trailing junk).
std::string python_number_text(const std::string &raw, bool allow_float) {
  std::string s = strip_whitespace(raw);
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == '_') {
      bool ok = i > 0 && i + 1 < s.size() && std::isdigit(static_cast<unsigned char>(s[i - 1])) &&
                std::isdigit(static_cast<unsigned char>(s[i + 1]));
      if (!ok) return "";
      continue;
    }
    bool digit = std::isdigit(static_cast<unsigned char>(c));
    bool sign =
        (c == '+' || c == '-') && (i == 0 || (allow_float && (s[i - 1] == 'e' || s[i - 1] == 'E')));
    bool fpart = allow_float && (c == '.' || c == 'e' || c == 'E');
    if (!digit && !sign && !fpart) return "";
    out += c;
  }
  return out;
}

bool parse_python_int(const std::string &s, int64_t *out) {
  std::string t = python_number_text(s, false);
  if (t.empty() || t == "+" || t == "-") return false;
  try {
    *out = std::stoll(t);
    return true;
  } catch (...) {
    return false;
  }
}

bool parse_python_float(const std::string &s, double *out) {
  std::string low = lower(strip_whitespace(s));
  std::string body = low.empty() || (low[0] != '+' && low[0] != '-') ? low : low.substr(1);
  if (body == "inf" || body == "infinity" || body == "nan") {
    *out = body == "nan" ? NAN : (low[0] == '-' ? -INFINITY : INFINITY);
    return true;
  }
  std::string t = python_number_text(s, true);
  if (t.empty()) return false;
  bool digits = std::any_of(t.begin(), t.end(), ::isdigit);
  if (!digits) return false;
  try {
    size_t used = 0;
    *out = std::stod(t, &used);
    return used == t.size();
  } catch (...) {
    return false;
  }
}

Value f_int(const Value &v, CallArgs &a) {
  Value d = a.has(0, "default") ? a.get(0, "default") : Value(0);
  if (v.is_number()) {
    if (v.is_float() && !std::isfinite(v.as_float())) return d;
    return Value(v.as_int());
  }
  if (v.is_string()) {
    int64_t i = 0;
    if (parse_python_int(v.as_string(), &i)) return Value(i);
    double x = 0;
    if (parse_python_float(v.as_string(), &x) && std::isfinite(x))
      return Value(static_cast<int64_t>(x)); // "42.23"|int is 42, as Jinja2
  }
  return d;
}

Value f_float(const Value &v, CallArgs &a) {
  Value d = a.has(0, "default") ? a.get(0, "default") : Value(0.0);
  if (v.is_number()) return Value(v.as_float());
  double x = 0;
  if (v.is_string() && parse_python_float(v.as_string(), &x)) return Value(x);
  return d;
}

Value f_round(const Value &v, CallArgs &a) {
  if (!v.is_number())
    throw TemplateError(std::string("type ") + v.type_name() + " doesn't define __round__ method");
  int64_t prec = a.has(0, "precision") ? a.get(0, "precision").as_int() : 0;
  std::string method = a.has(1, "method") ? a.get(1, "method").str() : "common";
  double m = std::pow(10.0, static_cast<double>(prec));
  if (method == "ceil" || method == "floor") {
    double x = v.as_float() * m;
    return Value((method == "ceil" ? std::ceil(x) : std::floor(x)) / m);
  }
  if (method != "common") throw TemplateError("method must be 'common', 'ceil' or 'floor'");
  if (!v.is_float() && prec >= 0) return Value(v.as_int()); // round(int, n) stays an int
  if (prec < 0 || prec > 300) return Value(std::nearbyint(v.as_float() * m) / m);
  // printf rounds the exact binary value half-to-even, which is what Python's round() does.
  char buf[400];
  std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(prec), v.as_float());
  return Value(std::strtod(buf, nullptr));
}

Value f_replace(const Value &v, CallArgs &a) {
  CallArgs args;
  args.positional = {a.get(0, "old"), a.get(1, "new")};
  if (a.has(2, "count")) args.positional.push_back(a.get(2, "count"));
  return get_attribute(Value(v.str()), "replace").call(args);
}

Value f_trim(const Value &v, CallArgs &a) {
  CallArgs args;
  if (a.has(0, "chars")) args.positional.push_back(a.get(0, "chars"));
  return get_attribute(Value(v.str()), "strip").call(args);
}

Value f_title(const Value &v, CallArgs &) {
  // Jinja2's do_title: words split on whitespace and -({[<, first letter up, rest lowered.
  std::string out;
  bool at_start = true;
  for (const std::string &ch : utf8_chars(v.str())) {
    bool sep = ch.size() == 1 &&
               (std::isspace(static_cast<unsigned char>(ch[0])) || std::strchr("-({[<", ch[0]));
    out += sep ? ch : at_start ? upper(ch) : lower(ch);
    at_start = sep;
  }
  return Value(out);
}

Value f_escape(const Value &v, CallArgs &) {
  return v.is_markup() ? v : Value::markup(html_escape(v.str()));
}

Value f_wordcount(const Value &v, CallArgs &) {
  int64_t n = 0;
  bool in = false;
  for (unsigned char c : v.str()) {
    bool w = std::isalnum(c) || c == '_' || c >= 0x80;
    if (w && !in) ++n;
    in = w;
  }
  return Value(n);
}

Value f_batch(const Value &v, CallArgs &a) {
  int64_t n = a.get(0, "linecount").as_int();
  if (n <= 0) throw TemplateError("batch size must be positive");
  Value fill = a.get(1, "fill_with");
  List out, cur;
  for (const Value &x : iterate(v)) {
    cur.push_back(x);
    if (static_cast<int64_t>(cur.size()) == n) {
      out.push_back(Value(cur));
      cur.clear();
    }
  }
  if (!cur.empty()) {
    if (!fill.is_undefined() && !fill.is_none())
      while (static_cast<int64_t>(cur.size()) < n) cur.push_back(fill);
    out.push_back(Value(cur));
  }
  return Value(out);
}

Value f_sum(const Value &v, CallArgs &a) {
  Value attr = a.get(0, "attribute");
  Value total = a.has(1, "start") ? a.get(1, "start") : Value(0);
  for (const Value &x : iterate(v))
    total = binary_op("+", total, attr.is_undefined() ? x : attr_path(x, attr.str()));
  return total;
}

Value f_minmax(const Value &v, CallArgs &a, bool want_max) {
  List l = iterate(v);
  if (l.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  bool cs = a.get(0, "case_sensitive").truthy();
  Value attr = a.get(1, "attribute");
  auto key = [&](const Value &x) {
    return sort_key(attr.is_undefined() ? x : attr_path(x, attr.str()), cs);
  };
  Value best = l[0];
  for (const Value &x : l)
    if (want_max ? value_less(key(best), key(x)) : value_less(key(x), key(best))) best = x;
  return best;
}

const std::map<std::string, FilterFn> &filters() {
  static const std::map<std::string, FilterFn> table = {
      {"tojson", f_tojson},
      {"length", f_length},
      {"count", f_length},
      {"default", f_default},
      {"d", f_default},
      {"join", f_join},
      {"first", f_first},
      {"last", f_last},
      {"reverse", f_reverse},
      {"sort", f_sort},
      {"dictsort", f_dictsort},
      {"unique", f_unique},
      {"map", f_map},
      {"items", f_items},
      {"int", f_int},
      {"float", f_float},
      {"round", f_round},
      {"replace", f_replace},
      {"trim", f_trim},
      {"title", f_title},
      {"escape", f_escape},
      {"e", f_escape},
      {"wordcount", f_wordcount},
      {"batch", f_batch},
      {"sum", f_sum},
      {"select", [](const Value &v, CallArgs &a) { return select_filter(v, a, false, true); }},
      {"reject", [](const Value &v, CallArgs &a) { return select_filter(v, a, false, false); }},
      {"selectattr", [](const Value &v, CallArgs &a) { return select_filter(v, a, true, true); }},
      {"rejectattr", [](const Value &v, CallArgs &a) { return select_filter(v, a, true, false); }},
      {"max", [](const Value &v, CallArgs &a) { return f_minmax(v, a, true); }},
      {"min", [](const Value &v, CallArgs &a) { return f_minmax(v, a, false); }},
      {"lower", [](const Value &v, CallArgs &) { return Value(lower(v.str())); }},
      {"upper", [](const Value &v, CallArgs &) { return Value(upper(v.str())); }},
      {"capitalize",
       [](const Value &v, CallArgs &) { return call_method(Value(v.str()), "capitalize", {}); }},
      {"string", [](const Value &v, CallArgs &) { return Value(v.str()); }},
      {"safe", [](const Value &v, CallArgs &) { return Value::markup(v.str()); }},
      {"indent", [](const Value &v, CallArgs &a) { return Value(do_indent(v.str(), a)); }},
      {"list", [](const Value &v, CallArgs &) { return Value(iterate(v)); }},
      {"abs",
       [](const Value &v, CallArgs &) {
         if (v.is_float()) return Value(std::fabs(v.as_float()));
         if (!v.is_number())
           throw TemplateError(std::string("bad operand type for abs(): '") + v.type_name() + "'");
         return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
       }},
      {"attr",
       [](const Value &v, CallArgs &a) { return get_attribute(v, a.get(0, "name").str()); }},
      {"center",
       [](const Value &v, CallArgs &a) {
         std::string s = v.str();
         size_t w = a.has(0, "width") ? static_cast<size_t>(a.get(0, "width").as_int()) : 80;
         size_t n = utf8_length(s);
         if (w <= n) return Value(s);
         size_t left = (w - n) / 2 + ((w - n) & w & 1);
         return Value(std::string(left, ' ') + s + std::string(w - n - left, ' '));
       }},
  };
  return table;
}

bool is_sequence_like(const Value &v) { return v.is_string() || v.is_list() || v.is_dict(); }

} // namespace

bool has_filter(const std::string &name) { return filters().count(name) > 0; }

Value apply_filter(const std::string &name, const Value &target, CallArgs &args) {
  auto it = filters().find(name);
  if (it == filters().end()) throw TemplateError("No filter named '" + name + "' found.");
  // Most filters fail on Undefined like Python would; these accept it.
  static const std::set<std::string> undefined_ok = {
      "default",    "d",         "length", "count",   "items",   "list",       "string",
      "join",       "first",     "last",   "select",  "reject",  "selectattr", "rejectattr",
      "map",        "unique",    "sort",   "reverse", "sum",     "lower",      "upper",
      "trim",       "safe",      "escape", "e",       "replace", "indent",     "title",
      "capitalize", "wordcount", "int",    "float",   "batch",   "center"};
  if (target.is_undefined() && !undefined_ok.count(name)) fail_undefined(target);
  // select/reject/map yield nothing for any falsy input (None included), as Jinja2's do.
  static const std::set<std::string> falsy_empty = {"select", "reject", "selectattr", "rejectattr",
                                                    "map"};
  if (falsy_empty.count(name) && !target.truthy()) return Value(List{});
  Value r = it->second(target, args);
  // Filters built on soft_str keep a Markup string Markup.
  static const std::set<std::string> keeps_markup = {"upper", "lower",      "trim",  "string",
                                                     "title", "capitalize", "center"};
  if (target.is_markup() && r.is_string() && keeps_markup.count(name))
    return Value::markup(r.as_string());
  return r;
}

bool has_test(const std::string &name) {
  static const std::set<std::string> names = {
      "defined",  "undefined", "none",   "string",      "mapping",     "iterable", "number",
      "sequence", "boolean",   "true",   "false",       "integer",     "float",    "in",
      "eq",       "equalto",   "==",     "ne",          "!=",          "lt",       "lessthan",
      "<",        "le",        "<=",     "gt",          "greaterthan", ">",        "ge",
      ">=",       "odd",       "even",   "divisibleby", "callable",    "sameas",   "lower",
      "upper",    "escaped",   "filter", "test"};
  return names.count(name) > 0;
}

bool apply_test(const std::string &name, const Value &v, CallArgs &a) {
  Value arg = a.get(0, "other");
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict() && !v.is_namespace();
  if (name == "iterable") return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
  if (name == "sequence") return is_sequence_like(v) || v.is_undefined();
  if (name == "number") return v.is_number();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "callable") return v.is_function();
  if (name == "escaped") return v.is_markup();
  if (name == "filter") return has_filter(v.str());
  if (name == "test") return has_test(v.str());
  if (name == "in") return contains(arg, v);
  if (name == "eq" || name == "equalto" || name == "==") return values_equal(v, arg);
  if (name == "ne" || name == "!=") return !values_equal(v, arg);
  if (name == "sameas") return v.same_object(arg) || (v.is_none() && arg.is_none());
  if (name == "lower") return v.is_string() && lower(v.as_string()) == v.as_string();
  if (name == "upper") return v.is_string() && upper(v.as_string()) == v.as_string();
  auto need_defined = [](const Value &x) {
    if (x.is_undefined()) fail_undefined(x);
  };
  if (name == "lt" || name == "lessthan" || name == "<") return need_defined(v), value_less(v, arg);
  if (name == "gt" || name == "greaterthan" || name == ">")
    return need_defined(v), value_less(arg, v);
  if (name == "le" || name == "<=") return need_defined(v), !value_less(arg, v);
  if (name == "ge" || name == ">=") return need_defined(v), !value_less(v, arg);
  if (name == "odd" || name == "even" || name == "divisibleby") {
    need_defined(v);
    int64_t n = v.as_int();
    if (name == "divisibleby") {
      int64_t d = a.get(0, "num").as_int();
      if (d == 0) throw TemplateError("integer division or modulo by zero");
      return n % d == 0;
    }
    return (((n % 2) + 2) % 2 == 1) == (name == "odd");
  }
  throw TemplateError("No test named '" + name + "' found.");
}

} // namespace offgraph::text::jinja
