// The syntax tree the parser builds and the interpreter walks. One node type per layer keeps the
// tree small; `kind` says which fields are used.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/template/jinja_value.h"

namespace offgraph::text::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::shared_ptr<Expr>;
using StmtPtr = std::shared_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class ExprKind {
  Literal,     // value
  Name,        // name
  ListLiteral, // args
  Tuple,       // args
  DictLiteral, // args: key, value, key, value, ...
  GetAttr,     // a.name
  GetItem,     // a[b]
  Slice,       // a[b:c:d]; null parts are absent
  Call,        // a(args, kwargs)
  Filter,      // a | name(args, kwargs); a is null inside filter blocks
  Test,        // a is [not] name(args)
  Unary,       // name in {"-", "+", "not"} applied to a
  Binary,      // a name b, name an arithmetic operator, "~", "and", "or"
  Compare,     // args[0] ops[0] args[1] ops[1] args[2] ...
  Cond,        // a if b else c (c may be null)
};

struct Expr {
  ExprKind kind;
  int line = 0;
  Value value;
  std::string name;
  ExprPtr a, b, c, d;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
  bool negated = false;
};

enum class StmtKind {
  Text,        // text
  Output,      // {{ expr }}
  If,          // branches (cond null for else)
  For,         // targets in expr [if cond] body [else else_body]
  Set,         // targets = expr, or targets[0].attr = expr
  SetBlock,    // {% set targets[0] | filters %}body{% endset %}
  Macro,       // name(params = defaults) body
  CallBlock,   // {% call(params) expr %}body{% endcall %}
  FilterBlock, // {% filter filters %}body{% endfilter %}
  With,        // {% with targets = values %}body
  Break,
  Continue,
  Scope, // a body with no scope of its own, e.g. {% generation %}
};

struct Stmt {
  StmtKind kind;
  int line = 0;
  std::string text;
  ExprPtr expr, cond;
  std::vector<std::string> targets;
  std::string attr;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body, else_body;
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults; // per param, null when it has none
  std::vector<ExprPtr> filters;  // Filter nodes with a == null, applied in order
  std::vector<ExprPtr> values;   // for With
};

// Parses template source; throws TemplateError with the line on a syntax error.
Body parse_template(const std::string &source);

} // namespace offgraph::text::jinja
