// The answer of one choice, assembled from generated tokens: detokenized (split characters held
// back), cut at stop strings (no byte of one ever shown), and split into reasoning, content and
// tool calls by the ATEM parser for Muse Glimmer templates.
#pragma once

#include "sample/stop.h"
#include "text/atem/atem_parser.h"
#include "text/tokenizer/tokenizer.h"

#include <nlohmann/json.hpp>

#include <optional>
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
  };

  // `stop_strings` were validated by the request parser.
  ChoiceOutput(const text::Tokenizer &tokenizer, bool atem, const json &tools,
               const std::vector<std::string> &stop_strings, std::vector<int32_t> stop_tokens);
  ChoiceOutput(const ChoiceOutput &) = delete; // the matcher points into stops_
  ChoiceOutput &operator=(const ChoiceOutput &) = delete;

  // A generated token. Nothing more is taken once a stop string matched (stopped()).
  Delta feed(int32_t token);
  // The end of generation: what the detokenizer, the stop matcher and the parser held back.
  Delta finish();

  bool stopped() const { return stopped_; }
  int completion_tokens() const { return completion_; }
  // The whole answer, for non-streaming responses (after finish()).
  std::string content() const;
  std::string reasoning() const;
  json tool_calls() const; // without "index"

private:
  Delta absorb(const std::string &text);
  json call(const text::ToolCall &c);

  text::Detokenizer detok_;
  std::optional<sample::StopSet> stops_;
  std::optional<sample::StopMatcher> matcher_;
  text::AtemParser atem_;
  bool use_atem_;
  std::vector<int32_t> stop_tokens_;
  std::string content_, reasoning_; // without ATEM: the text; with it the parser aggregates
  json calls_ = json::array();
  bool stopped_ = false, finished_ = false;
  int completion_ = 0;
};

} // namespace offgraph::server
