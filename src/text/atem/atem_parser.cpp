#include "text/atem/atem_parser.h"

#include <algorithm>
#include <array>
#include <functional>

namespace offgraph::text {

namespace {

using atem::kEndOfText, atem::kEom, atem::kEot, atem::kMessage, atem::kStart;
// Longer than any "<|start|>assistant to=RECIPIENT" the model could mean.
constexpr size_t kMaxHeader = 256;
constexpr const auto &kMarkers = atem::kChatMarkers;

size_t held_suffix(std::string_view s) { return held_marker_prefix(s, kMarkers); }
std::pair<size_t, std::string_view> first_marker(std::string_view s, size_t from = 0) {
  return find_first_marker(s, kMarkers, from);
}

bool recipient_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.' || c == '-' || c == ':' || c == '*';
}

// Length of a trailing "to=NAME" word (or a beginning of one, "t", "to"), after a space, a newline
// or the start: a sloppy model may open the next message without <|start|>, so it could be a
// header rather than body text. Held back until a <|message|> or another character decides.
size_t trailing_recipient(std::string_view s, bool start_is_boundary) {
  const size_t space = s.find_last_of(" \n");
  if (space == std::string_view::npos && !start_is_boundary) return 0; // glued to earlier text
  const std::string_view word = space == std::string_view::npos ? s : s.substr(space + 1);
  if (word.empty() || word.size() > 128) return 0;
  constexpr std::string_view kTo = "to=";
  if (word.size() < kTo.size()) return kTo.substr(0, word.size()) == word ? word.size() : 0;
  if (word.substr(0, kTo.size()) != kTo) return 0;
  for (char c : word.substr(kTo.size()))
    if (!recipient_char(c)) return 0;
  return word.size();
}

// Whether leftover header text is only a header ("<|start|>assistant to=NAME" in any part), as
// when the stream stops right after the model opened a new message.
bool looks_like_header(std::string_view s) {
  std::string t;
  for (size_t at = 0; at < s.size();) {
    const size_t next = s.find(kStart, at);
    t += s.substr(at, next == std::string_view::npos ? std::string_view::npos : next - at);
    at = next == std::string_view::npos ? s.size() : next + kStart.size();
  }
  std::string_view v = t;
  auto skip_space = [&] {
    while (!v.empty() && (v[0] == ' ' || v[0] == '\n')) v.remove_prefix(1);
  };
  skip_space();
  if (v.substr(0, 9) == "assistant") v.remove_prefix(9);
  skip_space();
  if (v.substr(0, 3) == "to=") {
    v.remove_prefix(3);
    while (!v.empty() && recipient_char(v[0])) v.remove_prefix(1);
  }
  skip_space();
  return v.empty();
}

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && (s[b] == ' ' || s[b] == '\n' || s[b] == '\t' || s[b] == '\r')) ++b;
  while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\n' || s[e - 1] == '\t' || s[e - 1] == '\r'))
    --e;
  return std::string(s.substr(b, e - b));
}

// The recipient named in a header such as "assistant to=weather.get" (empty: none named).
std::string recipient_of(std::string_view header) {
  const size_t to = header.rfind("to=");
  if (to == std::string_view::npos) return "";
  std::string r = trim(header.substr(to + 3));
  const size_t space = r.find_first_of(" \n\t");
  return space == std::string::npos ? r : r.substr(0, space);
}

// The value of attribute `name="..."` inside a tag.
std::optional<std::string> attribute(std::string_view tag, std::string_view name) {
  const std::string key = std::string(name) + "=\"";
  const size_t at = tag.find(key);
  if (at == std::string_view::npos) return std::nullopt;
  const size_t begin = at + key.size(), end = tag.find('"', begin);
  if (end == std::string_view::npos) return std::nullopt;
  return std::string(tag.substr(begin, end - begin));
}

// A parameter value as the template writes it: true/false/null, JSON for lists and objects, raw
// text otherwise. Numbers and other JSON become JSON unless the schema says string.
nlohmann::json parameter_value(const std::string &raw, bool keep_string) {
  if (keep_string) return raw;
  const std::string t = trim(raw);
  if (t.empty()) return raw;
  const char c = t[0];
  if (c == '{' || c == '[' || c == '"' || c == '-' || (c >= '0' && c <= '9') || t == "true" ||
      t == "false" || t == "null") {
    nlohmann::json j = nlohmann::json::parse(t, nullptr, false);
    if (!j.is_discarded()) return j;
  }
  return raw;
}

} // namespace

