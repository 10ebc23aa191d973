// Python semantics the interpreter delegates to: attribute and item access (including the str,
// dict and list methods the sandbox allows), operators, and the built-in filters and tests.
#pragma once

#include <string>

#include "text/template/jinja_value.h"

namespace offgraph::text::jinja {

// Jinja2's getattr(obj, name): a Python attribute (method) first, then obj[name]; Undefined with a
// hint when neither exists. `obj` must not be Undefined.
Value get_attribute(const Value &obj, const std::string &name);
// Jinja2's getitem(obj, key): obj[key] first, then the attribute for string keys.
Value get_item(const Value &obj, const Value &key);
Value slice_value(const Value &obj, const Value &start, const Value &stop, const Value &step);

// op is one of + - * / // % ** ~
Value binary_op(const std::string &op, const Value &a, const Value &b);
bool contains(const Value &container, const Value &item);
// The items a for loop sees: list elements, dict keys, string characters; [] for Undefined.
List iterate(const Value &v);

// Throws TemplateError with the Undefined's hint ("'x' is undefined").
[[noreturn]] void fail_undefined(const Value &v);

Value apply_filter(const std::string &name, const Value &target, CallArgs &args);
bool apply_test(const std::string &name, const Value &target, CallArgs &args);
bool has_filter(const std::string &name);
bool has_test(const std::string &name);

} // namespace offgraph::text::jinja
