#include "text/gemma4/gemma4_parser.h"

#include <algorithm>

namespace offgraph::text {

namespace {

using gemma4::kAwaitResponse, gemma4::kCall, gemma4::kCallEnd, gemma4::kChannel,
    gemma4::kChannelEnd, gemma4::kQuote, gemma4::kTurnEnd;

constexpr std::array<std::string_view, 1> kQuoteMark = {kQuote};
// A channel name longer than this is no name: the model forgot the newline after it.
constexpr size_t kMaxChannelName = 64;
// Nesting of argument values: deeper is refused, never a stack overflow.
constexpr int kMaxDepth = 64;

size_t held_suffix(std::string_view s) { return held_marker_prefix(s, gemma4::kMarkers); }
std::pair<size_t, std::string_view> first_marker(std::string_view s) {
  return find_first_marker(s, gemma4::kMarkers);
}

bool space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

// Gemma's argument notation, read by recursive descent over `s` from `at`.
class ValueReader {
public:
  explicit ValueReader(std::string_view s) : s_(s) {}

  Result<nlohmann::json> value(int depth) {
    skip();
    if (depth > kMaxDepth) return fail("nests deeper than 64 levels");
    if (rest().substr(0, kQuote.size()) == kQuote) return quoted();
    if (at_ < s_.size() && s_[at_] == '{') return mapping(depth);
    if (at_ < s_.size() && s_[at_] == '[') return list(depth);
    return scalar();
  }
  Result<nlohmann::json> mapping(int depth) {
    ++at_; // '{'
    nlohmann::json out = nlohmann::json::object();
    skip();
    if (take('}')) return out;
    for (;;) {
      skip();
      std::string key;
      if (rest().substr(0, kQuote.size()) == kQuote) {
        auto k = quoted();
        if (!k.ok()) return k;
        key = k->get<std::string>();
      } else {
        const size_t colon = s_.find_first_of(":}", at_);
        if (colon == std::string_view::npos || s_[colon] != ':') return fail("a key has no ':'");
        key = std::string(trim(s_.substr(at_, colon - at_)));
        at_ = colon;
      }
      skip();
      if (key.empty()) return fail("a key is empty");
      if (!take(':')) return fail("a key has no ':'");
      auto v = value(depth + 1);
      if (!v.ok()) return v;
      out[key] = std::move(v).value();
      skip();
      if (take('}')) return out;
      if (!take(',')) return fail("a mapping's entries are not separated by ','");
    }
  }
  size_t at() const { return at_; }
  void skip() {
    while (at_ < s_.size() && space(s_[at_])) ++at_;
  }

private:
  std::string_view rest() const { return s_.substr(at_); }
  bool take(char c) {
    if (at_ < s_.size() && s_[at_] == c) return ++at_, true;
    return false;
  }
  Status fail(const std::string &what) const {
    return Status::error("tool call arguments at byte " + std::to_string(at_) + ": " + what);
  }
  Result<nlohmann::json> quoted() {
    at_ += kQuote.size();
    const size_t end = s_.find(kQuote, at_);
    if (end == std::string_view::npos) return fail("a string has no closing <|\"|>");
    std::string out(s_.substr(at_, end - at_));
    at_ = end + kQuote.size();
    return nlohmann::json(std::move(out));
  }
  Result<nlohmann::json> list(int depth) {
    ++at_; // '['
    nlohmann::json out = nlohmann::json::array();
    skip();
    if (take(']')) return out;
    for (;;) {
      auto v = value(depth + 1);
      if (!v.ok()) return v;
      out.push_back(std::move(v).value());
      skip();
      if (take(']')) return out;
      if (!take(',')) return fail("a list's items are not separated by ','");
    }
  }
  // A number, a literal, or (leniently) a bare word up to the next ',', '}' or ']', as a string.
  Result<nlohmann::json> scalar() {
    const size_t end = std::min(s_.find_first_of(",}]", at_), s_.size());
    const std::string_view word = trim(s_.substr(at_, end - at_));
    if (word.empty()) return fail("a value is missing");
    at_ = end;
    if (word == "true" || word == "True") return nlohmann::json(true);
    if (word == "false" || word == "False") return nlohmann::json(false);
    if (word == "null" || word == "None") return nlohmann::json(nullptr);
    const char c = word[0];
    if (c == '-' || (c >= '0' && c <= '9')) {
      nlohmann::json n = nlohmann::json::parse(word, nullptr, false);
      if (!n.is_discarded() && n.is_number()) return n;
    }
    return nlohmann::json(std::string(word));
  }

