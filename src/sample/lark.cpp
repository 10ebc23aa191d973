#include "sample/lark.h"

#include "base/utf8.h"
#include "sample/json_schema.h"
#include "sample/json_schema_internal.h"

#include <map>
#include <optional>
#include <set>

namespace offgraph::sample {

namespace {

// Lark's common.lark terminals, written here in the subset this reader takes (no lookbehind:
// ESCAPED_STRING and C_COMMENT are spelled as plain regular expressions).
constexpr std::string_view kCommon = R"lark(
DIGIT: "0".."9"
HEXDIGIT: "a".."f" | "A".."F" | DIGIT
INT: DIGIT+
SIGNED_INT: ["+" | "-"] INT
DECIMAL: INT "." INT? | "." INT
_EXP: ("e" | "E") SIGNED_INT
FLOAT: INT _EXP | DECIMAL _EXP?
SIGNED_FLOAT: ["+" | "-"] FLOAT
NUMBER: FLOAT | INT
SIGNED_NUMBER: ["+" | "-"] NUMBER
ESCAPED_STRING: /"(?:[^"\\\n]|\\[^\n])*"/
LCASE_LETTER: "a".."z"
UCASE_LETTER: "A".."Z"
LETTER: UCASE_LETTER | LCASE_LETTER
WORD: LETTER+
CNAME: ("_" | LETTER) ("_" | LETTER | DIGIT)*
WS_INLINE: (" " | "\t")+
WS: /[ \t\f\r\n]+/
CR: "\r"
LF: "\n"
NEWLINE: (CR? LF)+
SH_COMMENT: /#[^\n]*/
CPP_COMMENT: /\/\/[^\n]*/
C_COMMENT: /\/\*(?:[^*]|\*+[^*\/])*\*+\//
SQL_COMMENT: /--[^\n]*/
)lark";
constexpr std::string_view kCommonPrefix = "common:"; // no Lark name holds ':'
constexpr int kMaxNesting = 64;

