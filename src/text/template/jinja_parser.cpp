// A recursive-descent parser following Jinja2's own grammar (jinja2/parser.py), so operator
// precedence and the corner cases (filters binding tighter than unary minus's operand, tests taking
// one bare argument, `for ... if ...` loop filters) match the reference.
#include <algorithm>
#include <set>

#include "text/template/jinja_ast.h"
#include "text/template/jinja_lexer.h"

namespace offgraph::text::jinja {
namespace {

// Nesting deeper than this is refused so hostile input cannot overflow the stack (here or in the
// interpreter, whose recursion follows the tree).
constexpr int kMaxNesting = 256;

class Parser {
public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  Body parse_all() {
    std::string found;
    Body body = parse_body({}, &found);
    return body;
  }

private:
  struct NestingGuard {
    explicit NestingGuard(Parser &p) : parser(p) {
      if (++parser.depth_ > kMaxNesting) parser.fail("template nested too deeply");
    }
    ~NestingGuard() { --parser.depth_; }
    Parser &parser;
  };

  const Token &cur() const { return t_[i_]; }
  const Token &peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  [[noreturn]] void fail(const std::string &msg) const { throw TemplateError(msg, cur().line); }
  bool is_op(const char *op) const { return cur().type == TokenType::Op && cur().value == op; }
  bool is_name(const char *n) const { return cur().type == TokenType::Name && cur().value == n; }
  bool skip_op(const char *op) {
    if (!is_op(op)) return false;
    ++i_;
    return true;
  }
  bool skip_name(const char *n) {
    if (!is_name(n)) return false;
    ++i_;
    return true;
  }
  std::string describe(const Token &t) const {
    switch (t.type) {
    case TokenType::Eof:
      return "end of template";
    case TokenType::BlockEnd:
      return "end of statement block";
    case TokenType::VarEnd:
      return "end of print statement";
    case TokenType::Text:
      return "template data";
    default:
      return "'" + t.value + "'";
    }
  }
  void expect_op(const char *op) {
    if (!skip_op(op)) fail(std::string("expected token '") + op + "', got " + describe(cur()));
  }
  std::string expect_name() {
    if (cur().type != TokenType::Name) fail("expected token 'name', got " + describe(cur()));
    return t_[i_++].value;
  }
  void expect_block_end() {
    if (cur().type != TokenType::BlockEnd)
      fail("expected token 'end of statement block', got " + describe(cur()));
    ++i_;
  }

  ExprPtr node(ExprKind k, int line) {
    auto e = std::make_shared<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }

  // Statements ---------------------------------------------------------------------------------

  Body parse_body(const std::set<std::string> &ends, std::string *found) {
    Body body;
    for (;;) {
      const Token &tok = cur();
      if (tok.type == TokenType::Eof) {
        if (ends.empty()) return body;
        std::string names;
        for (const auto &e : ends) names += (names.empty() ? "'" : " or '") + e + "'";
        fail("Unexpected end of template. Jinja was looking for the following tags: " + names +
             ".");
      }
      if (tok.type == TokenType::Text) {
        auto s = std::make_shared<Stmt>();
        s->kind = StmtKind::Text;
        s->line = tok.line;
        s->text = tok.value;
        body.push_back(s);
        ++i_;
      } else if (tok.type == TokenType::VarBegin) {
        ++i_;
        auto s = std::make_shared<Stmt>();
        s->kind = StmtKind::Output;
        s->line = tok.line;
        s->expr = parse_tuple(true);
        if (cur().type != TokenType::VarEnd)
          fail("expected token 'end of print statement', got " + describe(cur()));
        ++i_;
        body.push_back(s);
      } else if (tok.type == TokenType::BlockBegin) {
        ++i_;
        if (cur().type != TokenType::Name) fail("tag name expected");
        if (ends.count(cur().value)) {
          *found = t_[i_++].value;
          return body;
        }
        body.push_back(parse_statement());
      } else {
        fail("unexpected " + describe(tok));
      }
    }
  }

