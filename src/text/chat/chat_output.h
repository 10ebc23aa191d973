// What a chat format's output parser gives: the model's turn split into reasoning, content and
// tool calls, as deltas while it streams and as one OpenAI-shaped message. Each chat format
// (text/atem, text/gemma4) implements ChatOutputParser; text/chat/chat_format picks one.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <span>
#include <string>
#include <string_view>
#include <utility>
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
  // Every marker the parser reads: an end token whose text is none of them (Gemma's <eos>) is
  // not text of the answer.
  virtual std::span<const std::string_view> markers() const = 0;
};

// For parsers that read markers in streamed text. The length of the longest suffix of `s` that is
// a proper prefix of a marker: text that may still become one and must be held back.
inline size_t held_marker_prefix(std::string_view s, std::span<const std::string_view> markers) {
  size_t best = 0;
  for (std::string_view m : markers)
    for (size_t n = std::min(s.size(), m.size() - 1); n > best; --n)
      if (s.substr(s.size() - n) == m.substr(0, n)) {
        best = n;
        break;
      }
  return best;
}
// The first marker in `s` at or after `from`: (position, marker), or npos.
inline std::pair<size_t, std::string_view>
find_first_marker(std::string_view s, std::span<const std::string_view> markers, size_t from = 0) {
  size_t best = std::string_view::npos;
  std::string_view which;
  for (std::string_view m : markers)
    if (const size_t at = s.find(m, from); at < best) best = at, which = m;
  return {best, which};
}

} // namespace offgraph::text
