#include "text/template/jinja_lexer.h"
#include "base/utf8.h"

#include <cctype>
#include <cstring>

#include "text/template/jinja_value.h"

namespace offgraph::text::jinja {
namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

class Lexer {
public:
  Lexer(std::string src, const LexOptions &opt) : src_(std::move(src)), opt_(opt) {}

  std::vector<Token> run() {
    while (pos_ < src_.size()) {
      size_t idx = find_tag(pos_);
      if (idx == std::string::npos) {
        emit_text(src_.substr(pos_), line_);
        advance_to(src_.size());
        break;
      }
      char kind = src_[idx + 1];
      char mod = idx + 2 < src_.size() ? src_[idx + 2] : '\0';
      std::string text = src_.substr(pos_, idx - pos_);
      int text_line = line_;
      if (mod == '-') {
        size_t end = text.size();
        while (end > 0 && is_space(text[end - 1])) --end;
        text.resize(end);
      } else if (mod != '+' && opt_.lstrip_blocks && kind != '{') {
        // Only spaces and tabs between the line start and the tag: drop them.
        size_t l_pos = text.rfind('\n');
        l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
        if (l_pos > 0 || line_starting_) {
          if (text.find_first_not_of(" \t", l_pos) == std::string::npos) text.resize(l_pos);
        }
      }
      emit_text(text, text_line);
      advance_to(idx + 2 + ((mod == '-' || mod == '+') ? 1 : 0));
      if (kind == '#') {
        lex_comment();
      } else if (kind == '%' && try_raw()) {
        // handled
      } else {
        lex_tag(kind == '%');
      }
    }
    tokens_.push_back({TokenType::Eof, "", line_});
    return std::move(tokens_);
  }

private:
  size_t find_tag(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#'))
        return i;
    }
    return std::string::npos;
  }

  void advance_to(size_t p) {
    for (size_t i = pos_; i < p && i < src_.size(); ++i)
      if (src_[i] == '\n') ++line_;
    pos_ = p;
  }

  void emit_text(const std::string &text, int line) {
    if (!text.empty()) tokens_.push_back({TokenType::Text, text, line});
  }

  [[noreturn]] void fail(const std::string &msg) const { throw TemplateError(msg, line_); }

  // The end of a block tag: "-%}" eats all following whitespace, "%}" the first newline.
  void finish_block_end(size_t after_percent_brace, char mod) {
    advance_to(after_percent_brace);
    if (mod == '-') {
      size_t p = pos_;
      while (p < src_.size() && is_space(src_[p])) ++p;
      advance_to(p);
    } else if (mod != '+' && opt_.trim_blocks && pos_ < src_.size() && src_[pos_] == '\n') {
      advance_to(pos_ + 1);
    }
    line_starting_ = pos_ > 0 && src_[pos_ - 1] == '\n';
  }

  void lex_comment() {
    size_t end = src_.find("#}", pos_);
    if (end == std::string::npos) fail("Missing end of comment tag");
    char mod = end > pos_ ? src_[end - 1] : '\0';
    finish_block_end(end + 2, mod);
  }

  bool try_raw() {
    size_t p = pos_;
    while (p < src_.size() && is_space(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < src_.size() && is_space(src_[p])) ++p;
    char mod = '\0';
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) mod = src_[p++];
    if (src_.compare(p, 2, "%}") != 0) return false;
    finish_block_end(p + 2, mod);
    // Find {% endraw %}.
    for (size_t i = src_.find("{%", pos_); i != std::string::npos; i = src_.find("{%", i + 1)) {
      size_t q = i + 2;
      char begin_mod = q < src_.size() ? src_[q] : '\0';
      if (begin_mod == '-' || begin_mod == '+') ++q;
      while (q < src_.size() && is_space(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0) continue;
      q += 6;
      while (q < src_.size() && is_space(src_[q])) ++q;
      char end_mod = '\0';
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) end_mod = src_[q++];
      if (src_.compare(q, 2, "%}") != 0) continue;
      std::string text = src_.substr(pos_, i - pos_);
      if (begin_mod == '-') {
        size_t e = text.size();
        while (e > 0 && is_space(text[e - 1])) --e;
        text.resize(e);
      }
      emit_text(text, line_);
      finish_block_end(q + 2, end_mod);
      return true;
    }
    fail("Missing end of raw directive");
  }