  StmtPtr parse_statement() {
    NestingGuard guard(*this);
    auto s = std::make_shared<Stmt>();
    s->line = cur().line;
    std::string tag = expect_name();
    std::string found;
    if (tag == "if") {
      s->kind = StmtKind::If;
      ExprPtr cond = parse_tuple(true);
      for (;;) {
        expect_block_end();
        Body b = parse_body({"elif", "else", "endif"}, &found);
        s->branches.emplace_back(cond, std::move(b));
        if (found == "elif") {
          cond = parse_tuple(true);
        } else if (found == "else") {
          expect_block_end();
          s->branches.emplace_back(nullptr, parse_body({"endif"}, &found));
          break;
        } else {
          break;
        }
      }
    } else if (tag == "for") {
      s->kind = StmtKind::For;
      s->targets = parse_targets();
      if (!skip_name("in")) fail("expected 'in', got " + describe(cur()));
      s->expr = parse_tuple(false);
      if (skip_name("if")) s->cond = parse_expression(true);
      if (skip_name("recursive")) fail("recursive for loops are not supported");
      expect_block_end();
      s->body = parse_body({"endfor", "else"}, &found);
      if (found == "else") {
        expect_block_end();
        s->else_body = parse_body({"endfor"}, &found);
      }
    } else if (tag == "set") {
      if (cur().type == TokenType::Name && peek().type == TokenType::Op && peek().value == ".") {
        s->kind = StmtKind::Set;
        s->targets = {expect_name()};
        ++i_;
        s->attr = expect_name();
        expect_op("=");
        s->expr = parse_tuple(true);
      } else {
        s->targets = parse_targets();
        if (skip_op("=")) {
          s->kind = StmtKind::Set;
          s->expr = parse_tuple(true);
        } else {
          s->kind = StmtKind::SetBlock;
          if (s->targets.size() != 1) fail("block set takes one name");
          while (skip_op("|")) s->filters.push_back(parse_filter(nullptr));
          expect_block_end();
          s->body = parse_body({"endset"}, &found);
        }
      }
    } else if (tag == "macro") {
      s->kind = StmtKind::Macro;
      s->name = expect_name();
      parse_signature(*s);
      expect_block_end();
      s->body = parse_body({"endmacro"}, &found);
    } else if (tag == "call") {
      s->kind = StmtKind::CallBlock;
      if (is_op("(")) parse_signature(*s);
      s->expr = parse_expression(true);
      if (s->expr->kind != ExprKind::Call) fail("expected call");
      expect_block_end();
      s->body = parse_body({"endcall"}, &found);
    } else if (tag == "filter") {
      s->kind = StmtKind::FilterBlock;
      do {
        s->filters.push_back(parse_filter(nullptr));
      } while (skip_op("|"));
      expect_block_end();
      s->body = parse_body({"endfilter"}, &found);
    } else if (tag == "with") {
      s->kind = StmtKind::With;
      while (cur().type != TokenType::BlockEnd) {
        if (!s->targets.empty()) expect_op(",");
        s->targets.push_back(expect_name());
        expect_op("=");
        s->values.push_back(parse_expression(true));
      }
      expect_block_end();
      s->body = parse_body({"endwith"}, &found);
    } else if (tag == "generation") {
      // Hugging Face's AssistantTracker extension: renders its body unchanged.
      s->kind = StmtKind::Scope;
      expect_block_end();
      s->body = parse_body({"endgeneration"}, &found);
    } else if (tag == "break" || tag == "continue") {
      s->kind = tag == "break" ? StmtKind::Break : StmtKind::Continue;
    } else {
      --i_;
      fail("Encountered unknown tag '" + tag + "'.");
    }
    expect_block_end();
    return s;
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> names;
    bool paren = skip_op("(");
    names.push_back(expect_name());
    while (skip_op(",")) {
      if (cur().type != TokenType::Name) break;
      names.push_back(expect_name());
    }
    if (paren) expect_op(")");
    return names;
  }

  void parse_signature(Stmt &s) {
    expect_op("(");
    while (!skip_op(")")) {
      if (!s.params.empty()) expect_op(",");
      if (skip_op(")")) break;
      s.params.push_back(expect_name());
      s.defaults.push_back(skip_op("=") ? parse_expression(true) : nullptr);
    }
  }

  // Expressions --------------------------------------------------------------------------------

  bool is_tuple_end() const {
    const Token &t = cur();
    if (t.type == TokenType::VarEnd || t.type == TokenType::BlockEnd || t.type == TokenType::Eof)
      return true;
    if (t.type == TokenType::Op && (t.value == ")" || t.value == "]" || t.value == "}"))
      return true;
    return t.type == TokenType::Name && (t.value == "recursive" || t.value == "if");
  }

