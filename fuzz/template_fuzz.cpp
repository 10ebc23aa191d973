// Chat template rendering with hostile content. Most inputs become a conversation for the real
// Muse Glimmer template (roles, contents, tool calls, tool schemas, reasoning all taken from the
// input), rendered and turned into tokens the way the server does (tokenize_chat) with a
// vocabulary that has the template's markers as control tokens. One input in four is a template
// source of its own, parsed and rendered against a fixed conversation.
// Properties: no crash or hang (the engine's own limits bound every render); an error always has
// a message; message text never adds control tokens: the prompt has as many control tokens as
// the same conversation with every protected text replaced by "x".
#include "fuzz_util.h"
#include "muse_fixture.h"

#include "text/chat/chat_prompt.h"
#include "text/template/chat_template.h"
#include "text/tokenizer/tokenizer.h"

#include "ggml.h"
#include "gguf.h"

#include <algorithm>
#include <memory>
#include <vector>

using namespace offgraph;
using json = nlohmann::ordered_json;

namespace {

struct Fixture {
  std::unique_ptr<text::Tokenizer> tokenizer;
  std::optional<text::Template> muse;
};

Fixture &fixture() {
  static Fixture f;
  return f;
}

// A JSON value from the input: the text parsed as JSON when it is JSON, else the text itself.
json value_of(const std::string &s) {
  json j = json::parse(s, nullptr, false);
  if (j.is_discarded()) return json(s);
  return j;
}

// Invalid UTF-8 would make nlohmann's dump() throw; the server only ever sees parsed JSON, whose
// strings are valid. Templates still get every other byte sequence.
std::string text_of(fuzz::Input &in) {
  std::string s = in.until(0);
  if (!nlohmann::json::accept("\"" + s + "\"")) {
    std::string out;
    for (char c : s)
      out += (static_cast<unsigned char>(c) < 0x80 && c != '"' && c != '\\') ? c : '?';
    return out;
  }
  return s;
}

json conversation(fuzz::Input &in) {
  static const char *roles[] = {"system", "developer", "user", "assistant", "tool", "user"};
  json ctx = json::object();
  json messages = json::array();
  const int n = 1 + in.byte() % 8;
  for (int i = 0; i < n && !in.empty(); ++i) {
    const uint8_t b = in.byte();
    json m = json::object();
    const uint8_t r = b % 7;
    m["role"] = r < 6 ? json(roles[r]) : json(text_of(in));
    switch ((b >> 3) % 4) {
    case 0:
      m["content"] = text_of(in);
      break;
    case 1:
      m["content"] = nullptr;
      break;
    case 2:
      m["content"] = json::array({{{"type", "text"}, {"text", text_of(in)}},
                                  {{"type", text_of(in)}},
                                  {{"type", "image"}}});
      break;
    default:
      m["content"] = value_of(text_of(in));
    }
    if (b & 0x20) m["reasoning_content"] = text_of(in);
    if (b & 0x40) {
      json call = {{"id", text_of(in)}, {"type", "function"}};
      call["function"] = {{"name", text_of(in)}, {"arguments", value_of(text_of(in))}};
      m["tool_calls"] = json::array({call});
    }
    if (b & 0x80) {
      m["name"] = text_of(in);
      m["tool_call_id"] = text_of(in);
      m["recipient"] = text_of(in);
    }
    messages.push_back(m);
  }
  ctx["messages"] = messages;
  const uint8_t flags = in.byte();
  if (flags & 1) {
    json tools = json::array();
    for (int i = 0; i < 1 + (flags >> 5); ++i)
      tools.push_back({{"type", "function"},
                       {"function",
                        {{"name", text_of(in)},
                         {"description", text_of(in)},
                         {"parameters", value_of(text_of(in))}}}});
    ctx["tools"] = tools;
  }
  ctx["add_generation_prompt"] = bool(flags & 2);
  if (flags & 4) ctx["reasoning_strength"] = text_of(in);
  if (flags & 8) ctx["current_date"] = text_of(in);
  ctx["bos_token"] = "<|begin_of_text|>";
  return ctx;
}

// The conversation with the text tokenize_chat protects (non-assistant string content and text
// parts) replaced by "x".
json neutral(json ctx) {
  for (auto &m : ctx["messages"]) {
    if (m.value("role", json()) == "assistant" || !m.contains("content")) continue;
    auto &c = m["content"];
    if (c.is_string()) c = "x";
    if (c.is_array())
      for (auto &part : c)
        if (part.is_object() && part.contains("text") && part["text"].is_string())
          part["text"] = "x";
  }
  return ctx;
}

size_t control_tokens(const text::Tokenizer &tok, const std::vector<int32_t> &ids) {
  return size_t(
      std::count_if(ids.begin(), ids.end(), [&](int32_t id) { return tok.is_control(id); }));
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
  ggml_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
  Fixture &f = fixture();
  f.tokenizer = fuzz::muse_tokenizer();
  f.muse = fuzz::muse_template();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  Fixture &f = fixture();
  fuzz::Input in(data, size);
  text::ChatTemplateOptions options;
  options.now = std::tm{};
  const uint8_t mode = in.byte();
  if (mode % 4 == 3) {
    // A template of its own.
    const std::string source = in.until(0);
    auto t = text::Template::parse(source);
    if (!t.ok()) {
      FUZZ_CHECK(!t.message().empty(), "a syntax error without a message");
      return 0;
    }
    json ctx = conversation(in);
    auto out = t->render(ctx, options);
    FUZZ_CHECK(out.ok() || !out.message().empty(), "a render error without a message");
    return 0;
  }
  const json ctx = conversation(in);
  auto out = f.muse->render(ctx, options);
  FUZZ_CHECK(out.ok() || !out.message().empty(), "a render error without a message");
  auto hostile = text::tokenize_chat(*f.tokenizer, *f.muse, ctx, options);
  auto plain = text::tokenize_chat(*f.tokenizer, *f.muse, neutral(ctx), options);
  FUZZ_CHECK(hostile.ok() == plain.ok(), "protected text changed whether the prompt renders: %s%s",
             hostile.message().c_str(), plain.message().c_str());
  if (hostile.ok())
    FUZZ_CHECK(control_tokens(*f.tokenizer, hostile->tokens) ==
                   control_tokens(*f.tokenizer, plain->tokens),
               "message text added control tokens (%zu vs %zu)",
               control_tokens(*f.tokenizer, hostile->tokens),
               control_tokens(*f.tokenizer, plain->tokens));
  return 0;
}
