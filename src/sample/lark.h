// Lark grammars (https://lark-parser.readthedocs.io/en/stable/grammar.html), the syntax of OpenAI's
// custom tools with a grammar format (`{"type": "grammar", "syntax": "lark", "definition": ...}`),
// such as Codex's apply_patch, read as a context-free grammar over text:
//
//   rule: items | items -> alias     rules (lowercase, may begin with ? or !) and terminals
//   TERMINAL: items                  (uppercase) alike; the start rule is `start`
//   "text" "text"i "a".."z"          literals (Python escapes), case-folded (ASCII), a range
//   /regex/                          a whole match of the ECMA-262 subset JSON Schema patterns use
//   ( ... ) [ ... ] x? x* x+          groups, optional, repetition
//   x ~ 3   x ~ 2..5                 counted repetition
//   %import common.NAME (-> ALIAS)   Lark's common terminals; also `%import common (A, B)`
//   %ignore NAME | "text" | /re/     text that may stand before every token of a rule and at the
//   end
//   // comment
//
// A definition runs to the end of its line, on to lines that begin with `|`, and across lines
// inside brackets. `-> alias` and the `?`/`!` prefixes name tree nodes: they do not change the
// language. The grammar is read as the language it describes, not through Lark's lexer: where
// greedy tokenizing would reject a sentence that the rules derive, this accepts it. Refused by
// name: regex flags, priorities (`.N`, they steer the lexer), templates, `%declare`, `%override`,
// `%extend`, imports from other than `common`, left recursion (the matcher's stacks need it
// gone; `validate_grammar` names the rule).
#pragma once

#include "base/status.h"
#include "sample/grammar.h"

#include <string_view>

namespace offgraph::sample {

inline constexpr size_t kMaxLarkBytes = size_t(1) << 20;

// Errors say line:column and what is wrong.
Result<Grammar> parse_lark(std::string_view text);

} // namespace offgraph::sample