  std::string_view s_;
  size_t at_ = 0;
};

} // namespace

Result<ToolCall> parse_gemma4_call(std::string_view text) {
  text = trim(text);
  constexpr std::string_view kPrefix = "call:";
  if (text.substr(0, kPrefix.size()) != kPrefix)
    return Status::error("a tool call does not begin with 'call:'");
  text.remove_prefix(kPrefix.size());
  const size_t brace = text.find('{');
  if (brace == std::string_view::npos) return Status::error("a tool call has no arguments '{'");
  ToolCall call;
  call.name = std::string(trim(text.substr(0, brace)));
  if (call.name.empty()) return Status::error("a tool call names no function");
  ValueReader reader(text.substr(brace));
  auto args = reader.mapping(0);
  if (!args.ok()) return args.status();
  reader.skip();
  if (reader.at() != text.size() - brace)
    return Status::error("a tool call has text after its arguments");
  call.arguments = std::move(args).value();
  return call;
}

void Gemma4Parser::emit(std::vector<ChatEvent> &out, ChatEvent::Kind kind, std::string_view text) {
  if (text.empty()) return;
  (kind == ChatEvent::Kind::Reasoning ? message_.reasoning_content : message_.content) += text;
  if (!out.empty() && out.back().kind == kind)
    out.back().text += text;
  else
    out.push_back({kind, std::string(text), {}});
}

void Gemma4Parser::end_call(std::vector<ChatEvent> &out, bool final, bool closed) {
  auto call = parse_gemma4_call(call_);
  if (call.ok()) {
    message_.tool_calls.push_back(*call);
    out.push_back({ChatEvent::Kind::ToolCall, "", std::move(call).value()});
  } else if (!final) {
    // What the model wrote is kept where the client sees it, not dropped. A call the stream cut
    // short is left out (ChoiceOutput: never reported as a call).
    emit(out, ChatEvent::Kind::Content,
         std::string(kCall) + call_ + std::string(closed ? kCallEnd : ""));
  }
  call_.clear();
}

void Gemma4Parser::run(std::vector<ChatEvent> &out, bool final) {
  for (;;) {
    const std::string_view p = pending_;
    switch (state_) {
    case State::Done:
      pending_.clear();
      return;
    case State::Content: {
      const auto [at, marker] = first_marker(p);
      if (at == std::string_view::npos) {
        const size_t safe = p.size() - (final ? 0 : held_suffix(p));
        emit(out, ChatEvent::Kind::Content, p.substr(0, safe));
        pending_.erase(0, safe);
        return;
      }
      emit(out, ChatEvent::Kind::Content, p.substr(0, at));
      if (marker == kChannel) state_ = State::ChannelName;
      if (marker == kCall) state_ = State::Call;
      if (marker == kTurnEnd || marker == kAwaitResponse) {
        state_ = State::Done;
        message_.ended = true;
        out.push_back({ChatEvent::Kind::EndOfTurn, "", {}});
      }
      // kChannelEnd without a channel open, or kCallEnd without a call: dropped.
      pending_.erase(0, at + marker.size());
      break;
    }
    case State::ChannelName: {
      const size_t newline = p.find('\n');
      const auto [at, marker] = first_marker(p);
      if (at < newline) { // "<|channel>thought<channel|>": an empty channel
        pending_.erase(0, at == std::string_view::npos ? p.size() : at);
        state_ = State::Reasoning;
        break;
      }
      if (newline != std::string_view::npos) {
        pending_.erase(0, newline + 1);
        state_ = State::Reasoning;
        break;
      }
      if (!final && p.size() <= kMaxChannelName) return;
      state_ = State::Reasoning; // no name after all
      break;
    }
    case State::Reasoning: {
      const auto [at, marker] = first_marker(p);
      const size_t safe =
          at != std::string_view::npos ? at : p.size() - (final ? 0 : held_suffix(p));
      std::string_view text = p.substr(0, safe);
      // Newlines at the end wait: the last one before <channel|> belongs to the template.
      const size_t body = text.find_last_not_of('\n') + 1; // 0 when all newlines (npos + 1)
      if (body > 0) {
        emit(out, ChatEvent::Kind::Reasoning, held_newlines_);
        emit(out, ChatEvent::Kind::Reasoning, text.substr(0, body));
        held_newlines_.clear();
      }
      held_newlines_ += text.substr(body);
      const bool ends = at != std::string_view::npos || final;
      if (ends && !held_newlines_.empty()) {
        emit(out, ChatEvent::Kind::Reasoning, std::string_view(held_newlines_).substr(1));
        held_newlines_.clear();
      }
      if (at == std::string_view::npos) {
        pending_.erase(0, safe);
        return;
      }
      // <channel|> closes the channel; another marker closes it too and is read as content's.
      pending_.erase(0, marker == kChannelEnd ? at + marker.size() : at);
      state_ = State::Content;
      break;
    }
    case State::Call: {
      const auto [at, marker] = call_marker(p);
      if (at == std::string_view::npos) {
        // Held back: a piece of a marker, or of a string's mark (which decides what follows).
        const size_t safe =
            p.size() - (final ? 0 : std::max(held_suffix(p), held_marker_prefix(p, kQuoteMark)));
        string_open_ = string_open_after(p.substr(0, safe));
        call_ += p.substr(0, safe);
        pending_.erase(0, safe);
        if (!final) return;
        // A string never closed swallowed what follows: if that holds a marker, the model ended
        // the call (or its turn) there after all, so the markers are read as markers.
        if (const auto [swallowed, m] = first_marker(call_); swallowed != std::string::npos) {
          pending_ = call_.substr(swallowed);
          call_.resize(swallowed);
          string_open_ = false;
          state_ = State::Call; // reread: the marker now stands outside any string
          continue;
        }
        end_call(out, true, false);
        return;
      }
      call_ += p.substr(0, at);
      string_open_ = false;
      // A call closed by another marker than its own is read as far as it goes.
      pending_.erase(0, marker == kCallEnd ? at + marker.size() : at);
      end_call(out, false, marker == kCallEnd);
      state_ = State::Content;
      break;
    }
    }
  }
}

bool Gemma4Parser::string_open_after(std::string_view text) const {
  bool open = string_open_;
  for (size_t i = 0; (i = text.find(kQuote, i)) != std::string_view::npos; i += kQuote.size())
    open = !open;
  return open;
}

std::pair<size_t, std::string_view> Gemma4Parser::call_marker(std::string_view p) const {
  // Markers inside a string are its text: only those between strings count.
  bool open = string_open_;
  for (size_t i = 0; i < p.size();) {
    if (p.compare(i, kQuote.size(), kQuote) == 0) {
      open = !open;
      i += kQuote.size();
      continue;
    }
    if (!open)
      for (std::string_view m : gemma4::kMarkers)
        if (p.compare(i, m.size(), m) == 0) return {i, m};
    ++i;
  }
  return {std::string_view::npos, {}};
}

std::vector<ChatEvent> Gemma4Parser::feed(std::string_view text) {
  std::vector<ChatEvent> out;
  pending_ += text;
  run(out, false);
  return out;
}

std::vector<ChatEvent> Gemma4Parser::finish() {
  std::vector<ChatEvent> out;
  run(out, true);
  return out;
}

ChatMessage parse_gemma4(std::string_view text) {
  Gemma4Parser p;
  p.feed(text);
  p.finish();
  return p.message();
}

} // namespace offgraph::text
