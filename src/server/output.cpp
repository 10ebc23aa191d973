#include "server/output.h"

#include <algorithm>
#include <cmath>

namespace offgraph::server {

ChoiceOutput::ChoiceOutput(const text::Tokenizer &tokenizer, text::ChatFormat format,
                           const json &tools, const std::vector<std::string> &stop_strings,
                           std::vector<int32_t> stop_tokens)
    : detok_(tokenizer, format != text::ChatFormat::kPlain),
      parser_(text::make_output_parser(format, nlohmann::json::parse(tools.dump()))),
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

void ChoiceOutput::Delta::append(Delta later) {
  reasoning += later.reasoning;
  content += later.content;
  for (auto &c : later.tool_calls) tool_calls.push_back(std::move(c));
}

ChoiceOutput::Delta ChoiceOutput::absorb(const std::string &piece) {
  Delta d;
  std::string text = piece;
  if (matcher_) {
    auto u = matcher_->push(piece);
    text = u.emit;
    stopped_ = u.stop_string.has_value();
    if (stopped_) stop_string_ = stops_->stop_strings()[*u.stop_string];
  }
  if (!parser_) {
    d.content = text;
    content_ += text;
    return d;
  }
  for (const auto &e : parser_->feed(text)) {
    if (e.kind == text::ChatEvent::Kind::Reasoning) d.reasoning += e.text;
    if (e.kind == text::ChatEvent::Kind::Content) d.content += e.text;
    if (e.kind == text::ChatEvent::Kind::ToolCall) d.tool_calls.push_back(call(e.call));
  }
  return d;
}

ChoiceOutput::Delta ChoiceOutput::feed(int32_t token, const sample::TokenLogprobs *logprobs) {
  if (stopped_ || finished_) return {};
  ++completion_;
  if (logprobs) logprobs_.push_back(*logprobs);
  std::string piece = detok_.feed(token);
  // An end-of-turn token is text only where a chat format's parser reads it as a marker.
  if (std::find(stop_tokens_.begin(), stop_tokens_.end(), token) != stop_tokens_.end()) {
    const auto markers = parser_ ? parser_->markers() : std::span<const std::string_view>();
    if (std::find(markers.begin(), markers.end(), piece) == markers.end()) piece.clear();
  }
  return absorb(piece);
}

ChoiceOutput::Delta ChoiceOutput::finish(bool cut) {
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
  if (parser_) // what the parser held back when the stream ended: every kind, not only content
    for (const auto &e : parser_->finish()) {
      if (e.kind == text::ChatEvent::Kind::Reasoning) d.reasoning += e.text;
      if (e.kind == text::ChatEvent::Kind::Content) d.content += e.text;
      if (e.kind != text::ChatEvent::Kind::ToolCall) continue;
      if (!cut || stopped_) d.tool_calls.push_back(call(e.call)); // cut: a guess, left out
    }
  return d;
}

std::string ChoiceOutput::content() const {
  return parser_ ? parser_->message().content : content_;
}

std::string ChoiceOutput::reasoning() const {
  return parser_ ? parser_->message().reasoning_content : reasoning_;
}

ChoiceOutput::json ChoiceOutput::tool_calls() const {
  json out = json::array();
  for (json c : calls_) {
    c.erase("index"); // a streaming field
    out.push_back(std::move(c));
  }
  return out;
}

std::span<const sample::TokenLogprobs> ChoiceOutput::take_logprobs() {
  std::span<const sample::TokenLogprobs> out(logprobs_.data() + logprobs_taken_,
                                             logprobs_.size() - logprobs_taken_);
  logprobs_taken_ = logprobs_.size();
  return out;
}

namespace {

// A token's text as valid UTF-8: its bytes with every invalid part as U+FFFD.
std::string token_text(const text::Tokenizer &tokenizer, int32_t id) {
  if (tokenizer.is_control(id)) return tokenizer.token_piece(id);
  text::Detokenizer d(tokenizer);
  return d.feed(id) + d.flush();
}

nlohmann::ordered_json byte_list(const std::string &bytes) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (unsigned char c : bytes) out.push_back(int(c));
  return out;
}

// OpenAI's stand-in for a token that cannot be chosen (JSON has no -infinity).
float reported(float logprob) { return std::isfinite(logprob) ? logprob : -9999.0f; }

nlohmann::ordered_json chat_entry(const text::Tokenizer &tokenizer, int32_t id, float logprob) {
  return {{"token", token_text(tokenizer, id)},
          {"logprob", reported(logprob)},
          {"bytes", byte_list(tokenizer.token_piece(id))}};
}

// Code points a token adds to the text a completion returns (control tokens are not rendered).
size_t code_points(const text::Tokenizer &tokenizer, int32_t id) {
  if (tokenizer.is_control(id)) return 0;
  size_t n = 0;
  for (unsigned char c : tokenizer.token_piece(id)) n += (c & 0xC0) != 0x80;
  return n;
}

} // namespace

