#include "text/template/jinja_render.h"

#include <unordered_map>

#include "text/template/jinja_builtins.h"

namespace offgraph::text::jinja {
namespace {

struct Frame {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Frame> parent;

  Value lookup(const std::string &name) const {
    for (const Frame *f = this; f; f = f->parent.get()) {
      auto it = f->vars.find(name);
      if (it != f->vars.end()) return it->second;
    }
    return Value::undefined("'" + name + "' is undefined");
  }
};
using FramePtr = std::shared_ptr<Frame>;

FramePtr child(const FramePtr &parent) {
  auto f = std::make_shared<Frame>();
  f->parent = parent;
  return f;
}

enum class Flow { Normal, Break, Continue };

// Deep enough for any real template, shallow enough that runaway macro recursion cannot overflow
// the stack.
constexpr int kMaxDepth = 200;
constexpr int64_t kMaxIterations = 1'000'000; // real chat templates loop over messages and tools
constexpr size_t kMaxOutput = size_t(64) << 20;

class Interpreter {
public:
  explicit Interpreter(const RenderSettings &settings) : settings_(settings) {}

  Flow exec_body(const Body &body, const FramePtr &frame, std::string &out) {
    for (const StmtPtr &s : body) {
      Flow f = exec(*s, frame, out);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  Value eval(const Expr &e, const FramePtr &frame) {
    switch (e.kind) {
    case ExprKind::Literal:
      return e.value;
    case ExprKind::Name:
      return frame->lookup(e.name);
    case ExprKind::ListLiteral:
    case ExprKind::Tuple: {
      List l;
      for (const auto &a : e.args) l.push_back(eval(*a, frame));
      return e.kind == ExprKind::Tuple ? Value::tuple(std::move(l)) : Value(std::move(l));
    }
    case ExprKind::DictLiteral: {
      Value d = Value::dict();
      for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
        Value k = eval(*e.args[i], frame);
        d.as_dict().set(Dict::encode_key(k), eval(*e.args[i + 1], frame));
      }
      return d;
    }
    case ExprKind::GetAttr:
      return get_attribute(eval(*e.a, frame), e.name);
    case ExprKind::GetItem:
      return get_item(eval(*e.a, frame), eval(*e.b, frame));
    case ExprKind::Slice:
      return slice_value(eval(*e.a, frame), e.b ? eval(*e.b, frame) : Value::none(),
                         e.c ? eval(*e.c, frame) : Value::none(),
                         e.d ? eval(*e.d, frame) : Value::none());
    case ExprKind::Call: {
      Value callee = eval(*e.a, frame);
      CallArgs args = eval_args(e, frame);
      return call(callee, args);
    }
    case ExprKind::Filter: {
      Value target = eval(*e.a, frame);
      CallArgs args = eval_args(e, frame);
      return apply_filter(e.name, target, args);
    }
    case ExprKind::Test: {
      Value target = eval(*e.a, frame);
      CallArgs args = eval_args(e, frame);
      return Value(apply_test(e.name, target, args) != e.negated);
    }
    case ExprKind::Unary: {
      Value v = eval(*e.a, frame);
      if (e.name == "not") return Value(!v.truthy());
      if (v.is_undefined()) fail_undefined(v);
      if (!v.is_number())
        throw TemplateError(std::string("bad operand type for unary ") + e.name + ": '" +
                            v.type_name() + "'");
      if (e.name == "+") return v.is_bool() ? Value(v.as_int()) : v;
      return v.is_float() ? Value(-v.as_float()) : Value(-v.as_int());
    }
    case ExprKind::Binary: {
      Value a = eval(*e.a, frame);
      if (e.name == "and") return a.truthy() ? eval(*e.b, frame) : a;
      if (e.name == "or") return a.truthy() ? a : eval(*e.b, frame);
      return binary_op(e.name, a, eval(*e.b, frame));
    }
    case ExprKind::Compare: {
      Value left = eval(*e.args[0], frame);
      for (size_t i = 0; i < e.ops.size(); ++i) {
        Value right = eval(*e.args[i + 1], frame);
        if (!compare(e.ops[i], left, right)) return Value(false);
        left = right;
      }
      return Value(true);
    }
    case ExprKind::Cond:
      if (eval(*e.b, frame).truthy()) return eval(*e.a, frame);
      return e.c ? eval(*e.c, frame) : Value::undefined("the inline if-expression had no else");
    }
    return Value();
  }

private:
  static bool compare(const std::string &op, const Value &a, const Value &b) {
    if (op == "==") return values_equal(a, b);
    if (op == "!=") return !values_equal(a, b);
    if (op == "in") return contains(b, a);
    if (op == "notin") return !contains(b, a);
    if (a.is_undefined()) fail_undefined(a);
    if (b.is_undefined()) fail_undefined(b);
    if (op == "<") return value_less(a, b);
    if (op == ">") return value_less(b, a);
    if (op == "<=") return !value_less(b, a);
    return !value_less(a, b); // ">="
  }

  CallArgs eval_args(const Expr &e, const FramePtr &frame) {
    CallArgs args;
    args.line = e.line;
    for (const auto &a : e.args) args.positional.push_back(eval(*a, frame));
    for (const auto &[k, v] : e.kwargs) args.keyword.emplace_back(k, eval(*v, frame));
    return args;
  }

  static Value call(const Value &callee, CallArgs &args) {
    if (callee.is_undefined()) fail_undefined(callee);
    if (!callee.is_function())
      throw TemplateError(std::string("'") + callee.type_name() + "' object is not callable");
    return callee.call(args);
  }

  // A macro (or a call block's caller) as a callable value bound to the frame it was defined in.
  // The frame is held weakly: a macro stored in the frame it closes over would otherwise form a
  // reference cycle and leak every render.
  Value make_macro(const Stmt &s, const FramePtr &frame, const std::string &name) {
    const Stmt *stmt = &s;
    std::weak_ptr<Frame> weak = frame;
    return Value::function(name, [this, stmt, weak, name](CallArgs &args) -> Value {
      FramePtr defined_in = weak.lock();
      if (!defined_in) throw TemplateError("macro '" + name + "' called after its scope ended");
      if (++depth_ > kMaxDepth) {
        --depth_;
        throw TemplateError("maximum recursion depth exceeded in macro '" + name + "'");
      }
      FramePtr f = child(defined_in);
      List varargs;
      for (size_t i = 0; i < args.positional.size(); ++i) {
        if (i < stmt->params.size())
          f->vars[stmt->params[i]] = args.positional[i];
        else
          varargs.push_back(args.positional[i]);
      }
      Value kwargs = Value::dict();
      for (const auto &[k, v] : args.keyword) {
        auto it = std::find(stmt->params.begin(), stmt->params.end(), k);
        if (it != stmt->params.end() || k == "caller") {
          if (it != stmt->params.end() &&
              static_cast<size_t>(it - stmt->params.begin()) < args.positional.size())
            throw TemplateError("macro '" + name + "' got multiple values for argument '" + k +
                                "'");
          f->vars[k] = v;
        } else {
          kwargs.as_dict().set(k, v);
        }
      }
      for (size_t i = args.positional.size(); i < stmt->params.size(); ++i) {
        const std::string &p = stmt->params[i];
        if (f->vars.count(p)) continue;
        f->vars[p] = stmt->defaults[i] ? eval(*stmt->defaults[i], f)
                                       : Value::undefined("parameter '" + p + "' was not provided");
      }
      f->vars["varargs"] = Value::tuple(varargs);
      f->vars["kwargs"] = kwargs;
      std::string out;
      try {
        exec_body(stmt->body, f, out);
      } catch (...) {
        --depth_;
        throw;
      }
      --depth_;
      return Value(out);
    });
  }

  void assign(const FramePtr &frame, const std::vector<std::string> &targets, const Value &v) {
    if (targets.size() == 1) {
      frame->vars[targets[0]] = v;
      return;
    }
    List items = iterate(v);
    if (items.size() != targets.size())
      throw TemplateError("cannot unpack " + std::to_string(items.size()) + " values into " +
                          std::to_string(targets.size()) + " names");
    for (size_t i = 0; i < targets.size(); ++i) frame->vars[targets[i]] = items[i];
  }

  Value apply_filters(const std::vector<ExprPtr> &filters, Value v, const FramePtr &frame) {
    for (const auto &f : filters) {
      CallArgs args = eval_args(*f, frame);
      v = apply_filter(f->name, v, args);
    }
    return v;
  }

  Flow exec_for(const Stmt &s, const FramePtr &frame, std::string &out) {
    List items;
    for (Value &item : iterate(eval(*s.expr, frame))) {
      if (s.cond) {
        FramePtr f = child(frame);
        assign(f, s.targets, item);
        if (!eval(*s.cond, f).truthy()) continue;
      }
      items.push_back(std::move(item));
    }
    if (items.empty()) return exec_body(s.else_body, frame, out);
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      // Nested loops multiply: bound the total work of one render, and its output.
      if (++iterations_ > kMaxIterations)
        throw TemplateError("template ran too long (over 1M loop iterations)");
      if (out.size() > kMaxOutput) throw TemplateError("template output too large (over 64 MiB)");
      FramePtr f = child(frame);
      assign(f, s.targets, items[static_cast<size_t>(i)]);
      Value loop = Value::dict();
      Dict &d = loop.as_dict();
      d.set("index", Value(i + 1));
      d.set("index0", Value(i));
      d.set("revindex", Value(n - i));
      d.set("revindex0", Value(n - i - 1));
      d.set("first", Value(i == 0));
      d.set("last", Value(i == n - 1));
      d.set("length", Value(n));
      d.set("depth", Value(1));
      d.set("depth0", Value(0));
      d.set("previtem", i > 0 ? items[static_cast<size_t>(i - 1)]
                              : Value::undefined("there is no previous item"));
      d.set("nextitem", i + 1 < n ? items[static_cast<size_t>(i + 1)]
                                  : Value::undefined("there is no next item"));
      d.set("cycle", Value::function("cycle", [i](CallArgs &a) -> Value {
              if (a.positional.empty()) throw TemplateError("no items for cycling given");
              return a.positional[static_cast<size_t>(i) % a.positional.size()];
            }));
      f->vars["loop"] = loop;
      if (exec_body(s.body, f, out) == Flow::Break) break;
    }
    return Flow::Normal;
  }

