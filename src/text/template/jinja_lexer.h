// Splits Jinja2 template source into tokens, applying the whitespace rules Hugging Face enables:
// trim_blocks (drop the first newline after a block or comment tag), lstrip_blocks (drop spaces and
// tabs before a block or comment tag at the start of a line), and the -/+ tag modifiers.
#pragma once

#include <string>
#include <vector>

namespace offgraph::text::jinja {

enum class TokenType {
  Text,
  VarBegin,
  VarEnd,
  BlockBegin,
  BlockEnd,
  Name,
  String,
  Int,
  Float,
  Op,
  Eof
};

struct Token {
  TokenType type;
  std::string value; // text, name, decoded string literal, number spelling or operator
  int line;
};

struct LexOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
};

// Throws TemplateError (with the line) on malformed input.
std::vector<Token> tokenize(const std::string &source, const LexOptions &options);

} // namespace offgraph::text::jinja
