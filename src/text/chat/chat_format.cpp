#include "text/chat/chat_format.h"

#include "text/atem/atem_grammar.h"
#include "text/atem/atem_parser.h"
#include "text/gemma4/gemma4_grammar.h"
#include "text/gemma4/gemma4_parser.h"

namespace offgraph::text {

using ojson = nlohmann::ordered_json;

ChatFormat detect_chat_format(std::string_view chat_template) {
  if (chat_template.find("<atem:function_calls>") != std::string_view::npos &&
      chat_template.find("<|eom|>") != std::string_view::npos)
    return ChatFormat::kAtem;
  if (chat_template.find("'<|tool_call>call:'") != std::string_view::npos)
    return ChatFormat::kGemma4;
  return ChatFormat::kPlain;
}

std::string_view chat_format_name(ChatFormat format) {
  switch (format) {
  case ChatFormat::kAtem:
    return "atem";
  case ChatFormat::kGemma4:
    return "gemma4";
  case ChatFormat::kPlain:
    break;
  }
  return "plain";
}

std::unique_ptr<ChatOutputParser> make_output_parser(ChatFormat format,
                                                     const nlohmann::json &tools) {
  switch (format) {
  case ChatFormat::kAtem:
    return std::make_unique<AtemParser>(tools);
  case ChatFormat::kGemma4:
    return std::make_unique<Gemma4Parser>();
  case ChatFormat::kPlain:
    break;
  }
  return nullptr;
}

Result<sample::Grammar> turn_grammar(ChatFormat format, const Tokenizer &tokenizer,
                                     const TurnSpec &spec) {
  switch (format) {
  case ChatFormat::kAtem:
    return atem_turn_grammar(tokenizer, spec);
  case ChatFormat::kGemma4:
    return gemma4_turn_grammar(tokenizer, spec);
  case ChatFormat::kPlain:
    break;
  }
  return plain_answer_grammar(spec);
}

void set_reasoning(ChatFormat format, std::string_view effort, ojson &context) {
  const bool off = effort == "none" || effort == "minimal";
  context["reasoning_strength"] = off ? "low" : std::string(effort); // ATEM has no "off"
  if (format == ChatFormat::kGemma4 || off) context["enable_thinking"] = !off;
}

std::string missing_generation_prompt(ChatFormat format, std::string_view rendered,
                                      const ojson &context) {
  constexpr std::string_view kTurnEnded = "<turn|>\n";
  if (format != ChatFormat::kGemma4 || !context.value("add_generation_prompt", false) ||
      rendered.size() < kTurnEnded.size() ||
      rendered.substr(rendered.size() - kTurnEnded.size()) != kTurnEnded)
    return "";
  const bool thinking = context.value("enable_thinking", false);
  return thinking ? "<|turn>model\n" : "<|turn>model\n<|channel>thought\n<channel|>";
}

bool reads_tool_messages(std::string_view chat_template) {
  return chat_template.find("tool_call_id") != std::string_view::npos;
}

namespace {

bool has_calls(const ojson &m) {
  return m.is_object() && m.contains("tool_calls") && m["tool_calls"].is_array() &&
         !m["tool_calls"].empty();
}
bool role_is(const ojson &m, std::string_view role) {
  return m.is_object() && m.contains("role") && m["role"] == role;
}
bool has_text(const ojson &m) {
  if (!m.contains("content")) return false;
  const ojson &c = m["content"];
  return (c.is_string() && !c.get<std::string>().empty()) || (c.is_array() && !c.empty());
}

} // namespace

void fold_tool_results(ojson &messages) {
  ojson out = ojson::array();
  for (size_t i = 0; i < messages.size();) {
    ojson m = messages[i++];
    if (!role_is(m, "assistant") || !has_calls(m)) {
      out.push_back(std::move(m));
      continue;
    }
    ojson responses = ojson::array();
    while (i < messages.size() && role_is(messages[i], "tool")) {
      const ojson &result = messages[i++];
      ojson response = result.value("content", ojson());
      if (response.is_string()) {
        ojson parsed = ojson::parse(response.get<std::string>(), nullptr, false);
        if (!parsed.is_discarded()) response = std::move(parsed);
      }
      // The call it answers, by position as llama.cpp pairs them; its id when there is none.
      const size_t k = responses.size();
      std::string name;
      if (k < m["tool_calls"].size() && m["tool_calls"][k].contains("function"))
        name = m["tool_calls"][k]["function"].value("name", "");
      if (name.empty() && result.contains("tool_call_id") && result["tool_call_id"].is_string())
        name = result["tool_call_id"].get<std::string>();
      responses.push_back({{"name", name}, {"response", std::move(response)}});
    }
    const bool answered = !responses.empty();
    if (answered) m["tool_responses"] = std::move(responses);
    // The answer after the results joins them, unless the calls' message has text of its own.
    if (answered && !has_text(m) && i < messages.size() && role_is(messages[i], "assistant") &&
        !has_calls(messages[i]) && has_text(messages[i]))
      m["content"] = messages[i++]["content"];
    out.push_back(std::move(m));
  }
  messages = std::move(out);
}

} // namespace offgraph::text
