#include "server/output.h"

#include <algorithm>

namespace offgraph::server {

ChoiceOutput::ChoiceOutput(const text::Tokenizer &tokenizer, bool atem, const json &tools,
                           const std::vector<std::string> &stop_strings,
                           std::vector<int32_t> stop_tokens)
    : detok_(tokenizer, atem), atem_(nlohmann::json::parse(tools.dump())), use_atem_(atem),
      stop_tokens_(std::move(stop_tokens)) {
  if (!stop_strings.empty())
    if (auto set = sample::StopSet::create({}, stop_strings); set.ok()) {
      stops_ = std::move(set).value();
      matcher_.emplace(*stops_);
    }
}

ChoiceOutput::json ChoiceOutput::call(const text::ToolCall &c) {
  const size_t i = calls_.size();
  json j = {{"index", i},
            {"id", "call_" + std::to_string(i)},
            {"type", "function"},
            {"function", {{"name", c.name}, {"arguments", c.arguments.dump()}}}};
  calls_.push_back(j);
  return j;
}

ChoiceOutput::Delta ChoiceOutput::absorb(const std::string &piece) {
  Delta d;
  std::string text = piece;
  if (matcher_) {
    auto u = matcher_->push(piece);
    text = u.emit;
    stopped_ = u.stop_string.has_value();
  }
  if (!use_atem_) {
    d.content = text;
    content_ += text;
    return d;
  }
  for (const auto &e : atem_.feed(text)) {
    if (e.kind == text::AtemEvent::Kind::Reasoning) d.reasoning += e.text;
    if (e.kind == text::AtemEvent::Kind::Content) d.content += e.text;
    if (e.kind == text::AtemEvent::Kind::ToolCall) d.tool_calls.push_back(call(e.call));
  }
  return d;
}

ChoiceOutput::Delta ChoiceOutput::feed(int32_t token) {
  if (stopped_ || finished_) return {};
  ++completion_;
  std::string piece = detok_.feed(token);
  // An end-of-turn token is text only where the ATEM parser wants to see it.
  if (!use_atem_ &&
      std::find(stop_tokens_.begin(), stop_tokens_.end(), token) != stop_tokens_.end())
    piece.clear();
  return absorb(piece);
}

ChoiceOutput::Delta ChoiceOutput::finish() {
  if (finished_) return {};
  Delta d;
  auto add = [&d](Delta x) {
    d.reasoning += x.reasoning;
    d.content += x.content;
    for (auto &c : x.tool_calls) d.tool_calls.push_back(std::move(c));
  };
  if (!stopped_) {
    add(absorb(detok_.flush()));
    if (matcher_ && !stopped_) add(absorb(matcher_->finish()));
  }
  finished_ = true;
  if (use_atem_) // what the parser held back when the stream ended: every kind, not only content
    for (const auto &e : atem_.finish()) {
      if (e.kind == text::AtemEvent::Kind::Reasoning) d.reasoning += e.text;
      if (e.kind == text::AtemEvent::Kind::Content) d.content += e.text;
      if (e.kind == text::AtemEvent::Kind::ToolCall) d.tool_calls.push_back(call(e.call));
    }
  return d;
}

std::string ChoiceOutput::content() const { return use_atem_ ? atem_.message().content : content_; }

std::string ChoiceOutput::reasoning() const {
  return use_atem_ ? atem_.message().reasoning_content : reasoning_;
}

ChoiceOutput::json ChoiceOutput::tool_calls() const {
  json out = json::array();
  for (json c : calls_) {
    c.erase("index"); // a streaming field
    out.push_back(std::move(c));
  }
  return out;
}

} // namespace offgraph::server