std::vector<ToolCall> parse_function_calls(
    std::string_view body, const std::string &fallback_name,
    const std::function<bool(const std::string &, const std::string &)> &is_string) {
  std::vector<ToolCall> calls;
  constexpr std::string_view kInvoke = "<atem:invoke", kParam = "<atem:parameter",
                             kParamEnd = "</atem:parameter>", kInvokeEnd = "</atem:invoke>";
  size_t at = body.find(kInvoke);
  if (at == std::string_view::npos) {
    // No invoke at all: a call by recipient alone, with no arguments, if anything was said.
    if (!fallback_name.empty() && body.find("<atem:function_calls>") != std::string_view::npos)
      calls.push_back({fallback_name, nlohmann::json::object()});
    return calls;
  }
  while (at != std::string_view::npos) {
    const size_t tag_end = body.find('>', at);
    if (tag_end == std::string_view::npos) break;
    ToolCall call;
    call.name = attribute(body.substr(at, tag_end - at), "name").value_or(fallback_name);
    size_t end = body.find(kInvokeEnd, tag_end);
    const size_t next_invoke = body.find(kInvoke, tag_end);
    if (end == std::string_view::npos || next_invoke < end)
      end = std::min(next_invoke, body.size());
    std::string_view inner = body.substr(tag_end + 1, end - tag_end - 1);
    for (size_t p = inner.find(kParam); p != std::string_view::npos;
         p = inner.find(kParam, p + 1)) {
      const size_t open_end = inner.find('>', p);
      if (open_end == std::string_view::npos) break;
      const auto name = attribute(inner.substr(p, open_end - p), "name");
      size_t close = inner.find(kParamEnd, open_end);
      if (close == std::string_view::npos) close = inner.size(); // lenient: unterminated last value
      if (name) {
        const std::string raw(inner.substr(open_end + 1, close - open_end - 1));
        call.arguments[*name] = parameter_value(raw, is_string(call.name, *name));
      }
      p = close;
      if (p >= inner.size()) break;
    }
    calls.push_back(std::move(call));
    at = body.find(kInvoke, end);
  }
  return calls;
}

AtemParser::AtemParser(nlohmann::json tools) : tools_(std::move(tools)) {}

bool AtemParser::parameter_is_string(const std::string &tool, const std::string &param) const {
  // The tool list comes from the request: every step checks the type before reading (nlohmann's
  // value() throws on a key of another type).
  if (!tools_.is_array()) return false;
  for (const auto &t : tools_) {
    if (!t.is_object()) continue;
    const auto &fn = t.contains("function") ? t["function"] : t;
    if (!fn.is_object() || !fn.contains("name") || fn["name"] != tool) continue;
    if (!fn.contains("parameters") || !fn["parameters"].is_object()) return false;
    const auto &params = fn["parameters"];
    if (!params.contains("properties") || !params["properties"].is_object()) return false;
    const auto &props = params["properties"];
    if (!props.contains(param) || !props[param].is_object() || !props[param].contains("type"))
      return false;
    // JSON Schema allows a list of types: ["string", "null"] keeps a string a string.
    const auto &type = props[param]["type"];
    if (type.is_array())
      return std::any_of(type.begin(), type.end(), [](const auto &x) { return x == "string"; });
    return type == "string";
  }
  return false;
}

void AtemParser::emit_body_text(std::vector<ChatEvent> &out, std::string_view text) {
  if (text.empty()) return;
  body_at_boundary_ = text.back() == ' ' || text.back() == '\n';
  // Deltas of one message within one feed() are joined; those of two messages are not, so that
  // text either side of a marker never reads as that marker in one delta.
  const bool join = !new_message_;
  new_message_ = false;
  if (recipient_ == "self") {
    message_.reasoning_content += text;
    if (join && !out.empty() && out.back().kind == ChatEvent::Kind::Reasoning)
      out.back().text += text;
    else
      out.push_back({ChatEvent::Kind::Reasoning, std::string(text), {}});
  } else if (recipient_ == "user" || recipient_.empty()) {
    message_.content += text;
    if (join && !out.empty() && out.back().kind == ChatEvent::Kind::Content)
      out.back().text += text;
    else
      out.push_back({ChatEvent::Kind::Content, std::string(text), {}});
  } else {
    tool_body_ += text;
  }
}

