// A recursive-descent reader of GBNF. Where llama.cpp's parser (src/llama-grammar.cpp in the
// pinned tree) decides what is valid, this follows it: which whitespace each position skips, what
// ends a rule, how postfixes stack. Rules are kept here and handed to GrammarBuilder at the end,
// once unbounded repetitions can be written without left recursion (finish_repetitions).
#include "sample/gbnf.h"

#include "base/utf8.h"

#include <algorithm>
#include <limits>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace offgraph::sample {
namespace {

constexpr size_t kNone = std::numeric_limits<size_t>::max();

bool is_word_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
}
bool is_digit(char c) { return c >= '0' && c <= '9'; }

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// One code point of strict UTF-8 (no overlong forms, surrogates or values past U+10FFFF): its
// length, or 0 when `s` does not start with one.
size_t decode_utf8(std::string_view s, uint32_t &cp) {
  if (s.empty()) return 0;
  const auto b0 = static_cast<uint8_t>(s[0]);
  if (b0 < 0x80) {
    cp = b0;
    return 1;
  }
  size_t len = 0;
  uint32_t min = 0;
  if ((b0 & 0xE0) == 0xC0) {
    len = 2, cp = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3, cp = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4, cp = b0 & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (s.size() < len) return 0;
  for (size_t i = 1; i < len; ++i) {
    const auto b = static_cast<uint8_t>(s[i]);
    if ((b & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

std::string hex_byte(uint8_t b) {
  static constexpr char kDigits[] = "0123456789ABCDEF";
  return {'\\', 'x', kDigits[b >> 4], kDigits[b & 15]};
}

// User text for a message: printable UTF-8 is kept and the rest spelled \xHH, so that a message
// is always valid UTF-8 (the server writes it into JSON, which refuses anything else).
std::string quote(std::string_view s) {
  constexpr size_t kMaxBytes = 48;
  std::string out = "'";
  size_t i = 0;
  while (i < s.size() && i < kMaxBytes) {
    uint32_t cp = 0;
    const size_t len = decode_utf8(s.substr(i), cp);
    if (len == 0 || cp < 0x20 || cp == 0x7F) {
      out += hex_byte(static_cast<uint8_t>(s[i]));
      ++i;
    } else {
      out += s.substr(i, len);
      i += len;
    }
  }
  if (i < s.size()) out += "...";
  return out + "'";
}

std::string code_point_name(uint32_t cp) {
  static constexpr char kDigits[] = "0123456789ABCDEF";
  std::string hex;
  for (uint32_t v = cp; v != 0 || hex.size() < 4; v >>= 4) hex.insert(hex.begin(), kDigits[v & 15]);
  return "U+" + hex;
}

class Parser {
public:
  Parser(std::string_view text, const GbnfOptions &options) : text_(text), options_(options) {}
  Result<Grammar> run();

private:
  // The parser's own copy of the rules it makes, defined in the builder only at the end: an
  // unbounded repetition is settled once every rule is known (finish_repetitions).
  struct RuleInfo {
    bool mine = false;    // else made inside the builder (a code point class): never empty
    bool defined = false; // false for a named rule only used so far
    std::string name;
    std::vector<Sequence> alternatives;
  };
  struct NamedRule {
    uint32_t id = 0;
    size_t first_use = 0; // offset of its first mention, for "undefined rule" messages
  };
  // `star ::= one star | ""`, written by finish_repetitions.
  struct Star {
    uint32_t rule = 0;
    Element one;
  };

  char peek(size_t ahead = 0) const {
    return pos_ + ahead < text_.size() ? text_[pos_ + ahead] : '\0';
  }
  bool at_end() const { return pos_ >= text_.size(); }
  void skip_space(bool newline_ok);

  Status rule();
  Result<std::vector<Sequence>> alternatives(bool nested, const std::string &rule_name);
  Result<Sequence> sequence(bool nested, const std::string &rule_name);
  Status literal(Sequence &seq);
  Result<Element> char_class();
  Result<Element> token();
  Result<uint32_t> character();
  Result<uint32_t> hex_escape(int digits);
  Status postfix(Sequence &seq, size_t item_start, bool nested, const std::string &rule_name);
  Sequence repeated(Sequence item, uint32_t min, uint32_t max, const std::string &rule_name);
  Status finish_repetitions();
  std::vector<bool> nullable_rules() const;

  uint32_t declare(std::string name) {
    const uint32_t id = builder_.declare(name);
    sync_rules();
    info_[id].mine = true;
    info_[id].name = std::move(name);
    return id;
  }
  Element make_rule(std::string name, std::vector<Sequence> alternatives) {
    const uint32_t id = declare(std::move(name));
    info_[id].defined = true;
    info_[id].alternatives = std::move(alternatives);
    return GrammarBuilder::ref(id);
  }
  void sync_rules() { info_.resize(builder_.rule_count()); }
  size_t named(std::string_view name, size_t at);
  std::string anonymous(const std::string &rule_name) {
    return rule_name + "_" + std::to_string(++anonymous_count_);
  }
  Status within_limits(size_t at) const;

  std::pair<size_t, size_t> line_column(size_t offset) const;
  std::string where(size_t offset) const;
  std::string describe(size_t offset) const;
  Status error_at(size_t offset, const std::string &what,
                  StatusCode code = StatusCode::kInvalidArgument) const {
    return Status::error("gbnf:" + where(offset) + ": " + what, code);
  }

  std::string_view text_;
  const GbnfOptions &options_;
  size_t pos_ = 0;
  int depth_ = 0;
  uint32_t anonymous_count_ = 0;
  // Elements made so far, each counted once where it is made (moving a sequence into a rule
  // costs nothing): about what finish() will count, checked as we go so that no input runs far
  // past the limits before it is refused.
  size_t elements_ = 0;
  GrammarBuilder builder_;
  std::vector<RuleInfo> info_; // by rule id
  std::vector<NamedRule> named_;
  std::unordered_map<std::string, size_t> index_; // name -> named_ index
  std::vector<Star> stars_;
};

void Parser::skip_space(bool newline_ok) {
  while (!at_end()) {
    const char c = text_[pos_];
    if (c == ' ' || c == '\t' || (newline_ok && (c == '\r' || c == '\n'))) {
      ++pos_;
    } else if (c == '#') {
      while (!at_end() && text_[pos_] != '\r' && text_[pos_] != '\n') ++pos_;
    } else {
      break;
    }
  }
}

std::pair<size_t, size_t> Parser::line_column(size_t offset) const {
  size_t line = 1, column = 1;
  for (size_t i = 0; i < offset && i < text_.size(); ++i) {
    const char c = text_[i];
    if (c == '\n' || (c == '\r' && (i + 1 >= text_.size() || text_[i + 1] != '\n'))) {
      ++line;
      column = 1;
    } else if (c != '\r' && (static_cast<uint8_t>(c) & 0xC0) != 0x80) {
      ++column; // columns count code points
    }
  }
  return {line, column};
}

std::string Parser::where(size_t offset) const {
  const auto [line, column] = line_column(offset);
  return std::to_string(line) + ":" + std::to_string(column);
}

std::string Parser::describe(size_t offset) const {
  if (offset >= text_.size()) return "the end of the grammar";
  const char c = text_[offset];
  if (c == '\n' || c == '\r') return "the end of the line";
  uint32_t cp = 0;
  const size_t len = decode_utf8(text_.substr(offset), cp);
  if (len == 0) return "byte " + hex_byte(static_cast<uint8_t>(c)) + " (not UTF-8)";
  if (cp < 0x20 || cp == 0x7F) return "control character " + code_point_name(cp);
  return quote(text_.substr(offset, len));
}

Status Parser::within_limits(size_t at) const {
  if (builder_.rule_count() > kMaxGrammarRules) {
    return error_at(at, "the grammar grows past " + std::to_string(kMaxGrammarRules) + " rules");
  }
  if (elements_ > kMaxGrammarElements) {
    return error_at(at,
                    "the grammar grows past " + std::to_string(kMaxGrammarElements) + " elements");
  }
  return ok_status();
}

size_t Parser::named(std::string_view name, size_t at) {
  auto [it, inserted] = index_.try_emplace(std::string(name), named_.size());
  if (inserted) named_.push_back({declare(std::string(name)), at});
  return it->second;
}

Result<Grammar> Parser::run() {
  if (text_.size() > kMaxGbnfBytes) {
    return Status::error("gbnf: the grammar is " + std::to_string(text_.size()) +
                         " bytes; the limit is " + std::to_string(kMaxGbnfBytes));
  }
  skip_space(true);
  while (!at_end()) OFFGRAPH_TRY(rule());

  // The first undefined rule in the text, as a reader would look for it.
  const NamedRule *undefined = nullptr;
  for (const NamedRule &r : named_) {
    if (!info_[r.id].defined && (undefined == nullptr || r.first_use < undefined->first_use)) {
      undefined = &r;
    }
  }
  if (undefined != nullptr) {
    return error_at(undefined->first_use, "undefined rule '" + info_[undefined->id].name + "'");
  }
  const auto root = index_.find("root");
  if (root == index_.end()) {
    return Status::error("gbnf: the grammar has no 'root' rule (where a sentence starts)");
  }
  OFFGRAPH_TRY(finish_repetitions());
  for (uint32_t id = 0; id < info_.size(); ++id) {
    if (info_[id].mine) builder_.define(id, std::move(info_[id].alternatives));
  }
  auto grammar = std::move(builder_).finish(named_[root->second].id);
  if (!grammar.ok()) return Status::error("gbnf: " + grammar.message(), grammar.status().code());
  return grammar;
}

Status Parser::rule() {
  const size_t start = pos_;
  if (!is_word_char(peek())) {
    std::string what = "expected a rule name, found " + describe(pos_);
    if (std::string_view("|\"[(<!.*+?{").find(peek()) != std::string_view::npos) {
      what += " (a rule goes on to the next line only after '::=' or '|', or inside parentheses)";
    }
    return error_at(pos_, what);
  }
  while (is_word_char(peek())) ++pos_;
  const std::string name(text_.substr(start, pos_ - start));
  skip_space(false);
  if (text_.substr(pos_, 3) != "::=") {
    return error_at(pos_,
                    "expected '::=' after the rule name '" + name + "', found " + describe(pos_));
  }
  pos_ += 3;
  skip_space(true);
  const uint32_t id = named_[named(name, start)].id;
  auto alternatives_or = alternatives(false, name);
  if (!alternatives_or.ok()) return alternatives_or.status();
  if (peek() == '\r') {
    pos_ += peek(1) == '\n' ? 2 : 1;
  } else if (peek() == '\n') {
    ++pos_;
  } else if (!at_end()) {
    std::string what = "unexpected " + describe(pos_) + " in rule '" + name + "'";
    if (peek() == ')') what += " (no '(' to close)";
    if (peek() == '_') what += " (rule names are letters, digits and '-')";
    return error_at(pos_, what);
  }
  // A later definition replaces an earlier one, as in llama.cpp.
  info_[id].alternatives = std::move(alternatives_or).value();
  info_[id].defined = true;
  skip_space(true);
  return ok_status();
}

Result<std::vector<Sequence>> Parser::alternatives(bool nested, const std::string &rule_name) {
  std::vector<Sequence> out;
  while (true) {
    auto seq = sequence(nested, rule_name);
    if (!seq.ok()) return seq.status();
    out.push_back(std::move(seq).value());
    if (peek() != '|') return out;
    ++pos_;
    skip_space(true);
  }
}

Result<Sequence> Parser::sequence(bool nested, const std::string &rule_name) {
  Sequence seq;
  size_t item_start = kNone; // where the item a postfix applies to begins
  while (!at_end()) {
    const size_t at = pos_;
    const char c = text_[pos_];
    if (c == '"') {
      item_start = seq.size();
      OFFGRAPH_TRY(literal(seq));
    } else if (c == '[') {
      auto e = char_class();
      if (!e.ok()) return e.status();
      item_start = seq.size();
      seq.push_back(*e);
    } else if (c == '<' || c == '!') {
      auto e = token();
      if (!e.ok()) return e.status();
      item_start = seq.size();
      seq.push_back(*e);
    } else if (is_word_char(c)) {
      while (is_word_char(peek())) ++pos_;
      const uint32_t id = named_[named(text_.substr(at, pos_ - at), at)].id;
      item_start = seq.size();
      seq.push_back(GrammarBuilder::ref(id));
      ++elements_;
    } else if (c == '(') {
      if (depth_ >= kMaxGbnfNesting) {
        return error_at(at, "parentheses nest deeper than " + std::to_string(kMaxGbnfNesting) +
                                " levels");
      }
      ++pos_;
      skip_space(true);
      ++depth_;
      auto group = alternatives(true, rule_name);
      --depth_;
      if (!group.ok()) return group.status();
      if (at_end()) return error_at(at, "this '(' is never closed");
      if (peek() != ')') {
        return error_at(pos_, "expected ')' to close the '(' at " + where(at) + ", found " +
                                  describe(pos_));
      }
      ++pos_;
      item_start = seq.size();
      if (group->size() == 1) {
        seq.insert(seq.end(), (*group)[0].begin(), (*group)[0].end());
      } else {
        seq.push_back(make_rule(anonymous(rule_name), std::move(group).value()));
        ++elements_;
      }
    } else if (c == '.') {
      ++pos_;
      item_start = seq.size();
      seq.push_back(builder_.any_code_point());
      sync_rules();
      ++elements_;
    } else if (c == '*' || c == '+' || c == '?' || c == '{') {
      OFFGRAPH_TRY(postfix(seq, item_start, nested, rule_name));
    } else {
      break;
    }
    OFFGRAPH_TRY(within_limits(at));
    skip_space(nested);
  }
  return seq;
}

Result<uint32_t> Parser::hex_escape(int digits) {
  const size_t at = pos_;
  uint32_t value = 0;
  for (int i = 0; i < digits; ++i) {
    const int d = hex_value(peek(2 + size_t(i)));
    if (d < 0) {
      return error_at(at, "the escape '\\" + std::string(1, peek(1)) + "' needs " +
                              std::to_string(digits) + " hex digits");
    }
    value = (value << 4) | uint32_t(d);
  }
  if (value > 0x10FFFF) {
    return error_at(at, "the escape " + quote(text_.substr(at, 2 + size_t(digits))) +
                            " is past U+10FFFF, the last code point");
  }
  pos_ += 2 + size_t(digits);
  return value;
}

// One character of a literal or class, an escape or a UTF-8 code point.
Result<uint32_t> Parser::character() {
  const size_t at = pos_;
  if (peek() == '\\') {
    const char e = peek(1);
    switch (e) {
    case 'x':
      return hex_escape(2);
    case 'u':
      return hex_escape(4);
    case 'U':
      return hex_escape(8);
    case 'n':
      pos_ += 2;
      return uint32_t('\n');
    case 'r':
      pos_ += 2;
      return uint32_t('\r');
    case 't':
      pos_ += 2;
      return uint32_t('\t');
    case '\\':
    case '"':
    case '[':
    case ']':
    case '-':
      pos_ += 2;
      return uint32_t(e);
    default:
      if (pos_ + 1 >= text_.size()) return error_at(at, "'\\' at the end of the grammar");
      return error_at(at, "unknown escape '\\' followed by " + describe(pos_ + 1) +
                              " (known: \\n \\r \\t \\\\ \\\" \\[ \\] \\- \\x \\u \\U)");
    }
  }
  uint32_t cp = 0;
  const size_t len = decode_utf8(text_.substr(pos_), cp);
  if (len == 0) return error_at(at, "invalid UTF-8 at byte " + hex_byte(uint8_t(peek())));
  if (cp == 0) return error_at(at, "a raw NUL byte (write \\x00)");
  pos_ += len;
  return cp;
}

Status Parser::literal(Sequence &seq) {
  const size_t open = pos_;
  ++pos_;
  std::string bytes;
  while (true) {
    if (at_end()) return error_at(open, "unterminated string literal (no closing '\"')");
    if (peek() == '"') break;
    auto cp = character();
    if (!cp.ok()) return cp.status();
    append_utf8(bytes, *cp);
  }
  ++pos_;
  elements_ += bytes.size();
  const Sequence s = builder_.literal(bytes);
  seq.insert(seq.end(), s.begin(), s.end());
  return ok_status();
}

Result<Element> Parser::char_class() {
  const size_t open = pos_;
  ++pos_;
  const bool negated = peek() == '^';
  if (negated) ++pos_;
  std::vector<std::pair<uint32_t, uint32_t>> ranges;
  while (true) {
    if (at_end()) return error_at(open, "unterminated character class (no closing ']')");
    if (peek() == ']') break;
    const size_t at = pos_;
    auto lo = character();
    if (!lo.ok()) return lo.status();
    uint32_t hi = *lo;
    // As in llama.cpp, a '-' before the closing ']' is itself a member.
    if (peek() == '-' && pos_ + 1 < text_.size() && peek(1) != ']') {
      ++pos_;
      auto h = character();
      if (!h.ok()) return h.status();
      hi = *h;
      if (hi < *lo) {
        return error_at(at, "the range " + quote(text_.substr(at, pos_ - at)) + " is reversed (" +
                                code_point_name(*lo) + " > " + code_point_name(hi) + ")");
      }
    }
    ranges.emplace_back(*lo, hi);
  }
  ++pos_;
  if (ranges.empty()) {
    return error_at(open, negated ? "'[^]' is an empty character class"
                                  : "'[]' is an empty character class");
  }
  auto e = builder_.code_points(std::move(ranges), negated);
  sync_rules();
  if (!e.ok()) return error_at(open, e.message());
  ++elements_;
  return e;
}

Result<Element> Parser::token() {
  const size_t at = pos_;
  const bool negated = peek() == '!';
  if (negated) {
    ++pos_;
    if (peek() != '<') {
      return error_at(pos_, "expected a token such as <[123]> after '!', found " + describe(pos_));
    }
  }
  const size_t open = pos_;
  ++pos_;
  if (peek() == '[') {
    ++pos_;
    if (!is_digit(peek())) {
      return error_at(pos_, "expected a token id after '<[', found " + describe(pos_));
    }
    while (is_digit(peek())) ++pos_;
    if (peek() != ']') return error_at(pos_, "expected ']' after the token id");
    ++pos_;
    if (peek() != '>') return error_at(pos_, "expected '>' after ']' in a token id");
    ++pos_;
    if (!gbnf_token_id(text_.substr(open, pos_ - open))) {
      return error_at(open, "the token id in " + quote(text_.substr(open, pos_ - open)) +
                                " is past the largest id");
    }
  } else {
    const size_t close = text_.find('>', pos_);
    if (close == std::string_view::npos) return error_at(open, "this '<' has no closing '>'");
    pos_ = close + 1;
  }
  const std::string_view reference = text_.substr(open, pos_ - open);
  if (negated) {
    return error_at(at,
                    "'!" + quote(reference).substr(1) +
                        " (any token but this one) is not supported: the grammar can only name "
                        "tokens it allows",
                    StatusCode::kUnimplemented);
  }
  if (!options_.special_token) {
    return error_at(open, "cannot resolve the token " + quote(reference) + ": no vocabulary");
  }
  const std::optional<int32_t> id = options_.special_token(reference);
  if (!id || *id < 0) return error_at(open, "unknown token " + quote(reference));
  ++elements_;
  return GrammarBuilder::special(*id);
}

Status Parser::postfix(Sequence &seq, size_t item_start, bool nested,
                       const std::string &rule_name) {
  const size_t at = pos_;
  const char c = peek();
  if (item_start == kNone || item_start == seq.size()) {
    return error_at(at, "'" + std::string(1, c) + "' has nothing before it to repeat");
  }
  uint32_t min = 0, max = kUnbounded;
  if (c == '*') {
    ++pos_;
  } else if (c == '+') {
    ++pos_, min = 1;
  } else if (c == '?') {
    ++pos_, max = 1;
  } else {
    ++pos_;
    skip_space(nested);
    // Saturating: any count past the limit is treated alike.
    auto number = [&] {
      uint64_t v = 0;
      while (is_digit(peek())) {
        v = std::min<uint64_t>(v * 10 + uint64_t(peek() - '0'), uint64_t(kMaxRepeatBound) + 1);
        ++pos_;
      }
      return v;
    };
    if (!is_digit(peek())) {
      return error_at(pos_, "expected a count after '{', found " + describe(pos_));
    }
    const uint64_t lo = number();
    uint64_t hi = lo;
    skip_space(nested);
    if (peek() == ',') {
      ++pos_;
      skip_space(nested);
      hi = is_digit(peek()) ? number() : uint64_t(kUnbounded);
      skip_space(nested);
    }
    if (peek() != '}') {
      return error_at(pos_, "expected '}' to close the '{' at " + where(at) + ", found " +
                                describe(pos_));
    }
    ++pos_;
    const std::string spelled(text_.substr(at, pos_ - at));
    if (lo > kMaxRepeatBound) {
      return error_at(at, "the repetition " + quote(spelled) + " asks for more than " +
                              std::to_string(kMaxRepeatBound) + " copies");
    }
    // llama.cpp's reading of a maximum past its limit.
    if (hi != kUnbounded && hi > kMaxRepeatBound) hi = kUnbounded;
    if (lo > hi) {
      return error_at(at,
                      "the repetition " + quote(spelled) + " has its minimum above its maximum");
    }
    min = uint32_t(lo), max = uint32_t(hi);
  }
  Sequence item(seq.begin() + std::ptrdiff_t(item_start), seq.end());
  seq.resize(item_start);
  const Sequence result = repeated(std::move(item), min, max, rule_name);
  seq.insert(seq.end(), result.begin(), result.end());
  return ok_status();
}

// Written out as GrammarBuilder::repeat would, except that the unbounded tail is left to
// finish_repetitions.
Sequence Parser::repeated(Sequence item, uint32_t min, uint32_t max, const std::string &rule_name) {
  if (max == 0) return {};
  if (min == 1 && max == 1) return item;
  if (min == 0 && max == 1) {
    ++elements_;
    return {make_rule(anonymous(rule_name), {std::move(item), {}})};
  }
  // One element to copy, so that a repetition costs its count whatever it repeats, and nested
  // repetitions add rather than multiply.
  Element one = item.size() == 1 ? item[0] : make_rule(anonymous(rule_name), {std::move(item)});
  Sequence body(min, one);
  elements_ += min + 1;
  if (max == kUnbounded) {
    const uint32_t star = declare(anonymous(rule_name));
    info_[star].defined = true;
    stars_.push_back({star, one});
    body.push_back(GrammarBuilder::ref(star));
    elements_ += 2;
  } else if (max > min) {
    // tail_k ::= one tail_(k-1) | "": at most k more.
    Element tail = make_rule(anonymous(rule_name), {{one}, {}});
    for (uint32_t k = 1; k < max - min; ++k) {
      tail = make_rule(anonymous(rule_name), {{one, tail}, {}});
    }
    body.push_back(tail);
    elements_ += 2 * size_t(max - min);
  }
  return body;
}

// Which of our rules can match the empty string: each alternative waits for the rules it names
// (a byte, a token or a builder-made rule rules it out), so the work is linear in the grammar.
std::vector<bool> Parser::nullable_rules() const {
  const size_t n = info_.size();
  std::vector<bool> nullable(n, false);
  std::vector<uint32_t> waiting;              // per alternative: elements not yet known to be empty
  std::vector<uint32_t> owner;                // per alternative: its rule
  std::vector<std::vector<uint32_t>> uses(n); // per rule: the alternatives that name it
  std::vector<uint32_t> queue;
  for (uint32_t r = 0; r < n; ++r) {
    if (!info_[r].mine) continue;
    for (const Sequence &alt : info_[r].alternatives) {
      const bool possible = std::all_of(alt.begin(), alt.end(), [&](const Element &e) {
        return e.kind == Element::Kind::kRule && info_[e.value].mine;
      });
      if (!possible) continue;
      if (alt.empty()) {
        if (!nullable[r]) queue.push_back(r);
        nullable[r] = true;
        continue;
      }
      const auto a = uint32_t(waiting.size());
      waiting.push_back(uint32_t(alt.size()));
      owner.push_back(r);
      for (const Element &e : alt) uses[e.value].push_back(a);
    }
  }
  while (!queue.empty()) {
    const uint32_t r = queue.back();
    queue.pop_back();
    for (const uint32_t a : uses[r]) {
      if (--waiting[a] == 0 && !nullable[owner[a]]) {
        nullable[owner[a]] = true;
        queue.push_back(owner[a]);
      }
    }
  }
  return nullable;
}

// `star ::= one star | ""` is left-recursive when `one` can match the empty string (as in
// `([x]*)*`, which llama.cpp accepts), so there `one` becomes a rule for its non-empty sentences:
// the repetition matches the same strings. That rule copies each rule it may start with, minus
// the empty string: an alternative of rules that may all be empty, e1 .. en, becomes the n
// alternatives ei' e(i+1) .. en, where ei' is the non-empty copy of ei.
Status Parser::finish_repetitions() {
  if (stars_.empty()) return ok_status();
  for (const Star &s : stars_) {
    info_[s.rule].alternatives = {{s.one, GrammarBuilder::ref(s.rule)}, {}};
  }
  std::vector<bool> nullable = nullable_rules();
  std::unordered_map<uint32_t, uint32_t> non_empty; // rule -> its copy without ""
  std::vector<uint32_t> work;
  auto strict = [&](Element e) {
    if (e.kind != Element::Kind::kRule || !nullable[e.value]) return e;
    auto [it, inserted] = non_empty.try_emplace(e.value, 0);
    if (inserted) {
      it->second = declare(info_[e.value].name + "-nonempty");
      info_[it->second].defined = true;
      nullable.push_back(false);
      work.push_back(e.value);
    }
    return GrammarBuilder::ref(it->second);
  };
  for (const Star &s : stars_) {
    if (s.one.kind == Element::Kind::kRule && nullable[s.one.value]) {
      info_[s.rule].alternatives[0][0] = strict(s.one);
    }
  }
  while (!work.empty()) {
    const uint32_t r = work.back();
    work.pop_back();
    const std::vector<Sequence> source = info_[r].alternatives; // strict() may grow info_
    std::vector<Sequence> out;
    for (const Sequence &alt : source) {
      const bool may_be_empty = std::all_of(alt.begin(), alt.end(), [&](const Element &e) {
        return e.kind == Element::Kind::kRule && nullable[e.value];
      });
      if (!may_be_empty) {
        out.push_back(alt);
        continue;
      }
      for (size_t i = 0; i < alt.size(); ++i) {
        Sequence s{strict(alt[i])};
        s.insert(s.end(), alt.begin() + std::ptrdiff_t(i) + 1, alt.end());
        elements_ += s.size();
        out.push_back(std::move(s));
      }
      if (elements_ > kMaxGrammarElements || builder_.rule_count() > kMaxGrammarRules) {
        return Status::error("gbnf: the grammar grows past its limits (" +
                             std::to_string(kMaxGrammarRules) + " rules, " +
                             std::to_string(kMaxGrammarElements) +
                             " elements) where repetitions of what may be empty are written out");
      }
    }
    // A rule that matches only the empty string has no non-empty sentences.
    if (out.empty()) out.push_back({builder_.bytes(ByteSet{})});
    info_[non_empty.at(r)].alternatives = std::move(out);
  }
  return ok_status();
}

} // namespace

std::optional<int32_t> gbnf_token_id(std::string_view reference) {
  if (reference.size() < 5 || !reference.starts_with("<[") || !reference.ends_with("]>")) {
    return std::nullopt;
  }
  const std::string_view digits = reference.substr(2, reference.size() - 4);
  int64_t id = 0;
  for (const char c : digits) {
    if (!is_digit(c)) return std::nullopt;
    id = id * 10 + (c - '0');
    if (id > std::numeric_limits<int32_t>::max()) return std::nullopt;
  }
  return int32_t(id);
}

Result<Grammar> parse_gbnf(std::string_view text, const GbnfOptions &options) {
  return Parser(text, options).run();
}

} // namespace offgraph::sample
