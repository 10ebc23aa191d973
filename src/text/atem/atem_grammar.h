// What a constrained ATEM turn may write, as a grammar: the one place that knows how Muse
// Glimmer spells a reasoning message, an answer and a tool call (MUSE_GLIMMER.md section 10)
// for the sampler. The turn starts after the generation prompt's bare "<|start|>assistant".
//
//   turn      ::= reasoning* (answer | calls)
//   reasoning ::= " to=self" <|message|> text <|eom|> <|start|> "assistant"
//   answer    ::= " to=user" <|message|> content <|eot|>
//   calls     ::= call (<|eom|> <|start|> "assistant" call)* <|eot|>
//   call      ::= " to=" name <|message|> body
//
// `content` is free text, or JSON (response_format); a strict tool's `body` is the
// <atem:function_calls> block with one parameter element per property, in schema order, strings
// raw as the template writes them and other values JSON, so that the server's ATEM parser reads
// back exactly the arguments the grammar allowed. A tool that is not strict has the block opened
// for it (<atem:function_calls> and its invoke), then free text. Free text holds no special token
// and never "<|", where the markers begin; the markers are the vocabulary's special tokens when it
// has them (tokenized with specials on), plain text otherwise.
#pragma once

#include "base/status.h"
#include "sample/grammar.h"
#include "sample/token_texts.h"
#include "text/chat/turn_grammar.h"
#include "text/tokenizer/tokenizer.h"

#include <nlohmann/json.hpp>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace offgraph::text {

// Errors name the field: "tools[2].function.parameters: keyword 'oneOf' at ...".
Result<sample::Grammar> atem_turn_grammar(const Tokenizer &tokenizer, const TurnSpec &spec);

// A constrained turn and a sample of it (0-255 a byte, 256 + id a special token), for warming a
// vocabulary's mask tables (sample::warm_up): reasoning, then a JSON object as the answer. The
// free text and the escaped JSON it reaches are the same rules in every constrained turn.
struct AtemWarmUp {
  sample::Grammar grammar;
  std::vector<int32_t> symbols;
};
Result<AtemWarmUp> atem_warm_up_turn(const Tokenizer &tokenizer);

} // namespace offgraph::text
