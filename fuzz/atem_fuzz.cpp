// The ATEM output parser on arbitrary model output, split into arbitrary chunks.
// Properties: no crash or hang; feeding the text in chunks gives the same message as parsing it
// whole; deltas concatenate to the aggregate (nothing emitted is retracted) and never carry a
// marker; every tool call is reported once, as an event and in the aggregate. Tool lists come
// from the input too, well-formed or not.
#include "fuzz_util.h"

#include "text/atem/atem_parser.h"

#include <vector>

using namespace offgraph;
using nlohmann::json;

namespace {

const json &default_tools() {
  static const json tools = json::parse(R"([
    {"type": "function", "function": {"name": "weather.get", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "calc.add", "parameters": {"type": "object",
      "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}}])");
  return tools;
}

std::string show(const std::string &s) {
  return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void check_same(const text::ChatMessage &a, const text::ChatMessage &b, const char *what) {
  FUZZ_CHECK(a.reasoning_content == b.reasoning_content, "%s: reasoning differs:\n%s\n%s", what,
             show(a.reasoning_content).c_str(), show(b.reasoning_content).c_str());
  FUZZ_CHECK(a.content == b.content, "%s: content differs:\n%s\n%s", what, show(a.content).c_str(),
             show(b.content).c_str());
  FUZZ_CHECK(a.ended == b.ended, "%s: ended differs", what);
  FUZZ_CHECK(a.tool_calls.size() == b.tool_calls.size(), "%s: %zu vs %zu tool calls", what,
             a.tool_calls.size(), b.tool_calls.size());
  for (size_t i = 0; i < a.tool_calls.size(); ++i) {
    FUZZ_CHECK(a.tool_calls[i].name == b.tool_calls[i].name, "%s: tool name differs", what);
    FUZZ_CHECK(a.tool_calls[i].arguments == b.tool_calls[i].arguments, "%s: arguments differ",
               what);
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz::Input in(data, size);
  const uint8_t flags = in.byte();
  json tools = default_tools();
  if (flags & 1) {
    tools = json::parse(in.until(0), nullptr, false);
    if (tools.is_discarded()) tools = json::array();
  }
  const std::string text = in.until(0);
  std::string sizes = in.rest(); // chunk sizes, cycled
  if (sizes.empty()) sizes = "\x01";

  const text::ChatMessage whole = text::parse_atem(text, tools);

  text::AtemParser p(tools);
  std::string reasoning, content;
  size_t calls = 0;
  auto absorb = [&](const std::vector<text::ChatEvent> &events) {
    for (const auto &e : events) {
      for (const char *marker :
           {"<|eot|>", "<|eom|>", "<|start|>", "<|message|>", "<|end_of_text|>"})
        FUZZ_CHECK(e.text.find(marker) == std::string::npos, "a delta carries %s", marker);
      if (e.kind == text::ChatEvent::Kind::Reasoning) reasoning += e.text;
      if (e.kind == text::ChatEvent::Kind::Content) content += e.text;
      if (e.kind == text::ChatEvent::Kind::ToolCall) ++calls;
    }
    FUZZ_CHECK(reasoning == p.message().reasoning_content, "reasoning deltas != aggregate");
    FUZZ_CHECK(content == p.message().content, "content deltas != aggregate");
  };
  size_t k = 0;
  for (size_t at = 0; at < text.size(); ++k) {
    const size_t n = 1 + uint8_t(sizes[k % sizes.size()]) % 64;
    absorb(p.feed(std::string_view(text).substr(at, n)));
    at += n;
  }
  absorb(p.finish());
  FUZZ_CHECK(calls == p.message().tool_calls.size(), "%zu tool call events, %zu in the aggregate",
             calls, p.message().tool_calls.size());
  check_same(p.message(), whole, "chunked vs whole");
  return 0;
}