// Where a node stands: line:column is worked out only for a message (counting lines for every
// node would make reading quadratic).
struct Pos {
  std::string_view text;
  size_t at = 0;
  std::string str() const {
    if (text.empty()) return "";
    size_t line = 1, col = 1;
    for (size_t k = 0; k < at && k < text.size(); ++k) {
      if (text[k] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    return std::to_string(line) + ":" + std::to_string(col);
  }
};

struct Node {
  enum class Kind { kSeq, kAlt, kLiteral, kRange, kRegex, kName, kRepeat };
  Kind kind = Kind::kSeq;
  std::vector<Node> kids;  // kSeq, kAlt; kRepeat: the one repeated node
  std::string text;        // kLiteral (bytes), kRegex (pattern), kName
  bool fold_case = false;  // kLiteral
  uint32_t lo = 0, hi = 0; // kRange: code points; kRepeat: bounds (hi may be kUnbounded)
  Pos where;
};

struct Definition {
  std::string name;
  Node body;
  Pos where;
};

bool is_terminal_name(std::string_view name) {
  // Terminals are uppercase (a leading '_' hides them from the tree); rules lowercase.
  if (name.starts_with(kCommonPrefix)) name.remove_prefix(kCommonPrefix.size());
  for (char c : name)
    if (c >= 'a' && c <= 'z') return false;
  return true;
}

class Reader {
public:
  Reader(std::string_view text, std::string prefix) : t_(text), prefix_(std::move(prefix)) {}

  std::vector<Definition> definitions;
  std::vector<Node> ignored;
  std::map<std::string, std::string> imports; // user name -> common name

  Status read() {
    while (true) {
      skip_blank_lines();
      if (i_ >= t_.size()) return Status();
      if (peek() == '%') {
        OFFGRAPH_TRY(directive());
      } else {
        OFFGRAPH_TRY(definition());
      }
    }
  }

private:
  char peek(size_t k = 0) const { return i_ + k < t_.size() ? t_[i_ + k] : '\0'; }
  std::string where(size_t at) const { return Pos{t_, at}.str(); }
  Status error(const std::string &what) const { return error_at(i_, what); }
  Status error_at(size_t at, const std::string &what) const {
    return Status::error("lark " + where(at) + ": " + what);
  }

  // Spaces, tabs and comments; newlines too inside brackets.
  void skip_space() {
    while (i_ < t_.size()) {
      const char c = t_[i_];
      if (c == ' ' || c == '\t' || c == '\r' || (c == '\n' && depth_ > 0)) {
        ++i_;
      } else if (c == '/' && peek(1) == '/') {
        while (i_ < t_.size() && t_[i_] != '\n') ++i_;
      } else {
        return;
      }
    }
  }
  void skip_blank_lines() {
    while (true) {
      skip_space();
      if (peek() != '\n') return;
      ++i_;
    }
  }
  // At a newline outside brackets: whether the next line continues the definition with '|'.
  bool continues() {
    size_t k = i_;
    while (k < t_.size()) {
      const char c = t_[k];
      if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
        ++k;
      } else if (c == '/' && k + 1 < t_.size() && t_[k + 1] == '/') {
        while (k < t_.size() && t_[k] != '\n') ++k;
      } else {
        break;
      }
    }
    if (k < t_.size() && t_[k] == '|') {
      i_ = k;
      return true;
    }
    return false;
  }

  std::string name() {
    const size_t start = i_;
    while (i_ < t_.size() && (std::isalnum(uint8_t(t_[i_])) || t_[i_] == '_')) ++i_;
    return std::string(t_.substr(start, i_ - start));
  }
  std::string mapped(const std::string &n) const { return prefix_ + n; }

  Status definition() {
    const size_t start = i_;
    if (peek() == '?' || peek() == '!') ++i_; // tree shaping only
    const std::string n = name();
    if (n.empty() || std::isdigit(uint8_t(n[0])))
      return error_at(start, "expected a rule or terminal name, or a %directive");
    if (peek() == '{') return error("templates ('" + n + "{...}') are not supported");
    if (peek() == '.')
      return error("priorities ('" + n +
                   ".N') are not supported: they steer "
                   "Lark's lexer, which this reader does not follow");
    skip_space();
    if (peek() != ':') return error("expected ':' after '" + n + "'");
    ++i_;
    Definition d{mapped(n), {}, Pos{t_, start}};
    OFFGRAPH_TRY(expansions(d.body));
    skip_space();
    if (i_ < t_.size() && peek() != '\n') return error(std::string("unexpected '") + peek() + "'");
    definitions.push_back(std::move(d));
    return Status();
  }

  Status directive() {
    const size_t start = i_;
    ++i_;
    const std::string word = name();
    skip_space();
    if (word == "ignore") {
      Node n;
      OFFGRAPH_TRY(expansions(n));
      ignored.push_back(std::move(n));
    } else if (word == "import") {
      const size_t at = i_;
      std::string module = name();
      if (module != "common")
        return error_at(at, "only '%import common' is supported (Lark's common terminals)");
      if (peek() == '.') {
        ++i_;
        const std::string what = name();
        skip_space();
        std::string as = what;
        if (peek() == '-' && peek(1) == '>') {
          i_ += 2;
          skip_space();
          as = name();
        }
        OFFGRAPH_TRY(add_import(as, what, at));
      } else {
        skip_space();
        if (peek() != '(') return error("expected '.NAME' or '(NAMES)' after '%import common'");
        ++i_;
        ++depth_;
        while (true) {
          skip_space();
          if (peek() == ')') break;
          const std::string what = name();
          if (what.empty()) return error("expected a name in the import list");
          OFFGRAPH_TRY(add_import(what, what, at));
          skip_space();
          if (peek() == ',') ++i_;
        }
        --depth_;
        ++i_;
      }
    } else {
      return error_at(start, "'%" + word + "' is not supported");
    }
    skip_space();
    if (i_ < t_.size() && peek() != '\n') return error(std::string("unexpected '") + peek() + "'");
    return Status();
  }

  Status add_import(const std::string &as, const std::string &what, size_t at) {
    if (as.empty() || what.empty()) return error_at(at, "expected a name to import");
    const std::string key = std::string(kCommonPrefix) + what;
    if (kCommon.find("\n" + what + ":") == std::string_view::npos)
      return error_at(at, "common." + what + " is not one of Lark's common terminals");
    imports[mapped(as)] = key;
    return Status();
  }

  Status expansions(Node &out) {
    if (++depth_guard_ > kMaxNesting) return error("nested past " + std::to_string(kMaxNesting));
    out.kind = Node::Kind::kAlt;
    while (true) {
      Node seq;
      seq.kind = Node::Kind::kSeq;
      OFFGRAPH_TRY(alternative(seq));
      out.kids.push_back(std::move(seq));
      skip_space();
      if (peek() == '|') {
        ++i_;
        continue;
      }
      if (peek() == '\n' && depth_ == 0 && continues()) {
        ++i_;
        continue;
      }
      break;
    }
    --depth_guard_;
    return Status();
  }

  Status alternative(Node &seq) {
    while (true) {
      skip_space();
      const char c = peek();
      if (c == '-' && peek(1) == '>') { // an alias names the tree node
        i_ += 2;
        skip_space();
        if (name().empty()) return error("expected a name after '->'");
        return Status();
      }
      if (c == '\0' || c == '\n' || c == '|' || c == ')' || c == ']') return Status();
      Node item;
      OFFGRAPH_TRY(atom(item));
      OFFGRAPH_TRY(postfix(item));
      seq.kids.push_back(std::move(item));
    }
  }

  Status postfix(Node &item) {
    skip_space();
    const char c = peek();
    auto wrap = [&](uint32_t lo, uint32_t hi) {
      Node r;
      r.kind = Node::Kind::kRepeat;
      r.lo = lo;
      r.hi = hi;
      r.where = item.where;
      r.kids.push_back(std::move(item));
      item = std::move(r);
    };
    if (c == '?' || c == '*' || c == '+') {
      ++i_;
      wrap(c == '+' ? 1 : 0, c == '?' ? 1 : kUnbounded);
    } else if (c == '~') {
      ++i_;
      skip_space();
      auto lo = number();
      if (!lo) return error("expected a count after '~'");
      uint32_t hi = *lo;
      if (peek() == '.' && peek(1) == '.') {
        i_ += 2;
        auto h = number();
        if (!h) return error("expected a count after '..'");
        hi = *h;
      }
      if (hi < *lo) return error("the repetition's maximum is below its minimum");
      wrap(*lo, hi);
    }
    return Status();
  }

  std::optional<uint32_t> number() {
    const size_t start = i_;
    uint64_t v = 0;
    while (std::isdigit(uint8_t(peek())) && v <= kMaxRepeatBound)
      v = v * 10 + uint64_t(t_[i_++] - '0');
    if (i_ == start || v > kMaxRepeatBound) return std::nullopt;
    return uint32_t(v);
  }

  Status atom(Node &out) {
    out.where = Pos{t_, i_};
    const char c = peek();
    if (c == '(' || c == '[') {
      ++i_;
      ++depth_;
      Node inner;
      OFFGRAPH_TRY(expansions(inner));
      skip_space();
      const char close = c == '(' ? ')' : ']';
      if (peek() != close) return error(std::string("expected '") + close + "'");
      ++i_;
      --depth_;
      if (c == '(') {
        out = std::move(inner);
      } else {
        out.kind = Node::Kind::kRepeat;
        out.lo = 0;
        out.hi = 1;
        out.kids.push_back(std::move(inner));
      }
      return Status();
    }
    if (c == '"') {
      std::string text;
      OFFGRAPH_TRY(string_literal(text));
      if (peek() == 'i') {
        ++i_;
        out.fold_case = true;
      }
      skip_space();
      if (peek() == '.' && peek(1) == '.') {
        i_ += 2;
        skip_space();
        std::string to;
        OFFGRAPH_TRY(string_literal(to));
        const auto a = decode_one(text), b = decode_one(to);
        if (!a || !b) return error("a range's ends must be one character each");
        if (*b < *a) return error("a range runs backwards");
        out.kind = Node::Kind::kRange;
        out.lo = *a;
        out.hi = *b;
        return Status();
      }
      out.kind = Node::Kind::kLiteral;
      out.text = std::move(text);
      return Status();
    }
    if (c == '/') {
      ++i_;
      std::string pattern;
      while (true) {
        if (i_ >= t_.size() || peek() == '\n')
          return error("a regular expression runs past its line");
        if (peek() == '\\' && peek(1) == '/') {
          pattern += '/';
          i_ += 2;
          continue;
        }
        if (peek() == '\\') {
          if (i_ + 1 >= t_.size() || peek(1) == '\n')
            return error("a regular expression runs past its line");
          pattern += t_[i_++];
        } else if (peek() == '/') {
          break;
        }
        pattern += t_[i_++];
      }
      ++i_;
      if (std::isalpha(uint8_t(peek())))
        return error(std::string("regular expression flag '") + peek() + "' is not supported");
      out.kind = Node::Kind::kRegex;
      out.text = std::move(pattern);
      return Status();
    }
    if (std::isalpha(uint8_t(c)) || c == '_') {
      const std::string n = name();
      if (peek() == '{') return error("templates ('" + n + "{...}') are not supported");
      out.kind = Node::Kind::kName;
      out.text = mapped(n);
      return Status();
    }
    return error(std::string("unexpected '") + c + "'");
  }

  static std::optional<uint32_t> decode_one(const std::string &s) {
    const auto cps = json_schema_detail::decode_utf8(s);
    if (!cps || cps->size() != 1) return std::nullopt;
    return (*cps)[0];
  }

  // A Python string literal's body, as UTF-8.
  Status string_literal(std::string &out) {
    ++i_; // the opening quote
    while (true) {
      if (i_ >= t_.size() || peek() == '\n') return error("a string runs past its line");
      const char c = t_[i_++];
      if (c == '"') return Status();
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= t_.size() || peek() == '\n') return error("a string runs past its line");
      const char e = t_[i_++];
      auto hex = [&](int digits) -> std::optional<uint32_t> {
        uint32_t v = 0;
        for (int k = 0; k < digits; ++k) {
          const char h = peek();
          if (!std::isxdigit(uint8_t(h))) return std::nullopt;
          v = v * 16 + uint32_t(std::isdigit(uint8_t(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
          ++i_;
        }
        return v;
      };
      switch (e) {
      // As Lark's eval_escaping: these escapes; any other backslash stays with its character.
      case 'n':
        out += '\n';
        break;
      case 't':
        out += '\t';
        break;
      case 'r':
        out += '\r';
        break;
      case 'f':
        out += '\f';
        break;
      case '\\':
      case '"':
        out += e;
        break;
      case 'x':
      case 'u':
      case 'U': {
        const auto v = hex(e == 'x' ? 2 : e == 'u' ? 4 : 8);
        if (!v || *v > 0x10FFFF || (*v >= 0xD800 && *v <= 0xDFFF))
          return error(std::string("a bad \\") + e + " escape");
        append_utf8(out, *v);
        break;
      }
      default:
        out += '\\';
        out += e;
      }
    }
  }

  std::string_view t_;
  std::string prefix_;
  size_t i_ = 0;
  int depth_ = 0;       // inside brackets: newlines are spaces
  int depth_guard_ = 0; // nested expansions
};

class Builder {
public:
  explicit Builder(GrammarBuilder &b) : b_(b), regex_(b, none_) {}

  Status add(const Definition &d) {
    const uint32_t id = rule_id(d.name, d.where);
    if (defined_.count(d.name))
      return Status::error("lark " + d.where.str() + ": '" + shown(d.name) + "' is defined twice");
    defined_.insert(d.name);
    terminal_ = is_terminal_name(d.name);
    auto body = build(d.body);
    if (!body) return body.status();
    b_.define(id, {std::move(*body)});
    return Status();
  }

  Status set_ignored(const std::vector<Node> &ignored) {
    if (ignored.empty()) return Status();
    terminal_ = true;
    std::vector<Sequence> alternatives;
    for (const Node &n : ignored) {
      auto s = build(n);
      if (!s) return s.status();
      alternatives.push_back(std::move(*s));
    }
    auto star =
        b_.repeat("ignored", {b_.choice("ignored-text", std::move(alternatives))}, 0, kUnbounded);
    if (!star) return star.status();
    ignore_ = *star;
    return Status();
  }

  Status alias(const std::string &as, const std::string &target) {
    const uint32_t id = rule_id(as, Pos{});
    if (defined_.count(as))
      return Status::error("lark: '" + shown(as) + "' is imported and also defined");
    defined_.insert(as);
    b_.define(id, {{GrammarBuilder::ref(rule_id(target, Pos{}))}});
    return Status();
  }

  Result<uint32_t> root() {
    for (const auto &[n, where] : used_)
      if (!defined_.count(n))
        return Status::error("lark " + where.str() + ": '" + shown(n) +
                             "' is used but never defined");
    auto it = ids_.find("start");
    if (it == ids_.end() || !defined_.count("start"))
      return Status::error("lark: the grammar has no 'start' rule");
    if (!ignore_) return it->second;
    // Ignored text may also end the text.
    return b_.rule("start-ignored", {{GrammarBuilder::ref(it->second), *ignore_}}).value;
  }

private:
  static std::string shown(const std::string &n) {
    return n.starts_with(kCommonPrefix) ? "common." + n.substr(kCommonPrefix.size()) : n;
  }
  uint32_t rule_id(const std::string &n, const Pos &where) {
    auto [it, fresh] = ids_.try_emplace(n, 0);
    if (fresh) it->second = b_.declare(shown(n));
    if (!where.text.empty()) used_.try_emplace(n, where);
    return it->second;
  }
  // Ignored text may stand before every token of a rule (never inside a terminal).
  Sequence token(Sequence s) {
    if (!ignore_ || terminal_) return s;
    s.insert(s.begin(), *ignore_);
    return s;
  }

  Result<Sequence> build(const Node &n) {
    switch (n.kind) {
    case Node::Kind::kSeq: {
      Sequence out;
      for (const Node &k : n.kids) {
        auto s = build(k);
        if (!s) return s;
        out.insert(out.end(), s->begin(), s->end());
      }
      return out;
    }
    case Node::Kind::kAlt: {
      if (n.kids.size() == 1) return build(n.kids[0]);
      std::vector<Sequence> alternatives;
      for (const Node &k : n.kids) {
        auto s = build(k);
        if (!s) return s;
        alternatives.push_back(std::move(*s));
      }
      return Sequence{b_.choice("alt", std::move(alternatives))};
    }
    case Node::Kind::kRepeat: {
      auto item = build(n.kids[0]);
      if (!item) return item;
      if (item->empty()) return Sequence{};
      // What the repetition will hold, counted before it is built: a request's grammar must not
      // allocate past the limits that finish() would refuse it for anyway.
      elements_ += item->size() + 2 + size_t(n.hi == kUnbounded ? n.lo : n.hi) * 2;
      if (elements_ > kMaxGrammarElements || b_.rule_count() > kMaxGrammarRules)
        return Status::error("lark " + n.where.str() + ": the grammar grows past " +
                             std::to_string(kMaxGrammarElements) + " elements or " +
                             std::to_string(kMaxGrammarRules) + " rules");
      auto r = b_.repeat("repeat", std::move(*item), n.lo, n.hi);
      if (!r) return Status::error("lark " + n.where.str() + ": " + r.message());
      return Sequence{*r};
    }
    case Node::Kind::kLiteral: {
      if (!n.fold_case) return token(b_.literal(n.text));
      Sequence s;
      for (char c : n.text) {
        ByteSet set;
        set.set(uint8_t(c));
        if (std::isalpha(uint8_t(c))) {
          set.set(uint8_t(std::tolower(uint8_t(c))));
          set.set(uint8_t(std::toupper(uint8_t(c))));
        }
        s.push_back(b_.bytes(set));
      }
      return token(std::move(s));
    }
    case Node::Kind::kRange: {
      auto e = b_.code_points({{n.lo, n.hi}}, false);
      if (!e) return Status::error("lark " + n.where.str() + ": " + e.message());
      return token({*e});
    }
    case Node::Kind::kRegex: {
      auto e = regex_.raw_pattern(n.text, "lark " + n.where.str() + ": the regular expression");
      if (!e) return e.status();
      return token({*e});
    }
    case Node::Kind::kName: {
      const Element ref = GrammarBuilder::ref(rule_id(n.text, n.where));
      if (is_terminal_name(n.text)) return token({ref});
      return Sequence{ref};
    }
    }
    return Sequence{};
  }

  GrammarBuilder &b_;
  const nlohmann::ordered_json none_ = nlohmann::ordered_json::object();
  JsonSchemaCompiler regex_;
  std::map<std::string, uint32_t> ids_;
  std::map<std::string, Pos> used_; // name -> where first used
  std::set<std::string> defined_;
  std::optional<Element> ignore_;
  bool terminal_ = false; // building a terminal's body
  size_t elements_ = 0;   // repetitions' elements so far (the bulk of a grammar's size)
};

} // namespace

Result<Grammar> parse_lark(std::string_view text) {
  if (text.size() > kMaxLarkBytes)
    return Status::error("lark: the grammar is " + std::to_string(text.size()) +
                         " bytes, past the limit of " + std::to_string(kMaxLarkBytes));
  if (!json_schema_detail::decode_utf8(text))
    return Status::error("lark: the grammar is not valid UTF-8");
  Reader user(text, "");
  OFFGRAPH_TRY(user.read());
  GrammarBuilder b;
  Builder builder(b);
  // %ignore first: rules built after it get its text before their tokens.
  OFFGRAPH_TRY(builder.set_ignored(user.ignored));
  if (!user.imports.empty()) {
    Reader common(kCommon, std::string(kCommonPrefix));
    if (Status s = common.read(); !s.ok()) return Status::error("common terminals: " + s.message());
    for (const Definition &d : common.definitions) OFFGRAPH_TRY(builder.add(d));
    for (const auto &[as, target] : user.imports) OFFGRAPH_TRY(builder.alias(as, target));
  }
  for (const Definition &d : user.definitions) OFFGRAPH_TRY(builder.add(d));
  auto root = builder.root();
  if (!root) return root.status();
  auto g = std::move(b).finish(*root);
  if (!g) return Status::error("lark: " + g.message());
  return g;
}

} // namespace offgraph::sample