  ExprPtr parse_tuple(bool with_condexpr, bool explicit_parens = false) {
    int line = cur().line;
    std::vector<ExprPtr> items;
    bool saw_comma = false;
    for (;;) {
      if (explicit_parens && items.empty() && is_op(")")) break;
      if (!items.empty()) {
        if (!skip_op(",")) break;
        saw_comma = true;
        if (is_tuple_end()) break;
      }
      items.push_back(with_condexpr ? parse_expression(true) : parse_or());
    }
    if (!saw_comma && !items.empty()) return items[0];
    if (items.empty() && !explicit_parens) fail("Expected an expression, got " + describe(cur()));
    auto e = node(ExprKind::Tuple, line);
    e->args = std::move(items);
    return e;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    if (!with_condexpr) return parse_or();
    ExprPtr e = parse_or();
    while (is_name("if")) {
      auto c = node(ExprKind::Cond, cur().line);
      ++i_;
      c->a = e;
      c->b = parse_or();
      if (skip_name("else")) c->c = parse_expression(true);
      e = c;
    }
    return e;
  }

  ExprPtr binary(const std::string &op, ExprPtr l, ExprPtr r, int line) {
    auto e = node(ExprKind::Binary, line);
    e->name = op;
    e->a = std::move(l);
    e->b = std::move(r);
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr l = parse_and();
    while (is_name("or")) {
      int line = t_[i_++].line;
      l = binary("or", l, parse_and(), line);
    }
    return l;
  }
  ExprPtr parse_and() {
    ExprPtr l = parse_not();
    while (is_name("and")) {
      int line = t_[i_++].line;
      l = binary("and", l, parse_not(), line);
    }
    return l;
  }
  ExprPtr parse_not() {
    NestingGuard guard(*this);
    if (is_name("not")) {
      auto e = node(ExprKind::Unary, t_[i_++].line);
      e->name = "not";
      e->a = parse_not();
      return e;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    int line = cur().line;
    ExprPtr first = parse_math1();
    auto e = node(ExprKind::Compare, line);
    e->args.push_back(first);
    static const std::set<std::string> ops = {"==", "!=", "<", ">", "<=", ">="};
    for (;;) {
      if (cur().type == TokenType::Op && ops.count(cur().value)) {
        e->ops.push_back(t_[i_++].value);
      } else if (skip_name("in")) {
        e->ops.push_back("in");
      } else if (is_name("not") && peek().type == TokenType::Name && peek().value == "in") {
        i_ += 2;
        e->ops.push_back("notin");
      } else {
        break;
      }
      e->args.push_back(parse_math1());
    }
    return e->ops.empty() ? first : e;
  }
  ExprPtr parse_math1() {
    ExprPtr l = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token &op = t_[i_++];
      l = binary(op.value, l, parse_concat(), op.line);
    }
    return l;
  }
  ExprPtr parse_concat() {
    ExprPtr l = parse_math2();
    while (is_op("~")) {
      int line = t_[i_++].line;
      l = binary("~", l, parse_math2(), line);
    }
    return l;
  }
  ExprPtr parse_math2() {
    ExprPtr l = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token &op = t_[i_++];
      l = binary(op.value, l, parse_pow(), op.line);
    }
    return l;
  }
  ExprPtr parse_pow() {
    ExprPtr l = parse_unary(true);
    while (is_op("**")) {
      int line = t_[i_++].line;
      l = binary("**", l, parse_unary(true), line);
    }
    return l;
  }
  ExprPtr parse_unary(bool with_filter) {
    NestingGuard guard(*this);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      e = node(ExprKind::Unary, cur().line);
      e->name = t_[i_++].value;
      e->a = parse_unary(false);
    } else {
      e = parse_primary();
    }
    e = parse_postfix(e);
    if (with_filter) e = parse_filter_expr(e);
    return e;
  }

