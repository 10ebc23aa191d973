#include "server/anthropic.h"

#include "server/image_parts.h"
#include "text/tokenizer/unicode.h"

#include <cinttypes>
#include <cstdio>
#include <map>
#include <set>

namespace offgraph::server::anthropic {

std::string error_type(int status) {
  switch (status) {
  case 401:
    return "authentication_error";
  case 403:
    return "permission_error";
  case 404:
    return "not_found_error";
  case 413:
    return "request_too_large";
  case 429:
    return "rate_limit_error";
  case 503:
  case 529:
    return "overloaded_error";
  default:
    return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

json error_body(const ApiError &e) {
  std::string message = e.message;
  // Anthropic's messages name the field as "field: message"; ours say it in the text already.
  return {{"type", "error"}, {"error", {{"type", error_type(e.status)}, {"message", message}}}};
}

namespace {

ApiError bad(const std::string &param, const std::string &message,
             const std::string &code = "invalid_value") {
  return ApiError{400, message, param, code};
}

bool given(const json &body, const char *key) { return body.contains(key) && !body[key].is_null(); }

// A string field, or "" when absent or of another type (nlohmann's value() throws on a type it
// did not expect, and bodies are the client's).
std::string str(const json &j, const char *key) {
  return j.is_object() && j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : "";
}

// Top-level fields each route takes; anything else is refused by name (Anthropic refuses unknown
// fields too). metadata and service_tier change nothing an answer holds on one server.
const std::set<std::string> kMessageFields = {
    "model",    "messages",       "system",       "max_tokens",
    "metadata", "stop_sequences", "stream",       "temperature",
    "top_p",    "top_k",          "tools",        "tool_choice",
    "thinking", "output_config",  "service_tier", "context_management"};
const std::set<std::string> kCountFields = {"model",         "messages",          "system",
                                            "tools",         "tool_choice",       "thinking",
                                            "output_config", "context_management"};

std::optional<ApiError> refuse_unknown(const json &body, const std::set<std::string> &known) {
  for (const auto &[key, value] : body.items()) {
    if (known.count(key)) continue;
    if (key == "container" || key == "mcp_servers")
      return bad(key, key + ": not supported: this server runs no server-side tools",
                 "unsupported");
    return bad(key, key + ": Extra inputs are not permitted", "unsupported");
  }
  return std::nullopt;
}

// A text block: {"type": "text", "text", "cache_control"?, "citations"?}.
std::optional<ApiError> read_text_block(const json &block, const std::string &where, json &part) {
  if (!block.contains("text") || !block["text"].is_string())
    return bad(where, where + ".text: Field required (a string)", "invalid_type");
  if (given(block, "citations") && !(block["citations"].is_array() && block["citations"].empty()))
    return bad(where + ".citations", where + ".citations: not supported", "unsupported");
  part = {{"type", "text"}, {"text", block["text"]}};
  return std::nullopt;
}

// An image block: base64 PNG or JPEG, as an image part of the chat-template message (encoded by
// build_chat_job like any other). URL sources are refused: nothing is fetched.
std::optional<ApiError> read_image_block(const json &block, const std::string &where, json &part) {
  if (!given(block, "source") || !block["source"].is_object())
    return bad(where + ".source", where + ".source: Field required", "invalid_type");
  const json &src = block["source"];
  const std::string type = str(src, "type");
  if (type != "base64")
    return bad(where + ".source.type",
               where + ".source.type: '" + type +
                   "' is not supported; images are taken as base64 data (nothing is fetched)",
               "unsupported");
  if (!src.contains("media_type") || !src["media_type"].is_string() || !src.contains("data") ||
      !src["data"].is_string())
    return bad(where + ".source", where + ".source needs 'media_type' and 'data' strings",
               "invalid_type");
  part = {{"type", "image_url"},
          {"image_url",
           {{"url", "data:" + src["media_type"].get<std::string>() + ";base64," +
                        src["data"].get<std::string>()}}}};
  // An image_url part of the conversation: build_chat_job takes it like Chat Completions' own.
  return std::nullopt;
}

// A tool_result's content: a string, or text blocks; is_error is said to the model in the text.
std::optional<ApiError> read_tool_result(const json &block, const std::string &where,
                                         const std::map<std::string, std::string> &names,
                                         json &message) {
  if (!block.contains("tool_use_id") || !block["tool_use_id"].is_string())
    return bad(where + ".tool_use_id", where + ".tool_use_id: Field required", "invalid_type");
  const std::string id = block["tool_use_id"];
  const auto name = names.find(id);
  if (name == names.end())
    return bad(where + ".tool_use_id",
               where + ".tool_use_id: '" + id +
                   "' answers no tool_use block of an earlier assistant message");
  json parts = json::array();
  if (given(block, "is_error") && !block["is_error"].is_boolean())
    return bad(where + ".is_error", where + ".is_error must be a boolean", "invalid_type");
  if (given(block, "is_error") && block["is_error"] == true)
    parts.push_back({{"type", "text"}, {"text", "Error: "}});
  if (given(block, "content")) {
    const json &c = block["content"];
    if (c.is_string()) {
      parts.push_back({{"type", "text"}, {"text", c}});
    } else if (c.is_array()) {
      size_t k = 0;
      for (const json &b : c) {
        const std::string at = where + ".content[" + std::to_string(k++) + "]";
        if (str(b, "type") != "text")
          return bad(
              at, at + ": tool results hold text blocks only here (type '" + str(b, "type") + "')",
              "unsupported");
        json part;
        if (auto e = read_text_block(b, at, part)) return e;
        parts.push_back(part);
      }
    } else {
      return bad(where + ".content", where + ".content must be a string or a list of blocks",
                 "invalid_type");
    }
  }
  message = {{"role", "tool"}, {"tool_call_id", id}, {"name", name->second}, {"content", parts}};
  return std::nullopt;
}

// One user message's blocks: text and images stay one user message; each tool_result becomes a
// tool message where it stands.
std::optional<ApiError> read_user(const json &content, const std::string &where,
                                  const std::map<std::string, std::string> &names, json &out) {
  json parts = json::array();
  auto flush = [&] {
    if (!parts.empty()) out.push_back({{"role", "user"}, {"content", parts}});
    parts = json::array();
  };
  size_t k = 0;
  for (const json &block : content) {
    const std::string at = where + ".content[" + std::to_string(k++) + "]";
    if (!block.is_object() || !block.contains("type") || !block["type"].is_string())
      return bad(at, at + ": a content block needs a 'type'", "invalid_type");
    const std::string type = block["type"];
    json part;
    if (type == "text") {
      if (auto e = read_text_block(block, at, part)) return e;
      parts.push_back(part);
    } else if (type == "image") {
      if (auto e = read_image_block(block, at, part)) return e;
      parts.push_back(part);
    } else if (type == "tool_result") {
      flush();
      json message;
      if (auto e = read_tool_result(block, at, names, message)) return e;
      out.push_back(message);
    } else {
      return bad(at + ".type",
                 at + ".type: '" + type +
                     "' is not supported in user messages (text, image, tool_result)",
                 "unsupported");
    }
  }
  flush();
  return std::nullopt;
}

// One assistant message's blocks: thinking (as the reasoning the template writes back), text,
// tool_use (calls, with their ids kept so tool results find them). redacted_thinking holds no
// text a model here could read: it is left out.
std::optional<ApiError> read_assistant(const json &content, const std::string &where,
                                       std::map<std::string, std::string> &names, json &out) {
  std::string reasoning;
  json parts = json::array(), calls = json::array();
  size_t k = 0;
  for (const json &block : content) {
    const std::string at = where + ".content[" + std::to_string(k++) + "]";
    if (!block.is_object() || !block.contains("type") || !block["type"].is_string())
      return bad(at, at + ": a content block needs a 'type'", "invalid_type");
    const std::string type = block["type"];
    if (type == "text") {
      json part;
      if (auto e = read_text_block(block, at, part)) return e;
      parts.push_back(part);
    } else if (type == "thinking") {
      if (!block.contains("thinking") || !block["thinking"].is_string())
        return bad(at, at + ".thinking: Field required (a string)", "invalid_type");
      reasoning += block["thinking"].get<std::string>();
    } else if (type == "redacted_thinking") {
      continue;
    } else if (type == "tool_use") {
      if (!block.contains("id") || !block["id"].is_string() || !block.contains("name") ||
          !block["name"].is_string())
        return bad(at, at + ": a tool_use block needs 'id' and 'name' strings", "invalid_type");
      const json input = given(block, "input") ? block["input"] : json::object();
      if (!input.is_object())
        return bad(at + ".input", at + ".input must be an object", "invalid_type");
      names[block["id"]] = block["name"];
      calls.push_back({{"id", block["id"]},
                       {"type", "function"},
                       {"function", {{"name", block["name"]}, {"arguments", input}}}});
    } else {
      return bad(at + ".type",
                 at + ".type: '" + type +
                     "' is not supported in assistant messages (text, thinking, "
                     "redacted_thinking, tool_use)",
                 "unsupported");
    }
  }
  json m = {{"role", "assistant"}};
  if (!reasoning.empty()) m["reasoning_content"] = reasoning;
  m["content"] = parts;
  if (!calls.empty()) m["tool_calls"] = calls;
  out.push_back(m);
  return std::nullopt;
}

constexpr const char *kBillingHeader = "x-anthropic-billing-header:";

std::optional<ApiError> read_system(const json &body, Conversation &conv) {
  if (!given(body, "system")) return std::nullopt;
  const json &s = body["system"];
  if (s.is_string()) {
    conv.messages.push_back({{"role", "system"}, {"content", s}});
    return std::nullopt;
  }
  if (!s.is_array())
    return bad("system", "system: must be a string or a list of text blocks", "invalid_type");
  // Blocks stay parts: each is tokenized on its own, so a block that changes per request (Claude
  // Code's attribution line) leaves the ones after it the same tokens.
  json parts = json::array();
  size_t k = 0;
  for (const json &block : s) {
    const std::string at = "system[" + std::to_string(k++) + "]";
    if (str(block, "type") != "text")
      return bad(at, at + ": system blocks must be text blocks", "invalid_type");
    json part;
    if (auto e = read_text_block(block, at, part)) return e;
    // Claude Code's attribution line (its version and entry point, for Anthropic's billing) is
    // metadata, not an instruction: left out, so that it never splits the prefix two sessions
    // or two versions share.
    if (part["text"].get<std::string>().rfind(kBillingHeader, 0) == 0) continue;
    parts.push_back(part);
  }
  if (!parts.empty()) conv.messages.push_back({{"role", "system"}, {"content", parts}});
  return std::nullopt;
}

std::optional<ApiError> read_messages(const json &body, Conversation &conv) {
  if (!given(body, "messages") || !body["messages"].is_array() || body["messages"].empty())
    return bad("messages", "messages: Field required (a non-empty list)");
  std::map<std::string, std::string> names; // tool_use id -> tool name
  size_t i = 0;
  for (const json &m : body["messages"]) {
    const std::string where = "messages[" + std::to_string(i++) + "]";
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      return bad(where, where + ": a message needs a 'role'", "invalid_type");
    const std::string role = m["role"];
    if (!m.contains("content"))
      return bad(where + ".content", where + ".content: Field required", "invalid_type");
    json content = m["content"];
    if (content.is_string()) content = json::array({{{"type", "text"}, {"text", content}}});
    if (!content.is_array())
      return bad(where + ".content", where + ".content must be a string or a list of blocks",
                 "invalid_type");
    if (role == "user") {
      if (auto e = read_user(content, where, names, conv.messages)) return e;
    } else if (role == "assistant") {
      if (auto e = read_assistant(content, where, names, conv.messages)) return e;
    } else if (role == "system") { // mid-conversation instructions, where they stand
      json parts = json::array();
      size_t k = 0;
      for (const json &block : content) {
        const std::string at = where + ".content[" + std::to_string(k++) + "]";
        json part;
        if (str(block, "type") != "text")
          return bad(at, at + ": system messages hold text blocks", "invalid_type");
        if (auto e = read_text_block(block, at, part)) return e;
        parts.push_back(part);
      }
      conv.messages.push_back({{"role", "system"}, {"content", parts}});
    } else {
      return bad(where + ".role",
                 where + ".role: '" + role + "' is not one of user, assistant, system");
    }
  }
  return std::nullopt;
}

// A last assistant message asks the model to continue it (Anthropic's prefill), which the chat
// template cannot render (it closes every message it writes): refused, not answered as a new
// turn.
std::optional<ApiError> refuse_prefill(const Conversation &conv) {
  const json &m = conv.messages;
  if (!m.empty() && m.back()["role"] == "assistant" && !m.back().contains("tool_calls"))
    return bad("messages",
               "messages: a final assistant message (prefill) is not supported: the "
               "answer would start a new turn instead of continuing it",
               "unsupported");
  return std::nullopt;
}

std::optional<ApiError> read_tools(const json &body, Conversation &conv) {
  if (!given(body, "tools")) return std::nullopt;
  if (!body["tools"].is_array()) return bad("tools", "tools: must be a list", "invalid_type");
  size_t i = 0;
  for (const json &t : body["tools"]) {
    const std::string at = "tools[" + std::to_string(i++) + "]";
    if (!t.is_object()) return bad(at, at + ": must be an object", "invalid_type");
    if (given(t, "type") && t["type"] != "custom")
      return bad(at + ".type",
                 at + ".type: '" + (t["type"].is_string() ? t["type"].get<std::string>() : "") +
                     "' is a server tool; this server runs none (only client tools, with an "
                     "input_schema)",
                 "unsupported");
    for (const auto &[key, value] : t.items())
      if (key != "name" && key != "description" && key != "input_schema" && key != "strict" &&
          key != "cache_control" && key != "type" && key != "defer_loading")
        return bad(at + "." + key, at + "." + key + ": not supported", "unsupported");
    if (!t.contains("name") || !t["name"].is_string() || t["name"].get<std::string>().empty())
      return bad(at + ".name", at + ".name: Field required", "invalid_type");
    if (!t.contains("input_schema") || !t["input_schema"].is_object())
      return bad(at + ".input_schema", at + ".input_schema: Field required (an object)",
                 "invalid_type");
    if (given(t, "strict") && !t["strict"].is_boolean())
      return bad(at + ".strict", at + ".strict must be a boolean", "invalid_type");
    if (given(t, "defer_loading") && !t["defer_loading"].is_boolean())
      return bad(at + ".defer_loading", at + ".defer_loading must be a boolean", "invalid_type");
    // A deferred tool is not shown to the model until a tool search finds it, which happens on
    // Anthropic's side; here nothing finds it, so it stays out of the prompt.
    if (given(t, "defer_loading") && t["defer_loading"] == true) continue;
    json fn = {{"name", t["name"]},
               {"description", given(t, "description") ? t["description"] : json("")},
               {"parameters", t["input_schema"]}};
    if (given(t, "strict")) fn["strict"] = t["strict"];
    conv.tools.push_back({{"type", "function"}, {"function", fn}});
  }
  return std::nullopt;
}

std::optional<ApiError> read_tool_choice(const json &body, Conversation &conv) {
  if (!given(body, "tool_choice")) return std::nullopt;
  const json &tc = body["tool_choice"];
  if (!tc.is_object() || !tc.contains("type") || !tc["type"].is_string())
    return bad("tool_choice", "tool_choice: must be an object with a 'type'", "invalid_type");
  const std::string type = tc["type"];
  if (type == "auto")
    conv.tool_choice = "auto";
  else if (type == "any")
    conv.tool_choice = "required";
  else if (type == "none")
    conv.tool_choice = "none";
  else if (type == "tool") {
    if (!tc.contains("name") || !tc["name"].is_string())
      return bad("tool_choice.name", "tool_choice.name: Field required", "invalid_type");
    conv.tool_choice = "named", conv.named_tool = tc["name"];
  } else {
    return bad("tool_choice.type",
               "tool_choice.type: '" + type + "' is not one of auto, any, tool, none");
  }
  if (given(tc, "disable_parallel_tool_use")) {
    if (!tc["disable_parallel_tool_use"].is_boolean())
      return bad("tool_choice.disable_parallel_tool_use",
                 "tool_choice.disable_parallel_tool_use must be a boolean", "invalid_type");
    if (tc["disable_parallel_tool_use"] == true) conv.parallel_tool_calls = false;
  }
  if (conv.tool_choice != "auto" && conv.tool_choice != "none" && conv.tools.empty())
    return bad("tool_choice", "tool_choice: '" + type + "' needs tools");
  return std::nullopt;
}

// thinking and output_config.effort to the model's reasoning strength: thinking disabled is the
// least the model allows (it always reasons: under a grammar, none), a budget picks the level its
// size suggests, output_config.effort names it (max is the highest).
std::optional<ApiError> read_reasoning(const json &body, int32_t max_tokens, Conversation &conv,
                                       Job *job) {
  std::string effort = "high";
  // Thinking blocks are answered only to a request that asks for thinking, as Anthropic does:
  // clients without it read content[0] as the text. The model reasons either way.
  if (job)
    job->show_reasoning = given(body, "thinking") && str(body["thinking"], "type") != "disabled";
  if (given(body, "thinking")) {
    const json &t = body["thinking"];
    if (!t.is_object() || !t.contains("type") || !t["type"].is_string())
      return bad("thinking", "thinking: must be an object with a 'type'", "invalid_type");
    const std::string type = t["type"];
    for (const auto &[key, value] : t.items())
      if (key != "type" && key != "budget_tokens" && key != "display")
        return bad("thinking." + key, "thinking." + key + ": not supported", "unsupported");
    // The thinking is shown whole, as it is written: more than a summary, and updated with every
    // token.
    if (given(t, "display") && t["display"] != "summarized" && t["display"] != "updates")
      return bad("thinking.display",
                 "thinking.display: '" + t["display"].dump() +
                     "' is not supported (summarized, updates: the thinking is streamed whole)",
                 "unsupported");
    if (type == "disabled") {
      effort = "none";
    } else if (type == "enabled") {
      if (!t.contains("budget_tokens") || !t["budget_tokens"].is_number_integer())
        return bad("thinking.budget_tokens", "thinking.budget_tokens: Field required (an integer)",
                   "invalid_type");
      const int64_t budget = t["budget_tokens"];
      if (budget < 1024)
        return bad("thinking.budget_tokens", "thinking.budget_tokens: must be at least 1024");
      if (max_tokens > 0 && budget >= max_tokens)
        return bad("thinking.budget_tokens",
                   "`max_tokens` must be greater than `thinking.budget_tokens`");
      effort = budget < 4096 ? "low" : budget < 16384 ? "medium" : "high";
    } else if (type != "adaptive") {
      return bad("thinking.type",
                 "thinking.type: '" + type + "' is not one of enabled, disabled, adaptive");
    }
  }
  if (given(body, "output_config")) {
    const json &oc = body["output_config"];
    if (!oc.is_object())
      return bad("output_config", "output_config: must be an object", "invalid_type");
    for (const auto &[key, value] : oc.items())
      if (key != "effort" && key != "format")
        return bad("output_config." + key, "output_config." + key + ": not supported",
                   "unsupported");
    if (given(oc, "effort") && effort != "none") {
      const std::string e = oc["effort"].is_string() ? oc["effort"].get<std::string>() : "";
      if (e != "low" && e != "medium" && e != "high" && e != "max")
        return bad("output_config.effort",
                   "output_config.effort: must be one of low, medium, high, max");
      effort = e == "max" ? "xhigh" : e;
    }
    if (given(oc, "format")) {
      const json &f = oc["format"];
      if (str(f, "type") != "json_schema" || !given(f, "schema"))
        return bad("output_config.format",
                   "output_config.format: must be {\"type\": \"json_schema\", \"schema\": {...}}",
                   "invalid_type");
      conv.response_format = {
          {"type", "json_schema"},
          {"json_schema", {{"name", "output"}, {"schema", f["schema"]}, {"strict", true}}}};
    }
  }
  conv.reasoning_effort = effort;
  return std::nullopt;
}

// context_management: the edits Anthropic's server makes to a conversation before the model reads
// it. Only those that change nothing here are taken: clearing thinking with keep "all" (every
// thinking block the client sends back is shown to the model). Any other edit is refused by name.
std::optional<ApiError> read_context_management(const json &body) {
  if (!given(body, "context_management")) return std::nullopt;
  const json &cm = body["context_management"];
  if (!cm.is_object())
    return bad("context_management", "context_management: must be an object", "invalid_type");
  for (const auto &[key, value] : cm.items())
    if (key != "edits")
      return bad("context_management." + key, "context_management." + key + ": not supported",
                 "unsupported");
  if (!given(cm, "edits")) return std::nullopt;
  if (!cm["edits"].is_array())
    return bad("context_management.edits", "context_management.edits: must be a list",
               "invalid_type");
  size_t i = 0;
  for (const json &edit : cm["edits"]) {
    const std::string at = "context_management.edits[" + std::to_string(i++) + "]";
    const std::string type = str(edit, "type");
    const bool keep_all = edit.is_object() && edit.contains("keep") && edit["keep"] == "all";
    if (type.rfind("clear_thinking_", 0) == 0 && keep_all) continue;
    return bad(at,
               at + ": the edit '" + type +
                   "' is not supported (only clear_thinking with keep 'all', which changes "
                   "nothing)",
               "unsupported");
  }
  return std::nullopt;
}

std::optional<ApiError> read_conversation(const json &body, Job *job, int32_t max_tokens,
                                          Conversation &conv) {
  conv.format_field = "output_config.format";
  if (auto e = read_context_management(body)) return e;
  if (auto e = read_system(body, conv)) return e;
  if (auto e = read_messages(body, conv)) return e;
  if (auto e = refuse_prefill(conv)) return e;
  if (auto e = read_tools(body, conv)) return e;
  if (auto e = read_tool_choice(body, conv)) return e;
  return read_reasoning(body, max_tokens, conv, job);
}

} // namespace

ApiError context_error(int64_t prompt, int32_t max_tokens_asked, int32_t context) {
  if (prompt >= context)
    return {413,
            "prompt is too long: " + std::to_string(prompt) + " tokens > " +
                std::to_string(context - 1) + " maximum",
            "messages", "context_length_exceeded", "request_too_large"};
  return {400,
          "input length and `max_tokens` exceed context limit: " + std::to_string(prompt) + " + " +
              std::to_string(max_tokens_asked) + " > " + std::to_string(context) +
              ", decrease input length or `max_tokens` and try again",
          "max_tokens", "context_length_exceeded"};
}

namespace {

ApiError overflow(const Job &job, const ModelFacts &facts) {
  return context_error(int64_t(job.request.prompt.size()), job.max_tokens_asked, facts.context);
}

std::optional<ApiError> common(const json &body, const ModelFacts &facts) {
  if (!body.is_object()) return bad("", "the request body is not a JSON object", "invalid_json");
  if (auto e = check_model(body, facts)) return e;
  if (!given(body, "model") || !body["model"].is_string())
    return bad("model", "model: Field required", "invalid_type");
  return std::nullopt;
}

} // namespace

std::optional<ApiError> parse_messages(const json &body, const ModelFacts &facts, Job &job) {
  if (auto e = common(body, facts)) return e;
  if (auto e = refuse_unknown(body, kMessageFields)) return e;
  if (!given(body, "max_tokens"))
    return bad("max_tokens", "max_tokens: Field required", "invalid_type");
  if (given(body, "stream")) {
    if (!body["stream"].is_boolean())
      return bad("stream", "stream: must be a boolean", "invalid_type");
    job.stream = body["stream"];
  }
  if (given(body, "temperature") && body["temperature"].is_number() &&
      !(body["temperature"].get<double>() <= 1.0))
    return bad("temperature", "temperature: must be between 0 and 1");
  if (given(body, "metadata") && !body["metadata"].is_object())
    return bad("metadata", "metadata: must be an object", "invalid_type");
  if (given(body, "service_tier") && body["service_tier"] != "auto" &&
      body["service_tier"] != "standard_only")
    return bad("service_tier", "service_tier: must be auto or standard_only");
  // The sampling fields under the names the shared reader knows.
  json sampling = json::object();
  for (const char *key : {"max_tokens", "temperature", "top_p", "top_k"})
    if (given(body, key)) sampling[key] = body[key];
  if (given(body, "stop_sequences")) {
    if (!body["stop_sequences"].is_array())
      return bad("stop_sequences", "stop_sequences: must be a list of strings", "invalid_type");
    sampling["stop"] = body["stop_sequences"];
  }
  int32_t max_tokens = -1;
  // Where the only cap is the context, a max_tokens over it is answered in the words clients act
  // on ("input length and `max_tokens` exceed context limit", below), not as a range error.
  ModelFacts uncapped = facts;
  if (uncapped.max_tokens_cap >= uncapped.context) uncapped.max_tokens_cap = INT32_MAX / 2;
  if (auto e = parse_sampling(sampling, uncapped, job, max_tokens, false)) {
    if (e->param == "stop") e->param = "stop_sequences";
    e->message = (e->param.empty() ? "" : e->param + ": ") + e->message;
    return e;
  }
  job.max_tokens_asked = max_tokens;
  Conversation conv;
  if (auto e = read_conversation(body, &job, max_tokens, conv)) return e;
  if (auto e = build_chat_job(conv, facts, job)) {
    if (e->code == "context_length_exceeded") return overflow(job, facts);
    return e;
  }
  return std::nullopt;
}

std::optional<ApiError> parse_count_tokens(const json &body, const ModelFacts &facts, Job &job) {
  if (auto e = common(body, facts)) return e;
  if (auto e = refuse_unknown(body, kCountFields)) return e;
  Conversation conv;
  if (auto e = read_conversation(body, &job, -1, conv)) return e;
  job.max_tokens_asked = 0; // counted, not answered: the prompt may fill the context
  if (auto e = build_chat_job(conv, facts, job))
    if (e->code != "context_length_exceeded") return e; // a prompt over the context: counted too
  return std::nullopt;
}

std::string stop_reason(const ChoiceOutput &out, bool cut_by_length) {
  if (out.stopped()) return "stop_sequence";
  if (cut_by_length) return "max_tokens";
  return out.tool_calls().empty() ? "end_turn" : "tool_use";
}

json usage(size_t prompt_tokens, int cached_tokens, int output_tokens) {
  const int64_t cached = std::min<int64_t>(cached_tokens, int64_t(prompt_tokens));
  return {{"input_tokens", int64_t(prompt_tokens) - cached},
          {"cache_creation_input_tokens", 0},
          {"cache_read_input_tokens", cached},
          {"output_tokens", output_tokens}};
}

std::string thinking_signature(const std::string &thinking) {
  uint64_t h = 1469598103934665603ull; // FNV-1a
  for (unsigned char c : thinking) h = (h ^ c) * 1099511628211ull;
  char buf[32];
  std::snprintf(buf, sizeof buf, "offgraph-%016" PRIx64, h);
  return buf;
}

void MessageBuilder::open(Open kind, const json &block, std::vector<Event> &out) {
  if (open_ == kind && kind != Open::None) return;
  for (Event &e : close()) out.push_back(std::move(e));
  open_ = kind;
  content_.push_back(block);
  out.push_back({"content_block_start",
                 {{"type", "content_block_start"},
                  {"index", content_.size() - 1},
                  {"content_block", block}}});
}

std::vector<Event> MessageBuilder::close() {
  std::vector<Event> out;
  if (open_ == Open::None) return out;
  const size_t index = content_.size() - 1;
  if (open_ == Open::Thinking) {
    json &block = content_[index];
    block["signature"] = thinking_signature(block["thinking"].get<std::string>());
    out.push_back({"content_block_delta",
                   {{"type", "content_block_delta"},
                    {"index", index},
                    {"delta", {{"type", "signature_delta"}, {"signature", block["signature"]}}}}});
  }
  out.push_back({"content_block_stop", {{"type", "content_block_stop"}, {"index", index}}});
  open_ = Open::None;
  return out;
}

std::vector<Event> MessageBuilder::add(const ChoiceOutput::Delta &delta) {
  std::vector<Event> out;
  auto delta_event = [&](const json &d) {
    out.push_back(
        {"content_block_delta",
         {{"type", "content_block_delta"}, {"index", content_.size() - 1}, {"delta", d}}});
  };
  if (!delta.reasoning.empty() && show_thinking_) {
    open(Open::Thinking, {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}, out);
    content_.back()["thinking"] = content_.back()["thinking"].get<std::string>() + delta.reasoning;
    delta_event({{"type", "thinking_delta"}, {"thinking", delta.reasoning}});
  }
  if (!delta.content.empty()) {
    open(Open::Text, {{"type", "text"}, {"text", ""}}, out);
    content_.back()["text"] = content_.back()["text"].get<std::string>() + delta.content;
    delta_event({{"type", "text_delta"}, {"text", delta.content}});
  }
  for (const auto &call : delta.tool_calls) {
    for (Event &e : close()) out.push_back(std::move(e));
    const std::string args = call["function"]["arguments"];
    json input = json::parse(args, nullptr, false);
    if (input.is_discarded() || !input.is_object()) input = json::object();
    const std::string id = "toolu_" + prefix_ + "_" + std::to_string(tools_++);
    json start = {{"type", "tool_use"},
                  {"id", id},
                  {"name", call["function"]["name"]},
                  {"input", json::object()}};
    content_.push_back(start);
    content_.back()["input"] = input;
    const size_t index = content_.size() - 1;
    out.push_back({"content_block_start",
                   {{"type", "content_block_start"}, {"index", index}, {"content_block", start}}});
    delta_event({{"type", "input_json_delta"}, {"partial_json", input.dump()}});
    out.push_back({"content_block_stop", {{"type", "content_block_stop"}, {"index", index}}});
  }
  return out;
}

Event message_start(const MessageHead &head, const json &usage) {
  return {"message_start",
          {{"type", "message_start"},
           {"message",
            {{"id", head.id},
             {"type", "message"},
             {"role", "assistant"},
             {"model", head.model},
             {"content", json::array()},
             {"stop_reason", nullptr},
             {"stop_sequence", nullptr},
             {"usage", usage}}}}};
}

std::vector<Event> message_end(const std::string &stop_reason, const std::string &stop_sequence,
                               const json &usage) {
  return {{"message_delta",
           {{"type", "message_delta"},
            {"delta",
             {{"stop_reason", stop_reason},
              {"stop_sequence", stop_sequence.empty() ? json(nullptr) : json(stop_sequence)}}},
            {"usage", usage}}},
          {"message_stop", {{"type", "message_stop"}}}};
}

Event ping() { return {"ping", {{"type", "ping"}}}; }

json message_body(const MessageHead &head, const json &content, const std::string &stop_reason,
                  const std::string &stop_sequence, const json &usage) {
  return {{"id", head.id},
          {"type", "message"},
          {"role", "assistant"},
          {"model", head.model},
          {"content", content},
          {"stop_reason", stop_reason},
          {"stop_sequence", stop_sequence.empty() ? json(nullptr) : json(stop_sequence)},
          {"usage", usage}};
}

std::string sse(const Event &e) {
  return "event: " + e.name +
         "\ndata: " + e.data.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

} // namespace offgraph::server::anthropic