  Flow exec(const Stmt &s, const FramePtr &frame, std::string &out) {
    try {
      switch (s.kind) {
      case StmtKind::Text:
        out += s.text;
        break;
      case StmtKind::Output:
        out += eval(*s.expr, frame).str();
        break;
      case StmtKind::If:
        for (const auto &[cond, body] : s.branches) {
          if (!cond || eval(*cond, frame).truthy()) return exec_body(body, frame, out);
        }
        break;
      case StmtKind::For:
        return exec_for(s, frame, out);
      case StmtKind::Set: {
        Value v = eval(*s.expr, frame);
        if (!s.attr.empty()) {
          Value ns = frame->lookup(s.targets[0]);
          if (!ns.is_namespace())
            throw TemplateError("cannot assign attribute on non-namespace object");
          ns.as_dict().set(s.attr, v);
        } else {
          assign(frame, s.targets, v);
        }
        break;
      }
      case StmtKind::SetBlock: {
        std::string text;
        exec_body(s.body, frame, text);
        frame->vars[s.targets[0]] = apply_filters(s.filters, Value(text), frame);
        break;
      }
      case StmtKind::Macro:
        frame->vars[s.name] = make_macro(s, frame, s.name);
        break;
      case StmtKind::CallBlock: {
        Value callee = eval(*s.expr->a, frame);
        CallArgs args = eval_args(*s.expr, frame);
        args.keyword.emplace_back("caller", make_macro(s, frame, "caller"));
        out += call(callee, args).str();
        break;
      }
      case StmtKind::FilterBlock: {
        std::string text;
        exec_body(s.body, frame, text);
        out += apply_filters(s.filters, Value(text), frame).str();
        break;
      }
      case StmtKind::With: {
        FramePtr f = child(frame);
        for (size_t i = 0; i < s.targets.size(); ++i)
          f->vars[s.targets[i]] = eval(*s.values[i], frame);
        return exec_body(s.body, f, out);
      }
      case StmtKind::Scope:
        return exec_body(s.body, child(frame), out);
      case StmtKind::Break:
        return Flow::Break;
      case StmtKind::Continue:
        return Flow::Continue;
      }
    } catch (TemplateError &e) {
      e.set_line(s.line);
      throw;
    }
    return Flow::Normal;
  }