  ExprPtr parse_primary() {
    const Token &t = cur();
    int line = t.line;
    switch (t.type) {
    case TokenType::Name: {
      ++i_;
      auto e = node(ExprKind::Literal, line);
      if (t.value == "true" || t.value == "True")
        e->value = Value(true);
      else if (t.value == "false" || t.value == "False")
        e->value = Value(false);
      else if (t.value == "none" || t.value == "None")
        e->value = Value::none();
      else {
        e->kind = ExprKind::Name;
        e->name = t.value;
      }
      return e;
    }
    case TokenType::String: {
      std::string s;
      while (cur().type == TokenType::String) s += t_[i_++].value;
      auto e = node(ExprKind::Literal, line);
      e->value = Value(s);
      return e;
    }
    case TokenType::Int: {
      ++i_;
      auto e = node(ExprKind::Literal, line);
      e->value = Value(static_cast<int64_t>(std::stoll(t.value)));
      return e;
    }
    case TokenType::Float: {
      ++i_;
      auto e = node(ExprKind::Literal, line);
      e->value = Value(std::stod(t.value));
      return e;
    }
    default:
      break;
    }
    if (skip_op("(")) {
      ExprPtr e = parse_tuple(true, true);
      expect_op(")");
      return e;
    }
    if (skip_op("[")) {
      auto e = node(ExprKind::ListLiteral, line);
      while (!skip_op("]")) {
        if (!e->args.empty()) expect_op(",");
        if (skip_op("]")) break;
        e->args.push_back(parse_expression(true));
      }
      return e;
    }
    if (skip_op("{")) {
      auto e = node(ExprKind::DictLiteral, line);
      while (!skip_op("}")) {
        if (!e->args.empty()) expect_op(",");
        if (skip_op("}")) break;
        e->args.push_back(parse_expression(true));
        expect_op(":");
        e->args.push_back(parse_expression(true));
      }
      return e;
    }
    fail("unexpected " + describe(t));
  }

  ExprPtr parse_postfix(ExprPtr e) {
    for (;;) {
      int line = cur().line;
      if (skip_op(".")) {
        if (cur().type == TokenType::Int) {
          auto g = node(ExprKind::GetItem, line);
          g->a = e;
          g->b = node(ExprKind::Literal, line);
          g->b->value = Value(static_cast<int64_t>(std::stoll(t_[i_++].value)));
          e = g;
        } else {
          auto g = node(ExprKind::GetAttr, line);
          g->a = e;
          g->name = expect_name();
          e = g;
        }
      } else if (skip_op("[")) {
        e = parse_subscript(e, line);
      } else if (is_op("(")) {
        e = parse_call(e);
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr target, int line) {
    ExprPtr start, stop, step;
    bool slice = false;
    if (!is_op(":")) start = parse_expression(true);
    if (skip_op(":")) {
      slice = true;
      if (!is_op("]") && !is_op(":")) stop = parse_expression(true);
      if (skip_op(":") && !is_op("]")) step = parse_expression(true);
    }
    expect_op("]");
    auto e = node(slice ? ExprKind::Slice : ExprKind::GetItem, line);
    e->a = target;
    e->b = start;
    e->c = stop;
    e->d = step;
    return e;
  }

  void parse_args(Expr &e) {
    expect_op("(");
    bool first = true;
    while (!skip_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (skip_op(")")) break;
      if (is_op("*") || is_op("**")) fail("*args and **kwargs in calls are not supported");
      if (cur().type == TokenType::Name && peek().type == TokenType::Op && peek().value == "=") {
        std::string key = t_[i_].value;
        i_ += 2;
        e.kwargs.emplace_back(key, parse_expression(true));
      } else {
        if (!e.kwargs.empty()) fail("positional argument follows keyword argument");
        e.args.push_back(parse_expression(true));
      }
    }
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto e = node(ExprKind::Call, cur().line);
    e->a = callee;
    parse_args(*e);
    return e;
  }

  ExprPtr parse_filter(ExprPtr target) {
    auto e = node(ExprKind::Filter, cur().line);
    e->a = target;
    e->name = expect_name();
    while (skip_op(".")) e->name += "." + expect_name();
    if (is_op("(")) parse_args(*e);
    return e;
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    for (;;) {
      if (skip_op("|")) {
        e = parse_filter(e);
      } else if (is_name("is")) {
        auto t = node(ExprKind::Test, t_[i_++].line);
        t->a = e;
        t->negated = skip_name("not");
        t->name = expect_name();
        while (skip_op(".")) t->name += "." + expect_name();
        const Token &n = cur();
        if (is_op("(")) {
          parse_args(*t);
        } else if ((n.type == TokenType::Name || n.type == TokenType::String ||
                    n.type == TokenType::Int || n.type == TokenType::Float || is_op("(") ||
                    is_op("[") || is_op("{")) &&
                   !(is_name("else") || is_name("or") || is_name("and"))) {
          if (is_name("is")) fail("You cannot chain multiple tests with is");
          t->args.push_back(parse_postfix(parse_primary()));
        }
        e = t;
      } else if (is_op("(")) {
        e = parse_call(e);
      } else {
        return e;
      }
    }
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  int depth_ = 0;
};

} // namespace

Body parse_template(const std::string &source) {
  return Parser(tokenize(source, LexOptions{})).parse_all();
}

} // namespace offgraph::text::jinja
