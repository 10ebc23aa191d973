// GBNF, llama.cpp's grammar text (the `grammar` field of llama-server requests), parsed into a
// Grammar. The syntax is that of the pinned llama.cpp (grammars/README.md, src/llama-grammar.cpp):
//
//   name ::= alternatives       names are [a-zA-Z0-9-]+ (no '_'); the start rule is `root`
//   a b | c                     sequences and alternatives; `""` or nothing is the empty string
//   "text"                      UTF-8; escapes \n \r \t \\ \" \[ \] \- \xHH \uHHHH \UHHHHHHHH
//   [a-z\u00e0] [^\n]           one code point in / not in the set (same escapes, `-` for ranges)
//   .                           any code point
//   ( ... )                     a group
//   x* x+ x? x{m} x{m,} x{m,n}  repetition; postfixes stack: x{2}? is (x x)?
//   <[123]> <|eot_id|> <think>  one token, resolved by GbnfOptions::special_token
//   # comment                   to the end of the line
//
// A newline ends a rule, except right after `::=` or `|`, and anywhere inside parentheses. A rule
// defined twice takes its last definition, as in llama.cpp. Escapes and raw characters are code
// points: "\xe9" is U+00E9, written as its two UTF-8 bytes.
//
// Where we differ from llama.cpp (each is an error here, with line:column):
//   - `!<token>` (any token but this one): the Grammar has no such element;
//   - `[]` and `[^]`, which llama.cpp reads as the empty string, and reversed ranges such as
//     [z-a], which it reads as matching nothing;
//   - invalid UTF-8, a raw NUL byte, and \U escapes past U+10FFFF.
// Repetition bounds: llama.cpp refuses a minimum past 2000 and reads a maximum past 2000 as
// unbounded; we allow both up to kMaxRepeatBound (exactly), refuse a larger minimum and read a
// larger maximum as unbounded. Nested repetitions are not limited beyond the grammar's size
// (llama.cpp refuses products past 2000), since ours do not multiply out.
#pragma once

#include "base/status.h"
#include "sample/grammar.h"

#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>

namespace offgraph::sample {

// Limits on the text, so that a request cannot make the parser recurse or allocate without bound.
inline constexpr size_t kMaxGbnfBytes = size_t(4) << 20;
// Levels of parentheses. Converted JSON Schemas nest one level per character of a property name
// in their "any other key" rules, so this is well above 64.
inline constexpr int kMaxGbnfNesting = 256;

struct GbnfOptions {
  // Resolves a token reference, passed exactly as written with its angle brackets (`<|eot_id|>`,
  // `<think>`, `<[123]>`: gbnf_token_id reads the last form), to a special token id. An empty
  // function, std::nullopt or a negative id refuses the grammar with an error naming the token.
  std::function<std::optional<int32_t>(std::string_view)> special_token;
};

// Parses `text`; the grammar starts at the rule `root`. Errors say line:column and what is wrong.
Result<Grammar> parse_gbnf(std::string_view text, const GbnfOptions &options = {});

// The id of a `<[123]>` reference, or std::nullopt for any other text (or an id past int32).
std::optional<int32_t> gbnf_token_id(std::string_view reference);

} // namespace offgraph::sample