  void lex_tag(bool block) {
    tokens_.push_back({block ? TokenType::BlockBegin : TokenType::VarBegin, "", line_});
    std::vector<char> balance;
    for (;;) {
      size_t p = pos_;
      while (p < src_.size() && is_space(src_[p])) ++p;
      advance_to(p);
      if (pos_ >= src_.size()) fail("unexpected end of template, expected end of tag");
      if (balance.empty()) {
        const char *close = block ? "%}" : "}}";
        char mod = src_[pos_];
        if ((mod == '-' || (block && mod == '+')) && src_.compare(pos_ + 1, 2, close) == 0) {
          tokens_.push_back({block ? TokenType::BlockEnd : TokenType::VarEnd, "", line_});
          finish_block_end(pos_ + 3, mod);
          return;
        }
        if (src_.compare(pos_, 2, close) == 0) {
          tokens_.push_back({block ? TokenType::BlockEnd : TokenType::VarEnd, "", line_});
          if (block) {
            finish_block_end(pos_ + 2, '\0');
          } else {
            advance_to(pos_ + 2);
            line_starting_ = false;
          }
          return;
        }
      }
      char c = src_[pos_];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = pos_;
        while (e < src_.size() &&
               (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_'))
          ++e;
        tokens_.push_back({TokenType::Name, src_.substr(pos_, e - pos_), line_});
        advance_to(e);
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        lex_number();
      } else if (c == '\'' || c == '"') {
        lex_string(c);
      } else {
        lex_operator(balance);
      }
    }
  }

  void lex_number() {
    size_t e = pos_;
    auto digits = [&] {
      while (e < src_.size() &&
             (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_'))
        ++e;
    };
    digits();
    bool is_float = false;
    if (e + 1 < src_.size() && src_[e] == '.' &&
        std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
      is_float = true;
      ++e;
      digits();
    }
    if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t q = e + 1;
      if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
      if (q < src_.size() && std::isdigit(static_cast<unsigned char>(src_[q]))) {
        is_float = true;
        e = q;
        digits();
      }
    }
    std::string spelled;
    for (size_t i = pos_; i < e; ++i)
      if (src_[i] != '_') spelled += src_[i];
    tokens_.push_back({is_float ? TokenType::Float : TokenType::Int, spelled, line_});
    advance_to(e);
  }

  // Python string-literal escapes (Jinja2 decodes literals with "unicode-escape").
  void lex_string(char quote) {
    std::string out;
    size_t p = pos_ + 1;
    int start_line = line_;
    for (;;) {
      if (p >= src_.size()) fail("unexpected end of string");
      char c = src_[p];
      if (c == quote) break;
      if (c != '\\') {
        out += c;
        ++p;
        continue;
      }
      if (p + 1 >= src_.size()) fail("unexpected end of string");
      char n = src_[p + 1];
      p += 2;
      auto hex = [&](int count) {
        if (p + count > src_.size()) fail("truncated \\x/\\u escape");
        uint32_t v = static_cast<uint32_t>(std::stoul(src_.substr(p, count), nullptr, 16));
        p += count;
        return v;
      };
      switch (n) {
      case 'n':
        out += '\n';
        break;
      case 't':
        out += '\t';
        break;
      case 'r':
        out += '\r';
        break;
      case '\\':
        out += '\\';
        break;
      case '\'':
        out += '\'';
        break;
      case '"':
        out += '"';
        break;
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'v':
        out += '\v';
        break;
      case '\n':
        break;
      case 'x':
        append_utf8(out, hex(2));
        break;
      case 'u':
        append_utf8(out, hex(4));
        break;
      case 'U':
        append_utf8(out, hex(8));
        break;
      default:
        if (n >= '0' && n <= '7') {
          uint32_t v = static_cast<uint32_t>(n - '0');
          for (int k = 0; k < 2 && p < src_.size() && src_[p] >= '0' && src_[p] <= '7'; ++k)
            v = v * 8 + static_cast<uint32_t>(src_[p++] - '0');
          append_utf8(out, v);
        } else {
          out += '\\';
          out += n;
        }
      }
    }
    tokens_.push_back({TokenType::String, out, start_line});
    advance_to(p + 1);
  }

  void lex_operator(std::vector<char> &balance) {
    static const char *two[] = {"//", "**", "==", "!=", "<=", ">="};
    for (const char *op : two) {
      if (src_.compare(pos_, 2, op) == 0) {
        tokens_.push_back({TokenType::Op, op, line_});
        advance_to(pos_ + 2);
        return;
      }
    }
    char c = src_[pos_];
    if (!std::strchr("+-*/%~[](){}<>=.:|,;", c)) fail(std::string("unexpected char '") + c + "'");
    if (c == '(' || c == '[' || c == '{') {
      balance.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    } else if (c == ')' || c == ']' || c == '}') {
      if (balance.empty() || balance.back() != c) fail(std::string("unexpected '") + c + "'");
      balance.pop_back();
    }
    tokens_.push_back({TokenType::Op, std::string(1, c), line_});
    advance_to(pos_ + 1);
  }

  std::string src_;
  const LexOptions &opt_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Token> tokens_;
};

} // namespace

std::vector<Token> tokenize(const std::string &source, const LexOptions &options) {
  // Jinja2 normalises newlines and drops one trailing newline (keep_trailing_newline=False).
  std::string src;
  src.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      src += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      src += source[i];
    }
  }
  if (!options.keep_trailing_newline && !src.empty() && src.back() == '\n') src.pop_back();
  return Lexer(std::move(src), options).run();
}

} // namespace offgraph::text::jinja
