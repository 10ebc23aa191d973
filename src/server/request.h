// The wire-neutral chat request. Every chat API (Chat Completions, Anthropic Messages, ...) reads
// its body into a Conversation and its sampling fields into a Job (api.h); one function then
// checks the conversation, renders the chat template and builds the constraints (build_chat_job).
// Nothing in here is any API's wire shape but the template's own: messages and tools are what
// Hugging Face chat templates read.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>

namespace offgraph::server {

struct Conversation {
  using json = nlohmann::ordered_json;
  // Chat-template messages: role system, user, assistant or tool; content a string or a list of
  // {"type": "text", "text"} and {"type": "image_url", "image_url": {"url": "data:..."}} parts;
  // assistant messages may carry reasoning_content and tool_calls ({"id", "type": "function",
  // "function": {"name", "arguments"}}, arguments an object or a JSON string); tool messages
  // tool_call_id and name.
  json messages = json::array();
  // Chat-template tools: {"type": "function", "function": {"name", "description", "parameters",
  // "strict"}}.
  json tools = json::array();
  std::string tool_choice = "auto"; // auto, none, required, named
  std::string named_tool;           // with "named"
  // Whether more than one call may be made in a turn; unset: the API's default (yes).
  std::optional<bool> parallel_tool_calls;
  std::string reasoning_effort = "high"; // none, minimal, low, medium, high, xhigh
  // The answer's format, null for free text: {"type": "json_object"} or {"type": "json_schema",
  // "json_schema": {"name", "schema", "strict"}} (structured.h).
  json response_format;
  json grammar; // null, or GBNF text binding the answer
  // Descriptions of tool namespaces (tools named namespace.function), for templates that print
  // them (tool_namespace_descriptions).
  json namespace_descriptions = json::object();
  // Tools whose one string parameter is free-form input under a grammar (OpenAI custom tools):
  // name -> {"syntax": "lark" or "regex", "definition"}, or {"syntax": "text"} (any text). The
  // call is sampled under it.
  json tool_grammars = json::object();
  // Where errors about each part point, in the API's own field names.
  std::string messages_field = "messages", format_field = "response_format";
};

} // namespace offgraph::server