void AtemParser::end_body(std::vector<ChatEvent> &out) {
  const bool tool = !(recipient_ == "self" || recipient_ == "user" || recipient_.empty());
  if (tool) {
    auto is_string = [this](const std::string &t, const std::string &p) {
      return parameter_is_string(t, p);
    };
    for (ToolCall &c : parse_function_calls(tool_body_, recipient_, is_string)) {
      message_.tool_calls.push_back(c);
      out.push_back({ChatEvent::Kind::ToolCall, "", std::move(c)});
    }
  }
  tool_body_.clear();
  recipient_.clear();
  body_at_boundary_ = true;
  new_message_ = true;
}

void AtemParser::run(std::vector<ChatEvent> &out, bool final) {
  for (;;) {
    if (state_ == State::Done) {
      pending_.clear();
      return;
    }
    if (state_ == State::Header) {
      // A header runs up to <|message|>; an end marker here ends the turn.
      auto [at, m] = first_marker(pending_);
      while (at != std::string::npos && m == kStart)
        std::tie(at, m) = first_marker(pending_, at + kStart.size());
      // A model that ignores the protocol still has its text shown: a "header" far longer than
      // any recipient is an answer to the user, and so is a non-header left when the stream ends.
      // Measured without a marker's held-back beginning, so that where the stream was cut does not
      // decide (a header cut inside its closing marker is as long as the same header whole).
      const size_t header_len =
          at != std::string::npos ? at : pending_.size() - (final ? 0 : held_suffix(pending_));
      const bool too_long = header_len > kMaxHeader;
      if (at == std::string::npos && !too_long) {
        if (final && !looks_like_header(pending_)) {
          recipient_ = "user";
          state_ = State::Body;
          continue;
        }
        if (final) pending_.clear();
        return;
      }
      if (too_long) {
        recipient_ = "user";
        state_ = State::Body;
        continue;
      }
      if (m == kMessage) {
        recipient_ = recipient_of(pending_.substr(0, at));
        if (recipient_.empty()) recipient_ = "user";
        pending_.erase(0, at + m.size());
        state_ = State::Body;
        continue;
      }
      pending_.erase(0, at + m.size()); // <|eom|>, <|eot|> or end of text without a body
      if (m != kEom) {
        state_ = State::Done;
        message_.ended = true;
        out.push_back({ChatEvent::Kind::EndOfTurn, "", {}});
      }
      continue;
    }
    // Body: text up to the next marker is the message's.
    auto [at, m] = first_marker(pending_);
    if (at == std::string::npos) {
      // Hold back what may become a marker, and a "to=NAME" just before it.
      const size_t marker = final ? 0 : held_suffix(pending_);
      const size_t keep = final ? 0
                                : marker + trailing_recipient(std::string_view(pending_).substr(
                                                                  0, pending_.size() - marker),
                                                              body_at_boundary_);
      emit_body_text(out, std::string_view(pending_).substr(0, pending_.size() - keep));
      pending_.erase(0, pending_.size() - keep);
      if (final) end_body(out);
      return;
    }
    // Lenient: a stray <|message|> inside a body opens a new message; its header is a trailing
    // " to=NAME" if there is one, else the user.
    size_t body_end = at;
    std::string header;
    if (m == kMessage) {
      const size_t r =
          trailing_recipient(std::string_view(pending_).substr(0, at), body_at_boundary_);
      body_end = at - r;
      header = r ? pending_.substr(body_end, r) : " to=user";
    }
    emit_body_text(out, std::string_view(pending_).substr(0, body_end));
    end_body(out);
    if (m == kStart || m == kMessage) {
      pending_.erase(0, m == kStart ? at + kStart.size() : at); // the header follows <|start|>
      if (m == kMessage) pending_.insert(0, header);
      state_ = State::Header;
      continue;
    }
    pending_.erase(0, at + m.size());
    state_ = State::Header;
    if (m != kEom) {
      state_ = State::Done;
      message_.ended = true;
      out.push_back({ChatEvent::Kind::EndOfTurn, "", {}});
    }
  }
}

std::vector<ChatEvent> AtemParser::feed(std::string_view text) {
  std::vector<ChatEvent> out;
  pending_ += text;
  run(out, false);
  return out;
}

std::vector<ChatEvent> AtemParser::finish() {
  std::vector<ChatEvent> out;
  run(out, true);
  return out;
}

ChatMessage parse_atem(std::string_view text, const nlohmann::json &tools) {
  AtemParser p(tools);
  p.feed(text);
  p.finish();
  return p.message();
}

} // namespace offgraph::text
