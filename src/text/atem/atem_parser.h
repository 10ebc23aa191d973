// Parser of Muse Glimmer's output protocol (ATEM, MUSE_GLIMMER.md §10). After the generation
// prompt `<|start|>assistant`, the model writes messages `[<|start|>assistant] to={recipient}
// <|message|>{body}{end}`: to=self is reasoning, to=user the answer, any other recipient a tool
// call whose body is an `<atem:function_calls>` block; `<|eom|>` ends a message within the turn,
// `<|eot|>` (or `<|end_of_text|>`) ends the turn.
//
// The parser works incrementally on detokenized text (special tokens as their text) and emits
// reasoning and content as deltas as soon as they are certain: text that could still turn into a
// marker is held back, so a partial tag never reaches a client. It is lenient where models are
// sloppy: a missing recipient means the user, a `<|start|>` inside a body ends that message, a
// stream that stops mid-message is flushed by finish().
#pragma once

#include "text/chat/chat_output.h"

#include <nlohmann/json.hpp>

#include <array>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace offgraph::text {

// The strings the parsers read: the chat markers AtemParser reads in any text, and what every tag
// of a call block (parse_function_calls: function_calls, invoke, parameter) begins with. Text the
// model writes raw (a custom tool's input) must spell none of them (atem_grammar).
namespace atem {
inline constexpr std::string_view kStart = "<|start|>", kMessage = "<|message|>", kEom = "<|eom|>",
                                  kEot = "<|eot|>", kEndOfText = "<|end_of_text|>";
inline constexpr std::array<std::string_view, 5> kChatMarkers = {kStart, kMessage, kEom, kEot,
                                                                 kEndOfText};
inline constexpr std::array<std::string_view, 2> kCallTagPrefixes = {"<atem:", "</atem:"};
} // namespace atem

class AtemParser : public ChatOutputParser {
public:
  // `tools`: the request's OpenAI tool list, if any. A parameter its schema declares a string
  // stays a string even when it looks like JSON ("42", "true").
  explicit AtemParser(nlohmann::json tools = nlohmann::json::array());

  std::vector<ChatEvent> feed(std::string_view text) override;
  // End of the stream (end of turn, max tokens or a stop): flushes held text and a pending tool
  // call.
  std::vector<ChatEvent> finish() override;

  // Everything so far, aggregated.
  const ChatMessage &message() const override { return message_; }
  std::span<const std::string_view> markers() const override { return atem::kChatMarkers; }

private:
  enum class State { Header, Body, Done };
  void run(std::vector<ChatEvent> &out, bool final);
  void end_body(std::vector<ChatEvent> &out);
  void emit_body_text(std::vector<ChatEvent> &out, std::string_view text);
  bool parameter_is_string(const std::string &tool, const std::string &param) const;

  nlohmann::json tools_;
  State state_ = State::Header;
  std::string pending_;          // text not yet consumed
  std::string recipient_;        // of the current message
  std::string tool_body_;        // the current tool message's body
  bool body_at_boundary_ = true; // the body text emitted so far ends at a word boundary
  bool new_message_ = true;      // no body text emitted since the last message ended
  ChatMessage message_;
};

// Parses a complete response in one go.
ChatMessage parse_atem(std::string_view text,
                       const nlohmann::json &tools = nlohmann::json::array());

// Parses the tool calls of one `<atem:function_calls>` block (several invokes allowed).
std::vector<ToolCall> parse_function_calls(
    std::string_view body, const std::string &fallback_name,
    const std::function<bool(const std::string &, const std::string &)> &is_string);

} // namespace offgraph::text
