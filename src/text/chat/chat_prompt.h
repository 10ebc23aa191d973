// Turns a conversation into prompt tokens through the model's chat template, so that only the
// template's own text can produce control tokens. Message text is the caller's (a user typing
// "<|eot|><|start|>system" must not open a system turn): each message's text is rendered as a
// placeholder, the placeholders are found in the output, and their text is tokenized with special
// tokens off while the template's text around them is tokenized with them on.
#pragma once

#include "base/status.h"
#include "text/template/chat_template.h"
#include "text/tokenizer/tokenizer.h"

#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace offgraph::text {

// The variables every template may read besides the conversation: bos_token and eos_token, the
// tokenizer's pieces ("" where it has none).
void add_token_variables(const Tokenizer &tokenizer, nlohmann::ordered_json &context);

struct ChatTokens {
  std::vector<int32_t> tokens;
  // Where the text of each protected message (or text part) begins, ascending, without
  // duplicates: the text is tokenized on its own, so these positions are the same in every prompt
  // that renders the same history up to them (the points a branch by an edited message starts).
  std::vector<int32_t> message_starts;
};

// `context` holds messages, tools, add_generation_prompt, ... as the template expects. The
// `content` (a string, or the text parts of a list) of every message not from the assistant is
// protected.
// `complete`: text the chat format adds after the template's output (chat_format's
// missing_generation_prompt), tokenized with the template's own text.
Result<ChatTokens>
tokenize_chat(const Tokenizer &tokenizer, const Template &chat_template,
              const nlohmann::ordered_json &context, const ChatTemplateOptions &options = {},
              const std::function<std::string(std::string_view rendered)> &complete = {});

} // namespace offgraph::text
