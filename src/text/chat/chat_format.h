// The chat formats offgraph reads and writes beyond plain text, told apart by the chat template
// that writes them: which parser splits the model's output into reasoning, content and tool
// calls, which grammar constrains a turn, and which template variables set reasoning.
#pragma once

#include "base/status.h"
#include "sample/grammar.h"
#include "text/chat/chat_output.h"
#include "text/chat/turn_grammar.h"
#include "text/tokenizer/tokenizer.h"

#include <nlohmann/json.hpp>

#include <memory>
#include <string_view>

namespace offgraph::text {

enum class ChatFormat {
  kPlain,  // unknown: the output is the answer's content
  kAtem,   // Muse Glimmer (text/atem)
  kGemma4, // Gemma 4 (text/gemma4)
};

// As llama.cpp decides: ATEM templates write its tool-call block and its end-of-message marker;
// Gemma 4 templates write "<|tool_call>call:".
ChatFormat detect_chat_format(std::string_view chat_template);
std::string_view chat_format_name(ChatFormat format);

// Null for kPlain. `tools`: the request's OpenAI tool list (ATEM keeps a string parameter a
// string even when it looks like JSON).
std::unique_ptr<ChatOutputParser> make_output_parser(ChatFormat format,
                                                     const nlohmann::json &tools);

// The grammar of a constrained turn in `format` (plain: the answer alone, no tools).
Result<sample::Grammar> turn_grammar(ChatFormat format, const Tokenizer &tokenizer,
                                     const TurnSpec &spec);

// Sets the template variables that carry a reasoning effort (none, minimal, low, medium, high,
// xhigh): ATEM's reasoning_strength (low to xhigh; it has no "off"), and enable_thinking, off for
// none and minimal. Gemma 4 always gets enable_thinking; other templates only its false (many
// read an undefined enable_thinking as off, and would start thinking into the answer's content,
// which no parser of theirs reads, if it were set true).
void set_reasoning(ChatFormat format, std::string_view effort, nlohmann::ordered_json &context);

// What the format adds after a rendered prompt so that the model's turn is open: Gemma 4's
// template writes no generation prompt after tool results when the calls' message had text of its
// own (it ends in "<turn|>\n"), so "<|turn>model\n" (and the closed thought channel when thinking
// is off) follows, as llama.cpp does. "" otherwise.
std::string missing_generation_prompt(ChatFormat format, std::string_view rendered,
                                      const nlohmann::ordered_json &context);

// Gemma 4 templates older than the pinned one read tool results only from an assistant
// message's `tool_responses`, not from role:tool messages. For those, each assistant message with
// calls takes the tool messages after it (and a final answer right after them) as
// llama.cpp's workaround does: a result that is JSON is passed as its value.
bool reads_tool_messages(std::string_view chat_template);
void fold_tool_results(nlohmann::ordered_json &messages);

} // namespace offgraph::text