  [[maybe_unused]] const RenderSettings &settings_; // not read today
  int depth_ = 0;
  int64_t iterations_ = 0;
};

Value make_globals(const RenderSettings &settings) {
  Value g = Value::dict();
  Dict &d = g.as_dict();
  d.set("raise_exception", Value::function("raise_exception", [](CallArgs &a) -> Value {
          throw TemplateError(a.get(0, "message").str(), a.line, true);
        }));
  std::tm now = settings.now;
  d.set("strftime_now", Value::function("strftime_now", [now](CallArgs &a) -> Value {
          std::string fmt = a.get(0, "format").str();
          if (fmt.empty()) return Value("");
          std::string buf(256 + fmt.size() * 8, '\0');
          size_t n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &now);
          buf.resize(n);
          return Value(buf);
        }));
  d.set("namespace", Value::function("namespace", [](CallArgs &a) -> Value {
          Value ns = Value::namespace_object();
          for (const Value &p : a.positional) {
            if (!p.is_dict()) throw TemplateError("namespace() takes a mapping");
            for (const auto &[k, v] : p.as_dict().items) ns.as_dict().set(k, v);
          }
          for (const auto &[k, v] : a.keyword) ns.as_dict().set(k, v);
          return ns;
        }));
  d.set("dict", Value::function("dict", [](CallArgs &a) -> Value {
          Value out = Value::dict();
          for (const auto &[k, v] : a.keyword) out.as_dict().set(k, v);
          return out;
        }));
  d.set("range", Value::function("range", [](CallArgs &a) -> Value {
          int64_t start = 0, stop = 0, step = 1;
          if (a.positional.size() == 1) {
            stop = a.positional[0].as_int();
          } else if (a.positional.size() >= 2) {
            start = a.positional[0].as_int();
            stop = a.positional[1].as_int();
            if (a.positional.size() > 2) step = a.positional[2].as_int();
          }
          if (step == 0) throw TemplateError("range() arg 3 must not be zero");
          List l;
          for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
            l.push_back(Value(i));
            if (l.size() > 100000) throw TemplateError("range too big");
          }
          return Value(l);
        }));
  return g;
}

} // namespace

std::string render_body(const Body &body, const Value &context, const RenderSettings &settings) {
  auto globals = std::make_shared<Frame>();
  const Value builtins = make_globals(settings);
  for (const auto &[k, v] : builtins.as_dict().items) globals->vars[k] = v;
  FramePtr ctx = child(globals);
  if (context.is_dict())
    for (const auto &[k, v] : context.as_dict().items) ctx->vars[k] = v;
  FramePtr top = child(ctx);
  Interpreter interp(settings);
  std::string out;
  Flow f = interp.exec_body(body, top, out);
  (void)f;
  return out;
}

} // namespace offgraph::text::jinja
