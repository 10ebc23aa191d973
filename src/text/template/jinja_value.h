// The runtime value of the Jinja engine. It models the Python objects a chat template sees
// (None, bool, int, float, str, list, dict, Undefined, callables, namespace()) so that printing,
// comparison and tojson produce the same bytes as Python Jinja2 does.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace offgraph::text::jinja {

// Thrown inside the engine and turned into a Status at the API boundary. The interpreter is deeply
// recursive; threading Result through every expression would double its size for no gain.
class TemplateError : public std::runtime_error {
public:
  explicit TemplateError(const std::string &message, int line = 0, bool user_raised = false)
      : std::runtime_error(message), line_(line), user_raised_(user_raised) {}
  int line() const { return line_; }
  void set_line(int line) {
    if (line_ == 0) line_ = line;
  }
  // raise_exception(msg): the message is reported verbatim, as Hugging Face does.
  bool user_raised() const { return user_raised_; }

private:
  int line_;
  bool user_raised_;
};

class Value;
struct Dict;
struct CallArgs;
using List = std::vector<Value>;
using Function = std::function<Value(CallArgs &)>;

enum class Kind { Undefined, None, Bool, Int, Float, String, Array, Object, Callable };

class Value {
public:
  Value() = default; // Undefined
  static Value undefined(std::string hint = {}) {
    Value v;
    v.str_ = std::move(hint);
    return v;
  }
  static Value none() { return Value(Kind::None); }
  Value(bool b) : kind_(Kind::Bool), int_(b ? 1 : 0) {}             // NOLINT
  Value(int i) : kind_(Kind::Int), int_(i) {}                       // NOLINT
  Value(int64_t i) : kind_(Kind::Int), int_(i) {}                   // NOLINT
  Value(double d) : kind_(Kind::Float), float_(d) {}                // NOLINT
  Value(std::string s) : kind_(Kind::String), str_(std::move(s)) {} // NOLINT
  Value(const char *s) : kind_(Kind::String), str_(s) {}            // NOLINT
  // A Markup string (from |safe or |escape): `+` and `%` HTML-escape plain strings joined to it,
  // as markupsafe does. Only templates that call |safe themselves ever see one.
  static Value markup(std::string s) {
    Value v(std::move(s));
    v.markup_ = true;
    return v;
  }
  Value(List l) : kind_(Kind::Array), list_(std::make_shared<List>(std::move(l))) {} // NOLINT
  static Value tuple(List l) {
    Value v(std::move(l));
    v.tuple_ = true;
    return v;
  }
  static Value dict();
  static Value namespace_object();
  static Value function(std::string name, Function fn);
  static Value from_json(const nlohmann::ordered_json &j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  bool is_int() const { return kind_ == Kind::Int; }
  bool is_float() const { return kind_ == Kind::Float; }
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_list() const { return kind_ == Kind::Array; }
  bool is_dict() const { return kind_ == Kind::Object; }
  bool is_function() const { return kind_ == Kind::Callable; }
  bool is_namespace() const;
  bool is_tuple() const { return kind_ == Kind::Array && tuple_; }
  bool is_markup() const { return kind_ == Kind::String && markup_; }

  bool as_bool() const { return int_ != 0; }
  int64_t as_int() const { return is_float() ? static_cast<int64_t>(float_) : int_; }
  double as_float() const { return is_float() ? float_ : static_cast<double>(int_); }
  const std::string &as_string() const { return str_; }
  // The hint an Undefined carries ("'x' is undefined") for the error raised when it is used.
  const std::string &undefined_hint() const { return str_; }
  List &as_list() const { return *list_; }
  Dict &as_dict() const { return *dict_; }
  const std::string &function_name() const { return str_; }
  Value call(CallArgs &args) const;

  bool truthy() const;
  std::string str() const;  // Python str()
  std::string repr() const; // Python repr()
  const char *type_name() const;
  bool same_object(const Value &o) const;

private:
  explicit Value(Kind k) : kind_(k) {}
  Kind kind_ = Kind::Undefined;
  int64_t int_ = 0;
  double float_ = 0;
  std::string str_;
  std::shared_ptr<List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<Function> fn_;
  bool namespace_ = false;
  bool tuple_ = false; // prints as (a, b); otherwise a list
  bool markup_ = false;
};

// An insertion-ordered mapping, like a Python dict. Keys are stored as strings; the rare non-string
// key a template literal writes ({4096: 512}) is encoded by encode_key and restored by decode_key.
struct Dict {
  static std::string encode_key(const Value &key);
  static Value decode_key(const std::string &key);

  std::vector<std::pair<std::string, Value>> items;
  std::map<std::string, size_t> index;

  const Value *find(const std::string &key) const {
    auto it = index.find(key);
    return it == index.end() ? nullptr : &items[it->second].second;
  }
  void set(const std::string &key, Value v) {
    auto it = index.find(key);
    if (it != index.end()) {
      items[it->second].second = std::move(v);
    } else {
      index.emplace(key, items.size());
      items.emplace_back(key, std::move(v));
    }
  }
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  int line = 0;

  // Argument `pos` by position or by name, Python-style; Undefined when absent.
  Value get(size_t pos, const std::string &name) const;
  bool has(size_t pos, const std::string &name) const;
};

bool values_equal(const Value &a, const Value &b);
// Python's <; throws TemplateError for unorderable types.
bool value_less(const Value &a, const Value &b);
std::string python_float_repr(double d);
std::string html_escape(const std::string &s);

struct JsonOptions {
  std::optional<std::string> indent; // None, or the indent unit
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};
// Python json.dumps(value, ...) for the values a template can build.
std::string python_json_dumps(const Value &v, const JsonOptions &options);
nlohmann::ordered_json value_to_json(const Value &v);

// UTF-8 helpers: Python indexes strings by code point.
std::vector<std::string> utf8_chars(const std::string &s);
size_t utf8_length(const std::string &s);
// Python's str.upper()/lower() for Latin, Greek and Cyrillic letters (and ß -> SS); other
// characters pass through unchanged.
std::string utf8_upper(const std::string &s);
std::string utf8_lower(const std::string &s);
bool utf8_is_cased(const std::string &ch); // one character: has an upper or lower form
bool utf8_is_space(const std::string &ch); // one character: Python's str.isspace()

} // namespace offgraph::text::jinja
