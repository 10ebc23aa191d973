// What a chat format's output parser gives: the model's turn split into reasoning, content and
// tool calls, as deltas while it streams and as one OpenAI-shaped message. Each chat format
// (text/atem, text/gemma4) implements ChatOutputParser; text/chat/chat_format picks one.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>
#include <vector>

namespace offgraph::text {

struct ToolCall {
  std::string name;
  nlohmann::json arguments = nlohmann::json::object();
};

struct ChatEvent {
  enum class Kind { Reasoning, Content, ToolCall, EndOfTurn };
  Kind kind;
  std::string text; // Reasoning, Content: the delta
  ToolCall call;    // ToolCall
};

// The whole response, OpenAI-shaped.
struct ChatMessage {
  std::string reasoning_content;
  std::string content;
  std::vector<ToolCall> tool_calls;
  bool ended = false; // the model ended its turn
};

// Works incrementally on detokenized text (control tokens as their text). Text that could still
// turn into a marker is held back, so a partial marker never reaches a client.
class ChatOutputParser {
public:
  virtual ~ChatOutputParser() = default;
  virtual std::vector<ChatEvent> feed(std::string_view text) = 0;
  // End of the stream (end of turn, max tokens or a stop): flushes held text and a pending tool
  // call.
  virtual std::vector<ChatEvent> finish() = 0;
  // Everything so far, aggregated.
  virtual const ChatMessage &message() const = 0;
};

} // namespace offgraph::text
