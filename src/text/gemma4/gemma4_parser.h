// Parser of Gemma 4's output (the pinned tree's models/templates/google-gemma-4-31B-it.jinja and
// common/parsers/gemma4.cpp). After the generation prompt "<|turn>model\n" the model writes
//
//   [<|channel>thought\n{reasoning}<channel|>] {content}
//   (<|tool_call>call:{name}{{args}}<tool_call|>)*
//
// and ends its turn with <turn|>, or with <|tool_response> after calls (it waits for their
// results). Arguments are Gemma's own notation, as the template writes calls in the history:
// {key:value,...} with bare keys, strings between <|"|> marks with nothing escaped, numbers,
// true/false, null (also None, as Python prints it), [lists] and {mappings}.
//
// Incremental like AtemParser: reasoning and content are emitted as soon as they cannot turn into
// a marker; a call is emitted whole when its <tool_call|> arrives. Lenient where models are
// sloppy: a channel other than "thought" is reasoning too, a stray <channel|> is dropped, the
// reasoning's last newline (the template writes one before <channel|>) is not part of it.
#pragma once

#include "base/status.h"
#include "text/chat/chat_output.h"

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace offgraph::text {

namespace gemma4 {
inline constexpr std::string_view kChannel = "<|channel>", kChannelEnd = "<channel|>",
                                  kCall = "<|tool_call>", kCallEnd = "<tool_call|>",
                                  kTurnEnd = "<turn|>", kAwaitResponse = "<|tool_response>",
                                  kQuote = "<|\"|>";
// Every marker the parser reads in text: free text the model writes must spell none of them.
inline constexpr std::array<std::string_view, 6> kMarkers = {kChannel, kChannelEnd, kCall,
                                                             kCallEnd, kTurnEnd,    kAwaitResponse};
} // namespace gemma4

class Gemma4Parser : public ChatOutputParser {
public:
  std::vector<ChatEvent> feed(std::string_view text) override;
  std::vector<ChatEvent> finish() override;
  const ChatMessage &message() const override { return message_; }
  std::span<const std::string_view> markers() const override { return gemma4::kMarkers; }

private:
  enum class State { Content, ChannelName, Reasoning, Call, Done };
  void run(std::vector<ChatEvent> &out, bool final);
  void emit(std::vector<ChatEvent> &out, ChatEvent::Kind kind, std::string_view text);
  // `final`: the stream ended inside the call; `closed`: by its own <tool_call|>.
  void end_call(std::vector<ChatEvent> &out, bool final, bool closed);

  State state_ = State::Content;
  std::string pending_;       // text not yet consumed
  std::string held_newlines_; // reasoning's trailing newlines, emitted once more text follows
  // In the Call state: the first marker outside a string (npos when none), and whether a string
  // is open after `text` (from string_open_).
  std::pair<size_t, std::string_view> call_marker(std::string_view p) const;
  bool string_open_after(std::string_view text) const;

  bool string_open_ = false; // the call's text so far ends inside a <|"|> string
  std::string call_;         // the current call's text after <|tool_call>
  ChatMessage message_;
};

// Parses a complete response in one go.
ChatMessage parse_gemma4(std::string_view text);

// One call's text between <|tool_call> and <tool_call|>: "call:NAME{args}".
Result<ToolCall> parse_gemma4_call(std::string_view text);

} // namespace offgraph::text
