// What a constrained Gemma 4 turn may write, as a grammar: the one place that knows how Gemma 4
// spells reasoning, an answer and a call for the sampler (what Gemma4Parser reads back). The turn
// starts after the generation prompt "<|turn>model\n".
//
//   turn    ::= thought? (answer | calls)
//   thought ::= "<|channel>thought\n" text "<channel|>"         (spec.reasoning)
//   answer  ::= content "<turn|>"
//   calls   ::= call+ "<|tool_response>"                         (one call: parallel_calls off)
//   call    ::= "<|tool_call>call:" name "{" arguments "}" "<tool_call|>"
//
// `content` is free text, JSON (response_format) or the request's grammar. A strict tool's
// arguments follow its schema in Gemma's notation, keys sorted as the template writes them
// (dictsort): {key:value,...}, strings between <|"|> marks, numbers, true, false, null (or None,
// as the template prints it), [lists];
// the JSON Schema keywords that notation can enforce are type (and lists), enum, const, anyOf,
// properties (every one required, additionalProperties false: OpenAI's strict mode), items,
// minItems, maxItems, the string keywords of sample/json_schema and the number bounds; others
// are refused by name. A tool that is not strict takes any mapping in the notation; a custom
// tool's one string property is written under its grammar. Free text and strings never spell a
// marker the parser reads (gemma4::kMarkers, and <|"|> inside strings): they hold no "<|", where
// most begin, nor <channel|>, <tool_call|> or <turn|>.
#pragma once

#include "base/status.h"
#include "sample/grammar.h"
#include "text/chat/turn_grammar.h"
#include "text/tokenizer/tokenizer.h"

namespace offgraph::text {

// Errors name the field: "tools[2].function.parameters: keyword 'oneOf' at ...".
Result<sample::Grammar> gemma4_turn_grammar(const Tokenizer &tokenizer, const TurnSpec &spec);

} // namespace offgraph::text
