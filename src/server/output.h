// The answer of one choice, assembled from generated tokens: detokenized (split characters held
// back), cut at stop strings (no byte of one ever shown), and split into reasoning, content and
// tool calls by the parser of the template's chat format.
#pragma once

#include "sample/logprobs.h"
#include "sample/stop.h"
#include "text/chat/chat_format.h"
#include "text/tokenizer/tokenizer.h"

#include <nlohmann/json.hpp>

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace offgraph::server {

class ChoiceOutput {
public:
  using json = nlohmann::ordered_json;
  // What one token (or the end) adds: pieces to stream.
  struct Delta {
    std::string reasoning, content;
    json tool_calls = json::array(); // with "index", as streamed
    bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
    // `later` after this one: each kind of text concatenated, tool-call deltas in order (a client
    // accumulates each kind on its own, so nothing is lost by reordering between kinds).
    void append(Delta later);
  };

  // `stop_strings` were validated by the request parser.
  // `format`: the chat format whose parser splits the answer (kPlain: all of it is content).
  ChoiceOutput(const text::Tokenizer &tokenizer, text::ChatFormat format, const json &tools,
               const std::vector<std::string> &stop_strings, std::vector<int32_t> stop_tokens);
  ChoiceOutput(const ChoiceOutput &) = delete; // the matcher points into stops_
  ChoiceOutput &operator=(const ChoiceOutput &) = delete;

  // A generated token, with its log-probabilities if the request asked. Nothing more is taken
  // once a stop string matched (stopped()).
  Delta feed(int32_t token, const sample::TokenLogprobs *logprobs = nullptr);
  // The end of generation: what the detokenizer, the stop matcher and the parser held back.
  // `cut`: max_tokens or the context ended it, so a tool call still open is unfinished: it is
  // left out (never reported as a call whose arguments were cut short or guessed at).
  Delta finish(bool cut = false);

  bool stopped() const { return stopped_; }
  // The stop string that ended the answer (stopped()), as the request gave it.
  const std::string &stop_string() const { return stop_string_; }
  int completion_tokens() const { return completion_; }
  // The whole answer, for non-streaming responses (after finish()).
  std::string content() const;
  std::string reasoning() const;
  json tool_calls() const; // without "index"
  // The log-probabilities of the tokens fed (every generated token up to a stop, reasoning and
  // control tokens included: the model's distribution over what it wrote).
  const std::vector<sample::TokenLogprobs> &logprobs() const { return logprobs_; }
  // Those fed since the last call: what a streamed chunk carries (possibly before the text of
  // their tokens, which the detokenizer or a stop string may hold back).
  std::span<const sample::TokenLogprobs> take_logprobs();

private:
  Delta absorb(const std::string &text);
  json call(const text::ToolCall &c);

  text::Detokenizer detok_;
  std::optional<sample::StopSet> stops_;
  std::optional<sample::StopMatcher> matcher_;
  std::unique_ptr<text::ChatOutputParser> parser_; // null: plain text
  std::vector<int32_t> stop_tokens_;
  std::string content_, reasoning_; // without a parser: the text; with one it aggregates
  json calls_ = json::array();
  bool stopped_ = false, finished_ = false;
  std::string stop_string_;
  int completion_ = 0;
  std::vector<sample::TokenLogprobs> logprobs_;
  size_t logprobs_taken_ = 0;
};

// OpenAI's response bodies, as pure functions of what a request produced (the server adds
// nothing to them). `chat` picks chat.completion(.chunk) over text_completion.
struct ResponseHead {
  std::string id; // chatcmpl-N or cmpl-N
  bool chat = true;
  int64_t created = 0; // Unix seconds
  std::string model;
};
// "length" (max_tokens or the context cut it, whatever it holds), "stop" (a stop string, or the
// turn ended), "tool_calls" (the answer holds calls).
std::string finish_reason(const ChoiceOutput &out, bool cut_by_length);
nlohmann::ordered_json usage_shape(size_t prompt_tokens, int completion_tokens, int cached_tokens);
// usage.completion_tokens_details of a request with a prediction (OpenAI's Predicted Outputs):
// drafted tokens kept and rejected. offgraph drafts from the prediction and the context alike, so
// these count every drafted token verified.
nlohmann::ordered_json prediction_details(int accepted, int drafted);
// A finished choice of a non-streaming response: its message (content, reasoning_content when
// any, tool_calls when any) or, for completions, `echo_text` and the answer.
nlohmann::ordered_json whole_choice(bool chat, int32_t index, const ChoiceOutput &out,
                                    const std::string &echo_text, nlohmann::ordered_json logprobs,
                                    const std::string &finish);
nlohmann::ordered_json response_body(const ResponseHead &head, nlohmann::ordered_json choices,
                                     nlohmann::ordered_json usage);
// One streamed chunk for one choice. `delta` is a chat delta; completions carry its content as
// "text". `finish` is null until the choice's last chunk.
nlohmann::ordered_json chunk_body(const ResponseHead &head, int32_t index,
                                  const nlohmann::ordered_json &delta,
                                  nlohmann::ordered_json logprobs, nlohmann::ordered_json finish);
// The chat deltas one Delta is streamed as, in order: reasoning, content, then one per call.
std::vector<nlohmann::ordered_json> delta_parts(const ChoiceOutput::Delta &delta);
// The last chunk when the request asked for stream_options.include_usage: no choices.
nlohmann::ordered_json usage_chunk(const ResponseHead &head, nlohmann::ordered_json usage);

// OpenAI's log-probability shapes. A token's text is its bytes as valid UTF-8 (a character split
// across tokens shows as U+FFFD in each; "bytes" has the raw bytes); control tokens as their text.
// Chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}], "refusal": null}.
nlohmann::ordered_json chat_logprobs(const text::Tokenizer &tokenizer,
                                     std::span<const sample::TokenLogprobs> tokens);
// Completions: {"tokens", "token_logprobs", "top_logprobs", "text_offset"}. `first_token` >= 0
// leads with that token and null log-probabilities (an echoed prompt's first token, which nothing
// predicts). `offset` is the text_offset of the first entry and comes back past the last: code
// points of the returned text, to which control tokens add nothing.
struct CompletionLogprobs {
  const text::Tokenizer &tokenizer;
  size_t offset = 0;
  nlohmann::ordered_json shape(std::span<const sample::TokenLogprobs> tokens,
                               int32_t first_token = -1);
};

} // namespace offgraph::server
