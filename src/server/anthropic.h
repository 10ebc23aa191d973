// Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens): bodies read into the
// wire-neutral request (request.h, api.h), answers and stream events written from a choice's
// output (output.h). Pure functions, tested and fuzzed without a server.
#pragma once

#include "server/api.h"
#include "server/output.h"

#include <string>
#include <vector>

namespace offgraph::server::anthropic {

using json = nlohmann::ordered_json;

// {"type": "error", "error": {"type", "message"}}: Anthropic's error types by HTTP status
// (invalid_request_error, authentication_error, permission_error, not_found_error,
// request_too_large, rate_limit_error, api_error, overloaded_error).
json error_body(const ApiError &e);
std::string error_type(int status);

// A Messages body into `job` (sampling, limits, stop sequences, the conversation rendered and
// constrained). A prompt over the context is the error Claude Code compacts on: 413
// request_too_large "prompt is too long: N tokens > M maximum"; a prompt and max_tokens over it
// "input length and `max_tokens` exceed context limit: A + B > C".
std::optional<ApiError> parse_messages(const json &body, const ModelFacts &facts, Job &job);
// The context errors in Anthropic's words for a prompt of `prompt` tokens (images included).
ApiError context_error(int64_t prompt, int32_t max_tokens_asked, int32_t context);
// A count_tokens body (no max_tokens, no sampling): the prompt the same messages would have.
std::optional<ApiError> parse_count_tokens(const json &body, const ModelFacts &facts, Job &job);

// How a message ended: "end_turn", "max_tokens", "stop_sequence" or "tool_use".
std::string stop_reason(const ChoiceOutput &out, bool cut_by_length);

// usage: input_tokens are the prompt's tokens computed, cache_read_input_tokens those reused
// (their sum is the prompt), cache_creation_input_tokens 0 (every computed token is kept without
// being asked to).
json usage(size_t prompt_tokens, int cached_tokens, int output_tokens);

// A thinking block's signature: a digest of its text, so that a client echoing it back unchanged
// can be told from one that edited it (both are accepted: the model reads the text).
std::string thinking_signature(const std::string &thinking);

// One server-sent event.
struct Event {
  std::string name;
  json data;
};

// A message's content blocks as the answer grows, and the stream events each addition makes:
// one block open at a time (thinking, text or tool_use), its deltas of the matching type, a
// thinking block's signature_delta before it stops. Streaming and non-streaming answers both come
// from it, so the whole message is the blocks the stream opened, in order.
class MessageBuilder {
public:
  // `tool_id_prefix` makes tool_use ids unique across a conversation (toolu_<request>_<i>).
  // `show_thinking` false: reasoning is left out (Job::show_reasoning).
  MessageBuilder(std::string tool_id_prefix, bool show_thinking)
      : prefix_(std::move(tool_id_prefix)), show_thinking_(show_thinking) {}
  std::vector<Event> add(const ChoiceOutput::Delta &delta);
  // Closes the open block (the stream's last content events).
  std::vector<Event> close();
  const json &content() const { return content_; }

private:
  enum class Open { None, Thinking, Text };
  void open(Open kind, const json &block, std::vector<Event> &out);
  Open open_ = Open::None;
  json content_ = json::array();
  std::string prefix_;
  bool show_thinking_ = true;
  int tools_ = 0;
};

struct MessageHead {
  std::string id; // msg_...
  std::string model;
};
// message_start: the message with no content yet and the usage known before the answer.
Event message_start(const MessageHead &head, const json &usage);
// message_delta (stop_reason, stop_sequence, cumulative usage), then message_stop.
std::vector<Event> message_end(const std::string &stop_reason, const std::string &stop_sequence,
                               const json &usage);
Event ping();
// The non-streaming answer.
json message_body(const MessageHead &head, const json &content, const std::string &stop_reason,
                  const std::string &stop_sequence, const json &usage);
// "event: NAME\ndata: JSON\n\n"
std::string sse(const Event &e);

} // namespace offgraph::server::anthropic