nlohmann::ordered_json chat_logprobs(const text::Tokenizer &tokenizer,
                                     std::span<const sample::TokenLogprobs> tokens) {
  nlohmann::ordered_json content = nlohmann::ordered_json::array();
  for (const sample::TokenLogprobs &t : tokens) {
    nlohmann::ordered_json entry = chat_entry(tokenizer, t.token, t.logprob);
    nlohmann::ordered_json top = nlohmann::ordered_json::array();
    for (const auto &[id, lp] : t.top) top.push_back(chat_entry(tokenizer, id, lp));
    entry["top_logprobs"] = std::move(top);
    content.push_back(std::move(entry));
  }
  return {{"content", std::move(content)}, {"refusal", nullptr}};
}

nlohmann::ordered_json CompletionLogprobs::shape(std::span<const sample::TokenLogprobs> tokens,
                                                 int32_t first_token) {
  using ojson = nlohmann::ordered_json;
  ojson texts = ojson::array(), logprobs = ojson::array(), tops = ojson::array(),
        offsets = ojson::array();
  auto add = [&](int32_t id, const ojson &logprob, const ojson &top) {
    texts.push_back(token_text(tokenizer, id));
    logprobs.push_back(logprob);
    tops.push_back(top);
    offsets.push_back(offset);
    offset += code_points(tokenizer, id);
  };
  if (first_token >= 0) add(first_token, nullptr, nullptr);
  for (const sample::TokenLogprobs &t : tokens) {
    // Legacy shape: text -> log-probability (tokens of the same text keep the likelier).
    ojson top = ojson::object();
    for (const auto &[id, lp] : t.top) {
      const std::string text = token_text(tokenizer, id);
      if (!top.contains(text)) top[text] = reported(lp);
    }
    add(t.token, reported(t.logprob), top);
  }
  return {{"tokens", std::move(texts)},
          {"token_logprobs", std::move(logprobs)},
          {"top_logprobs", std::move(tops)},
          {"text_offset", std::move(offsets)}};
}

std::string finish_reason(const ChoiceOutput &out, bool cut_by_length) {
  if (out.stopped()) return "stop";
  if (cut_by_length) return "length";
  return out.tool_calls().empty() ? "stop" : "tool_calls";
}

nlohmann::ordered_json usage_shape(size_t prompt_tokens, int completion_tokens, int cached_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + size_t(completion_tokens)},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
}

nlohmann::ordered_json prediction_details(int accepted, int drafted) {
  return {{"accepted_prediction_tokens", accepted},
          {"rejected_prediction_tokens", drafted - accepted}};
}

nlohmann::ordered_json whole_choice(bool chat, int32_t index, const ChoiceOutput &out,
                                    const std::string &echo_text, nlohmann::ordered_json logprobs,
                                    const std::string &finish) {
  nlohmann::ordered_json choice = {{"index", index}};
  if (chat) {
    nlohmann::ordered_json message = {{"role", "assistant"}, {"content", out.content()}};
    if (!out.reasoning().empty()) message["reasoning_content"] = out.reasoning();
    if (!out.tool_calls().empty()) message["tool_calls"] = out.tool_calls();
    choice["message"] = std::move(message);
  } else {
    choice["text"] = echo_text + out.content();
  }
  choice["logprobs"] = std::move(logprobs);
  choice["finish_reason"] = finish;
  return choice;
}

namespace {
nlohmann::ordered_json head_of(const ResponseHead &head, bool chunk) {
  return {{"id", head.id},
          {"object", !head.chat ? "text_completion"
                     : chunk    ? "chat.completion.chunk"
                                : "chat.completion"},
          {"created", head.created},
          {"model", head.model}};
}
} // namespace

nlohmann::ordered_json response_body(const ResponseHead &head, nlohmann::ordered_json choices,
                                     nlohmann::ordered_json usage) {
  nlohmann::ordered_json body = head_of(head, false);
  body["choices"] = std::move(choices);
  body["usage"] = std::move(usage);
  return body;
}

nlohmann::ordered_json chunk_body(const ResponseHead &head, int32_t index,
                                  const nlohmann::ordered_json &delta,
                                  nlohmann::ordered_json logprobs, nlohmann::ordered_json finish) {
  nlohmann::ordered_json choice = {{"index", index}};
  if (head.chat)
    choice["delta"] = delta;
  else
    choice["text"] = delta.value("content", "");
  choice["logprobs"] = std::move(logprobs);
  choice["finish_reason"] = std::move(finish);
  nlohmann::ordered_json body = head_of(head, true);
  body["choices"] = nlohmann::ordered_json::array({std::move(choice)});
  return body;
}

std::vector<nlohmann::ordered_json> delta_parts(const ChoiceOutput::Delta &delta) {
  std::vector<nlohmann::ordered_json> parts;
  if (!delta.reasoning.empty()) parts.push_back({{"reasoning_content", delta.reasoning}});
  if (!delta.content.empty()) parts.push_back({{"content", delta.content}});
  for (const auto &c : delta.tool_calls)
    parts.push_back({{"tool_calls", nlohmann::ordered_json::array({c})}});
  return parts;
}

nlohmann::ordered_json usage_chunk(const ResponseHead &head, nlohmann::ordered_json usage) {
  nlohmann::ordered_json body = head_of(head, true);
  body["choices"] = nlohmann::ordered_json::array();
  body["usage"] = std::move(usage);
  return body;
}

} // namespace offgraph::server
