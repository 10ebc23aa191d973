#include "server/responses.h"

#include "server/image_parts.h"

#include <map>
#include <set>

namespace offgraph::server::responses {

void Store::put(const std::string &id, Stored s) {
  if (capacity_ == 0) return;
  std::lock_guard lock(mutex_);
  if (auto it = index_.find(id); it != index_.end()) order_.erase(it->second);
  order_.emplace_front(id, std::move(s));
  index_[id] = order_.begin();
  while (order_.size() > capacity_) {
    index_.erase(order_.back().first);
    order_.pop_back();
  }
}

std::optional<Stored> Store::get(const std::string &id) {
  std::lock_guard lock(mutex_);
  auto it = index_.find(id);
  if (it == index_.end()) return std::nullopt;
  order_.splice(order_.begin(), order_, it->second); // most recently used
  return it->second->second;
}

bool Store::erase(const std::string &id) {
  std::lock_guard lock(mutex_);
  auto it = index_.find(id);
  if (it == index_.end()) return false;
  order_.erase(it->second);
  index_.erase(it);
  return true;
}

namespace {

ApiError bad(const std::string &param, const std::string &message,
             const std::string &code = "invalid_value") {
  return ApiError{400, message, param, code};
}

bool given(const json &body, const char *key) { return body.contains(key) && !body[key].is_null(); }

std::string str(const json &j, const char *key) {
  return j.is_object() && j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : "";
}

// Top-level fields; anything else is refused by name. metadata, user, safety_identifier,
// service_tier, prompt_cache_key (deploy/affinity.js keys the replica on it) and client_metadata
// change nothing an answer holds on one server.
const std::set<std::string> kFields = {"model",
                                       "input",
                                       "instructions",
                                       "tools",
                                       "tool_choice",
                                       "parallel_tool_calls",
                                       "reasoning",
                                       "text",
                                       "max_output_tokens",
                                       "temperature",
                                       "top_p",
                                       "stream",
                                       "store",
                                       "previous_response_id",
                                       "prompt_cache_key",
                                       "include",
                                       "metadata",
                                       "user",
                                       "safety_identifier",
                                       "service_tier",
                                       "truncation",
                                       "client_metadata"};

// Tools OpenAI runs on its side; this server runs none of them.
const std::set<std::string> kHosted = {"web_search",
                                       "web_search_preview",
                                       "web_search_preview_2025_03_11",
                                       "file_search",
                                       "image_generation",
                                       "code_interpreter",
                                       "computer_use_preview",
                                       "computer_use",
                                       "mcp",
                                       "local_shell",
                                       "shell",
                                       "apply_patch",
                                       "tool_search"};

constexpr const char *kReasoningPrefix = "offgraph:";

std::string base64(const std::string &in) {
  static const char *t = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out += t[(v >> s) & 63];
  }
  if (i < in.size()) {
    uint32_t v = uint8_t(in[i]) << 16;
    if (i + 1 < in.size()) v |= uint8_t(in[i + 1]) << 8;
    out += t[(v >> 18) & 63];
    out += t[(v >> 12) & 63];
    out += i + 1 < in.size() ? t[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::optional<std::string> unbase64(const std::string &in) {
  std::string out;
  uint32_t v = 0;
  int bits = 0;
  for (char c : in) {
    int d;
    if (c >= 'A' && c <= 'Z')
      d = c - 'A';
    else if (c >= 'a' && c <= 'z')
      d = c - 'a' + 26;
    else if (c >= '0' && c <= '9')
      d = c - '0' + 52;
    else if (c == '+')
      d = 62;
    else if (c == '/')
      d = 63;
    else if (c == '=')
      break;
    else
      return std::nullopt;
    v = (v << 6) | uint32_t(d), bits += 6;
    if (bits >= 8) bits -= 8, out += char((v >> bits) & 0xff);
  }
  return out;
}

// A content list's parts as chat-template parts: text (input_text, output_text, text, refusal),
// and images where `images_ok` (user messages; taken by build_chat_job), else refused.
std::optional<ApiError> read_parts(const json &content, const std::string &where, bool images_ok,
                                   json &parts) {
  parts = json::array();
  if (content.is_string()) {
    parts.push_back({{"type", "text"}, {"text", content}});
    return std::nullopt;
  }
  if (!content.is_array())
    return bad(where, where + " must be a string or a list of content parts", "invalid_type");
  size_t k = 0;
  for (const json &p : content) {
    const std::string at = where + "[" + std::to_string(k++) + "]";
    const std::string type = str(p, "type");
    if (type == "input_text" || type == "output_text" || type == "text") {
      if (!p.contains("text") || !p["text"].is_string())
        return bad(at + ".text", at + ".text must be a string", "invalid_type");
      parts.push_back({{"type", "text"}, {"text", p["text"]}});
    } else if (type == "refusal") {
      parts.push_back({{"type", "text"}, {"text", str(p, "refusal")}});
    } else if (type == "input_image" && images_ok) {
      if (given(p, "file_id") || !p.contains("image_url") || !p["image_url"].is_string())
        return bad(at, at + ": images are taken as data: URLs in image_url (no file ids)",
                   "unsupported");
      json part = {{"type", "image_url"}, {"image_url", {{"url", p["image_url"]}}}};
      if (given(p, "detail")) part["image_url"]["detail"] = p["detail"];
      parts.push_back(part); // taken by build_chat_job, as Chat Completions' own
    } else {
      return bad(at + ".type", at + ".type '" + type + "' is not supported here", "unsupported");
    }
  }
  return std::nullopt;
}

// Input items into chat-template messages: messages as they are, function calls onto the
// assistant message before them, their outputs as tool messages, reasoning onto the assistant
// message that follows it.
std::optional<ApiError> read_items(const json &items, Conversation &conv) {
  std::map<std::string, std::string> names; // call_id -> the tool's name as the template shows it
  std::string reasoning;
  json &messages = conv.messages;
  // The assistant message a function call joins: the last message when it is the assistant's and
  // no reasoning came between, else a new one carrying that reasoning.
  auto assistant = [&]() -> json & {
    if (messages.empty() || messages.back()["role"] != "assistant" || !reasoning.empty())
      messages.push_back({{"role", "assistant"}, {"content", ""}});
    if (!reasoning.empty()) messages.back()["reasoning_content"] = reasoning;
    reasoning.clear();
    return messages.back();
  };
  // Reasoning that no assistant item followed (a cut response continued) is an assistant
  // message of its own, where it stood.
  auto flush_reasoning = [&] {
    if (reasoning.empty()) return;
    messages.push_back({{"role", "assistant"}, {"content", ""}, {"reasoning_content", reasoning}});
    reasoning.clear();
  };
  size_t i = 0;
  for (const json &item : items) {
    const std::string at = "input[" + std::to_string(i++) + "]";
    if (!item.is_object()) return bad(at, at + " must be an object", "invalid_type");
    std::string type = str(item, "type");
    if (type.empty() && item.contains("role")) type = "message";
    if (type == "message") {
      const std::string role = str(item, "role");
      if (role != "user" && role != "system" && role != "developer" && role != "assistant")
        return bad(at + ".role", at + ".role must be user, system, developer or assistant");
      json parts;
      if (auto e = read_parts(item.contains("content") ? item["content"] : json(), at + ".content",
                              role == "user", parts))
        return e;
      if (role == "assistant") {
        json m = {{"role", "assistant"}, {"content", parts}};
        if (!reasoning.empty()) m["reasoning_content"] = reasoning;
        reasoning.clear();
        messages.push_back(std::move(m)); // each message its own, as the model wrote them
      } else {
        flush_reasoning();
        messages.push_back({{"role", role == "developer" ? "system" : role}, {"content", parts}});
      }
    } else if (type == "function_call" || type == "custom_tool_call") {
      const std::string call_id = str(item, "call_id"), name = str(item, "name");
      if (call_id.empty() || name.empty())
        return bad(at, at + ": a " + type + " needs 'call_id' and 'name'", "invalid_type");
      const std::string ns = str(item, "namespace");
      const std::string full = ns.empty() ? name : ns + "." + name;
      json args = json::object();
      if (type == "custom_tool_call") {
        if (!item.contains("input") || !item["input"].is_string())
          return bad(at + ".input", at + ".input must be a string", "invalid_type");
        args["input"] = item["input"]; // as read_custom_tool shows the tool
      } else if (given(item, "arguments")) {
        if (!item["arguments"].is_string())
          return bad(at + ".arguments", at + ".arguments must be a string (JSON)", "invalid_type");
        // Bounded depth: a string is not covered by the body's own limit.
        if (parse_body(item["arguments"].get<std::string>(), args))
          return bad(at + ".arguments",
                     at + ".arguments is not a JSON object nesting at most 64 levels");
      }
      names[call_id] = full;
      json &m = assistant();
      if (!m.contains("tool_calls")) m["tool_calls"] = json::array();
      m["tool_calls"].push_back({{"id", call_id},
                                 {"type", "function"},
                                 {"function", {{"name", full}, {"arguments", args}}}});
    } else if (type == "function_call_output" || type == "custom_tool_call_output") {
      flush_reasoning();
      const std::string call_id = str(item, "call_id");
      const auto found = names.find(call_id);
      if (found == names.end())
        return bad(at + ".call_id", at + ".call_id '" + call_id + "' answers no call before it");
      json parts;
      if (auto e = read_parts(item.contains("output") ? item["output"] : json(""), at + ".output",
                              false, parts))
        return e;
      messages.push_back({{"role", "tool"},
                          {"tool_call_id", call_id},
                          {"name", found->second},
                          {"content", parts}});
    } else if (type == "reasoning") {
      // The reasoning this server wrote comes back whole in encrypted_content; a client's own
      // is its content, else its summary.
      std::string text;
      const std::string sealed = str(item, "encrypted_content");
      if (sealed.rfind(kReasoningPrefix, 0) == 0) {
        auto opened = unbase64(sealed.substr(std::string(kReasoningPrefix).size()));
        if (!opened) return bad(at + ".encrypted_content", at + ".encrypted_content is damaged");
        text = *opened;
      } else if (!sealed.empty()) {
        return bad(at + ".encrypted_content",
                   at + ".encrypted_content was not written by this server", "unsupported");
      } else {
        for (const char *key : {"content", "summary"}) {
          if (!item.contains(key) || !item[key].is_array()) continue;
          for (const json &p : item[key]) text += str(p, "text");
          if (!text.empty()) break;
        }
      }
      reasoning += text;
    } else {
      return bad(at + ".type",
                 at + ".type '" + type +
                     "' is not supported (message, function_call, "
                     "function_call_output, custom_tool_call, custom_tool_call_output, "
                     "reasoning)",
                 "unsupported");
    }
  }
  flush_reasoning();
  return std::nullopt;
}

json function_tool(const json &t, const std::string &name, const std::string &at, ApiError *err) {
  if (!t.contains("parameters") || !t["parameters"].is_object()) {
    if (t.contains("parameters") && !t["parameters"].is_null()) {
      *err =
          bad(at + ".parameters", at + ".parameters must be a JSON Schema object", "invalid_type");
      return json();
    }
  }
  json fn = {{"name", name},
             {"description", given(t, "description") ? t["description"] : json("")},
             {"parameters", given(t, "parameters")
                                ? t["parameters"]
                                : json{{"type", "object"}, {"properties", json::object()}}}};
  if (given(t, "strict")) fn["strict"] = t["strict"];
  return {{"type", "function"}, {"function", fn}};
}

// A custom tool: free-form input, plain text or under a Lark or regex grammar. Shown to the model
// as a function of one string parameter, `input` (ATEM writes strings raw, so the input is the
// text itself); its calls come back as custom_tool_call items.
std::optional<ApiError> read_custom_tool(const json &t, const std::string &at, Conversation &conv,
                                         json &tool_shapes) {
  for (const auto &[key, value] : t.items())
    if (key != "type" && key != "name" && key != "description" && key != "format")
      return bad(at + "." + key, at + "." + key + " is not supported", "unsupported");
  const std::string name = str(t, "name");
  if (name.empty()) return bad(at + ".name", at + " needs a 'name'");
  std::string described = "The tool's input, as free-form text (not JSON).";
  if (given(t, "format")) {
    const json &f = t["format"];
    const std::string type = str(f, "type");
    if (type == "grammar") {
      for (const auto &[key, value] : f.items())
        if (key != "type" && key != "syntax" && key != "definition")
          return bad(at + ".format." + key, at + ".format." + key + " is not supported",
                     "unsupported");
      const std::string syntax = str(f, "syntax");
      if (syntax != "lark" && syntax != "regex")
        return bad(at + ".format.syntax", at + ".format.syntax must be lark or regex");
      if (!f.contains("definition") || !f["definition"].is_string())
        return bad(at + ".format.definition", at + ".format.definition must be a string",
                   "invalid_type");
      conv.tool_grammars[name] = {{"syntax", syntax}, {"definition", f["definition"]}};
      described = "The tool's input, as free-form text (not JSON) in this " + syntax +
                  " grammar:\n" + f["definition"].get<std::string>();
    } else if (type != "text") {
      return bad(at + ".format.type", at + ".format.type must be text or grammar");
    } else if (f.size() > 1) {
      return bad(at + ".format", at + ".format of type text takes no other field", "unsupported");
    }
  }
  if (!conv.tool_grammars.contains(name)) conv.tool_grammars[name] = {{"syntax", "text"}};
  conv.tools.push_back(
      {{"type", "function"},
       {"function",
        {{"name", name},
         {"description", given(t, "description") ? t["description"] : json("")},
         {"parameters",
          {{"type", "object"},
           {"properties", {{"input", {{"type", "string"}, {"description", described}}}}},
           {"required", {"input"}},
           {"additionalProperties", false}}}}}});
  tool_shapes[name] = {{"name", name}, {"custom", true}};
  return std::nullopt;
}

std::optional<ApiError> read_tools(const json &body, const Options &options, Conversation &conv,
                                   Request &req, json &tool_shapes) {
  if (!given(body, "tools")) return std::nullopt;
  if (!body["tools"].is_array()) return bad("tools", "'tools' must be a list", "invalid_type");
  size_t i = 0;
  ApiError err;
  for (const json &t : body["tools"]) {
    const std::string at = "tools[" + std::to_string(i++) + "]";
    const std::string type = str(t, "type");
    if (type == "function" || type == "namespace")
      for (const auto &[key, value] : t.items())
        if (key != "type" && key != "name" && key != "description" &&
            key != (type == "function" ? "parameters" : "tools") &&
            (type != "function" || key != "strict"))
          return bad(at + "." + key, at + "." + key + " is not supported", "unsupported");
    if (type == "function") {
      const std::string name = str(t, "name");
      if (name.empty()) return bad(at + ".name", at + " needs a 'name'");
      json tool = function_tool(t, name, at, &err);
      if (tool.is_null()) return err;
      conv.tools.push_back(tool);
    } else if (type == "namespace") {
      // An MCP server's tools: shown as namespace.function, as Muse Glimmer's format writes
      // them; calls come back with the two apart.
      const std::string ns = str(t, "name");
      if (ns.empty() || ns.find('.') != std::string::npos)
        return bad(at + ".name", at + ".name must be a name without '.'");
      if (!t.contains("tools") || !t["tools"].is_array())
        return bad(at + ".tools", at + ".tools must be a list", "invalid_type");
      if (given(t, "description")) conv.namespace_descriptions[ns] = t["description"];
      size_t k = 0;
      for (const json &inner : t["tools"]) {
        const std::string in_at = at + ".tools[" + std::to_string(k++) + "]";
        if (str(inner, "type") != "function" || str(inner, "name").empty())
          return bad(in_at, in_at + ": a namespace holds function tools with names", "unsupported");
        for (const auto &[key, value] : inner.items())
          if (key != "type" && key != "name" && key != "description" && key != "parameters" &&
              key != "strict")
            return bad(in_at + "." + key, in_at + "." + key + " is not supported", "unsupported");
        const std::string full = ns + "." + str(inner, "name");
        json tool = function_tool(inner, full, in_at, &err);
        if (tool.is_null()) return err;
        conv.tools.push_back(tool);
        tool_shapes[full] = {{"namespace", ns}, {"name", inner["name"]}};
      }
    } else if (type == "custom") {
      if (auto e = read_custom_tool(t, at, conv, tool_shapes)) return e;
    } else if (kHosted.count(type)) {
      if (!options.drop_hosted_tools)
        return bad(at + ".type",
                   at + ".type '" + type +
                       "': a hosted tool; this server runs none (offgraph serve "
                       "--drop-hosted-tools leaves them out and says so in the "
                       "X-Offgraph-Dropped-Tools header)",
                   "unsupported");
      req.dropped_tools.push_back(type);
    } else {
      return bad(at + ".type", at + ".type '" + type + "' is not a tool type this server knows",
                 "unsupported");
    }
  }
  return std::nullopt;
}

// Calls are told apart by name alone: two tools under one name (a function and a custom tool,
// or a namespace's function and a tool named like it) are refused.
std::optional<ApiError> check_unique_names(const Conversation &conv) {
  std::set<std::string> seen;
  for (const json &t : conv.tools) {
    const std::string name = t["function"]["name"];
    if (!seen.insert(name).second)
      return bad("tools", "two tools are named '" + name + "'; calls are told apart by name");
  }
  return std::nullopt;
}

std::optional<ApiError> read_choice(const json &body, Conversation &conv) {
  if (given(body, "parallel_tool_calls")) {
    if (!body["parallel_tool_calls"].is_boolean())
      return bad("parallel_tool_calls", "'parallel_tool_calls' must be true or false",
                 "invalid_type");
    conv.parallel_tool_calls = body["parallel_tool_calls"].get<bool>();
  }
  if (!given(body, "tool_choice")) return std::nullopt;
  const json &tc = body["tool_choice"];
  if (tc.is_string()) {
    conv.tool_choice = tc;
    if (conv.tool_choice != "auto" && conv.tool_choice != "none" && conv.tool_choice != "required")
      return bad("tool_choice", "'tool_choice' must be auto, none, required or a function");
    return std::nullopt;
  }
  if ((str(tc, "type") == "function" || str(tc, "type") == "custom") && !str(tc, "name").empty()) {
    conv.tool_choice = "named", conv.named_tool = str(tc, "name");
    return std::nullopt;
  }
  return bad("tool_choice",
             "'tool_choice' must be auto, none, required or {\"type\": \"function\" or "
             "\"custom\", \"name\"}"
             " (allowed_tools and hosted tools are not supported)",
             "unsupported");
}

std::optional<ApiError> read_reasoning_and_text(const json &body, Conversation &conv,
                                                Request &req) {
  if (given(body, "reasoning")) {
    const json &r = body["reasoning"];
    if (!r.is_object()) return bad("reasoning", "'reasoning' must be an object", "invalid_type");
    for (const auto &[key, value] : r.items())
      if (key != "effort" && key != "summary")
        return bad("reasoning." + key, "'reasoning." + key + "' is not supported", "unsupported");
    if (given(r, "effort")) {
      const std::string e = str(r, "effort");
      if (e != "none" && e != "minimal" && e != "low" && e != "medium" && e != "high" &&
          e != "xhigh")
        return bad("reasoning.effort",
                   "'reasoning.effort' must be none, minimal, low, medium, high or xhigh");
      conv.reasoning_effort = e;
    }
    if (given(r, "summary")) {
      const std::string s = str(r, "summary");
      if (s != "auto" && s != "concise" && s != "detailed")
        return bad("reasoning.summary", "'reasoning.summary' must be auto, concise or detailed");
      req.summary = true;
    }
  }
  if (given(body, "text")) {
    const json &t = body["text"];
    if (!t.is_object()) return bad("text", "'text' must be an object", "invalid_type");
    for (const auto &[key, value] : t.items()) {
      if (key == "verbosity" && (value.is_null() || value == "medium")) continue;
      if (key != "format")
        return bad("text." + key,
                   "'text." + key + "' is not supported" +
                       (key == "verbosity" ? " (only medium: the model has no other)" : ""),
                   "unsupported");
    }
    if (given(t, "format")) {
      const json &f = t["format"];
      const std::string type = str(f, "type");
      if (type == "json_schema") { // Chat Completions' shape, one level down there
        json js = json::object();
        for (const auto &[key, value] : f.items())
          if (key != "type") js[key] = value;
        conv.response_format = {{"type", "json_schema"}, {"json_schema", js}};
      } else if (type == "json_object" || type == "text") {
        conv.response_format = {{"type", type}};
      } else {
        return bad("text.format.type",
                   "'text.format.type' must be text, json_object or json_schema");
      }
    }
  }
  return std::nullopt;
}

} // namespace

std::string encrypt_reasoning(const std::string &text) { return kReasoningPrefix + base64(text); }

namespace {
// The request's tools as the response repeats them: hosted ones that were dropped left out.
json tools_kept(const json &body) {
  json out = json::array();
  if (given(body, "tools") && body["tools"].is_array())
    for (const json &t : body["tools"])
      if (!kHosted.count(str(t, "type"))) out.push_back(t);
  return out;
}
} // namespace

std::optional<ApiError> parse(const json &body, const ModelFacts &facts, const Options &options,
                              Job &job, Request &req) {
  if (!body.is_object()) return bad("", "the request body is not a JSON object", "invalid_json");
  if (auto e = check_model(body, facts)) return e;
  for (const auto &[key, value] : body.items())
    if (!kFields.count(key)) return bad(key, "'" + key + "' is not supported", "unsupported");
  if (given(body, "stream")) {
    if (!body["stream"].is_boolean())
      return bad("stream", "'stream' must be true or false", "invalid_type");
    job.stream = body["stream"];
  }
  if (given(body, "truncation") && body["truncation"] != "disabled")
    return bad("truncation", "'truncation' must be disabled: this server never drops input",
               "unsupported");
  if (given(body, "include")) {
    if (!body["include"].is_array()) return bad("include", "'include' must be a list");
    for (const json &x : body["include"]) {
      if (x == "reasoning.encrypted_content") {
        req.encrypted_reasoning = true;
        continue;
      }
      return bad("include", "'include' value " + x.dump() + " is not supported", "unsupported");
    }
  }
  const bool can_store = options.store && options.store->capacity() > 0;
  if (given(body, "store")) {
    if (!body["store"].is_boolean())
      return bad("store", "'store' must be true or false", "invalid_type");
    req.store = body["store"];
    if (req.store && !can_store)
      return bad("store",
                 "'store': the server keeps no responses (offgraph serve "
                 "--responses-store N)",
                 "unsupported");
  } else {
    req.store = can_store;
  }
  json sampling = json::object();
  if (given(body, "max_output_tokens")) sampling["max_tokens"] = body["max_output_tokens"];
  for (const char *key : {"temperature", "top_p"})
    if (given(body, key)) sampling[key] = body[key];
  int32_t max_tokens = -1;
  if (auto e = parse_sampling(sampling, facts, job, max_tokens, false)) {
    if (e->param == "max_tokens") e->param = "max_output_tokens";
    return e;
  }
  job.max_tokens_asked = max_tokens;

  Conversation conv;
  conv.messages_field = "input";
  conv.format_field = "text.format";
  if (given(body, "instructions")) {
    if (!body["instructions"].is_string())
      return bad("instructions", "'instructions' must be a string", "invalid_type");
    req.instructions = body["instructions"];
    conv.messages.push_back({{"role", "system"}, {"content", req.instructions}});
  }
  if (given(body, "previous_response_id")) {
    const std::string prev = str(body, "previous_response_id");
    if (!can_store)
      return bad("previous_response_id",
                 "'previous_response_id': the server keeps no responses "
                 "(offgraph serve --responses-store N)",
                 "unsupported");
    auto stored = options.store->get(prev);
    if (!stored)
      return ApiError{400,
                      "Previous response with id '" + prev +
                          "' not found (never stored, deleted, or evicted: the server keeps "
                          "the last " +
                          std::to_string(options.store->capacity()) + ")",
                      "previous_response_id", "previous_response_not_found"};
    req.previous_response_id = prev;
    for (const json &x : stored->input) req.input.push_back(x);
    for (const json &x : stored->output) req.input.push_back(x);
  }
  if (!given(body, "input")) return bad("input", "'input' is required");
  if (body["input"].is_string())
    req.input.push_back({{"type", "message"}, {"role", "user"}, {"content", body["input"]}});
  else if (body["input"].is_array())
    for (const json &x : body["input"]) req.input.push_back(x);
  else
    return bad("input", "'input' must be a string or a list of items", "invalid_type");
  if (auto e = read_tools(body, options, conv, req, req.tool_shapes)) return e;
  if (auto e = check_unique_names(conv)) return e;
  if (auto e = read_items(req.input, conv)) return e;
  if (auto e = read_choice(body, conv)) return e;
  if (given(body, "tool_choice") && str(body["tool_choice"], "type") == "custom" &&
      !conv.tool_grammars.contains(conv.named_tool))
    return bad("tool_choice", "'tool_choice' names custom tool '" + conv.named_tool +
                                  "', and no custom tool has that name");
  if (auto e = read_reasoning_and_text(body, conv, req)) return e;
  req.echo = {
      {"instructions", req.instructions.empty() ? json(nullptr) : json(req.instructions)},
      {"max_output_tokens",
       given(body, "max_output_tokens") ? body["max_output_tokens"] : json(nullptr)},
      {"parallel_tool_calls", conv.parallel_tool_calls.value_or(true)},
      {"previous_response_id",
       req.previous_response_id.empty() ? json(nullptr) : json(req.previous_response_id)},
      {"reasoning",
       {{"effort", conv.reasoning_effort},
        {"summary", given(body, "reasoning") && given(body["reasoning"], "summary")
                        ? body["reasoning"]["summary"]
                        : json(nullptr)}}},
      {"store", req.store},
      {"temperature", job.request.sampling.temperature},
      {"text",
       {{"format", conv.response_format.is_null()
                       ? json{{"type", "text"}}
                       : json(given(body, "text") ? body["text"]["format"] : json(nullptr))}}},
      {"tool_choice", given(body, "tool_choice") ? body["tool_choice"] : json("auto")},
      {"tools", tools_kept(body)},
      {"top_p", job.request.sampling.top_p},
      {"truncation", "disabled"},
      {"metadata", given(body, "metadata") ? body["metadata"] : json::object()}};
  auto e = build_chat_job(conv, facts, job);
  if (e && e->code == "context_length_exceeded") { // in this API's words
    const int64_t prompt = int64_t(job.request.prompt.size());
    if (prompt >= facts.context)
      e->param = "input";
    else
      *e = ApiError{400,
                    "the input has " + std::to_string(prompt) +
                        " tokens and max_output_tokens asks for " +
                        std::to_string(job.max_tokens_asked) + " more; the context holds " +
                        std::to_string(facts.context),
                    "max_output_tokens", "max_output_tokens_too_large"};
  }
  return e;
}

json OutputBuilder::event(json e) {
  e["sequence_number"] = sequence_++;
  return e;
}

void OutputBuilder::open(Open kind, std::vector<json> &out) {
  if (open_ == kind) return;
  for (json &e : close()) out.push_back(std::move(e));
  open_ = kind;
  const size_t index = output_.size();
  json item;
  if (kind == Open::Reasoning)
    item = {{"id", "rs_" + id_ + "_" + std::to_string(index)},
            {"type", "reasoning"},
            {"summary", json::array()},
            {"content", json::array({{{"type", "reasoning_text"}, {"text", ""}}})}};
  else
    item = {{"id", "msg_" + id_ + "_" + std::to_string(index)},
            {"type", "message"},
            {"status", "in_progress"},
            {"role", "assistant"},
            {"content", json::array()}};
  output_.push_back(item);
  out.push_back(
      event({{"type", "response.output_item.added"}, {"output_index", index}, {"item", item}}));
  if (kind == Open::Message) {
    const json part = {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}};
    output_[index]["content"].push_back(part);
    out.push_back(event({{"type", "response.content_part.added"},
                         {"item_id", item["id"]},
                         {"output_index", index},
                         {"content_index", 0},
                         {"part", part}}));
  }
}

std::vector<json> OutputBuilder::close() {
  std::vector<json> out;
  if (open_ == Open::None) return out;
  const size_t index = output_.size() - 1;
  json &item = output_[index];
  if (open_ == Open::Reasoning) {
    const std::string text = item["content"][0]["text"];
    out.push_back(event({{"type", "response.reasoning_text.done"},
                         {"item_id", item["id"]},
                         {"output_index", index},
                         {"content_index", 0},
                         {"text", text}}));
    // No summarizer here: the summary asked for is the reasoning itself, streamed as one part
    // (the events clients show reasoning summaries from).
    if (summary_) {
      const json part = {{"type", "summary_text"}, {"text", text}};
      const json at = {{"item_id", item["id"]}, {"output_index", index}, {"summary_index", 0}};
      auto with = [&](json e) {
        for (const auto &[k, v] : at.items()) e[k] = v;
        return event(std::move(e));
      };
      out.push_back(with({{"type", "response.reasoning_summary_part.added"},
                          {"part", {{"type", "summary_text"}, {"text", ""}}}}));
      out.push_back(with({{"type", "response.reasoning_summary_text.delta"}, {"delta", text}}));
      out.push_back(with({{"type", "response.reasoning_summary_text.done"}, {"text", text}}));
      out.push_back(with({{"type", "response.reasoning_summary_part.done"}, {"part", part}}));
      item["summary"] = json::array({part});
    }
    if (encrypted_) item["encrypted_content"] = encrypt_reasoning(text);
  } else {
    const json &part = item["content"][0];
    out.push_back(event({{"type", "response.output_text.done"},
                         {"item_id", item["id"]},
                         {"output_index", index},
                         {"content_index", 0},
                         {"text", part["text"]},
                         {"logprobs", json::array()}}));
    out.push_back(event({{"type", "response.content_part.done"},
                         {"item_id", item["id"]},
                         {"output_index", index},
                         {"content_index", 0},
                         {"part", part}}));
    item["status"] = "completed";
  }
  out.push_back(
      event({{"type", "response.output_item.done"}, {"output_index", index}, {"item", item}}));
  open_ = Open::None;
  return out;
}

std::vector<json> OutputBuilder::add(const ChoiceOutput::Delta &delta) {
  std::vector<json> out;
  if (!delta.reasoning.empty()) {
    open(Open::Reasoning, out);
    json &item = output_.back();
    item["content"][0]["text"] = item["content"][0]["text"].get<std::string>() + delta.reasoning;
    out.push_back(event({{"type", "response.reasoning_text.delta"},
                         {"item_id", item["id"]},
                         {"output_index", output_.size() - 1},
                         {"content_index", 0},
                         {"delta", delta.reasoning}}));
  }
  if (!delta.content.empty()) {
    open(Open::Message, out);
    json &item = output_.back();
    item["content"][0]["text"] = item["content"][0]["text"].get<std::string>() + delta.content;
    out.push_back(event({{"type", "response.output_text.delta"},
                         {"item_id", item["id"]},
                         {"output_index", output_.size() - 1},
                         {"content_index", 0},
                         {"delta", delta.content},
                         {"logprobs", json::array()}}));
  }
  for (const json &call : delta.tool_calls) {
    for (json &e : close()) out.push_back(std::move(e));
    const size_t index = output_.size();
    const std::string full = call["function"]["name"], args = call["function"]["arguments"];
    const json shape = tool_shapes_.contains(full) ? tool_shapes_[full] : json::object();
    if (shape.value("custom", false)) {
      for (json &e : custom_call(index, call)) out.push_back(std::move(e));
      continue;
    }
    json item = {{"id", "fc_" + id_ + "_" + std::to_string(index)},
                 {"type", "function_call"},
                 {"status", "in_progress"},
                 {"call_id", "call_" + id_ + "_" + std::to_string(calls_++)},
                 {"name", full},
                 {"arguments", ""}};
    if (shape.contains("namespace")) {
      item["name"] = shape["name"];
      item["namespace"] = shape["namespace"];
    }
    for (json &e :
         finished_call(index, std::move(item), "function_call_arguments", "arguments", args))
      out.push_back(std::move(e));
  }
  return out;
}

// A custom tool's call: its input is the one argument read_custom_tool gave it (anything else the
// model wrote, a call that is not strict, comes as the arguments' JSON).
std::vector<json> OutputBuilder::custom_call(size_t index, const json &call) {
  const std::string args = call["function"]["arguments"];
  json parsed = json::parse(args, nullptr, false);
  const std::string input = parsed.is_object() && parsed.size() == 1 && parsed.contains("input") &&
                                    parsed["input"].is_string()
                                ? parsed["input"].get<std::string>()
                                : args;
  json item = {{"id", "ctc_" + id_ + "_" + std::to_string(index)},
               {"type", "custom_tool_call"},
               {"status", "in_progress"},
               {"call_id", "call_" + id_ + "_" + std::to_string(calls_++)},
               {"name", call["function"]["name"]},
               {"input", ""}};
  return finished_call(index, std::move(item), "custom_tool_call_input", "input", input);
}

// A call item whose text is known whole: added, its text as one delta, done, the item done.
std::vector<json> OutputBuilder::finished_call(size_t index, json item, const std::string &events,
                                               const char *field, const std::string &text) {
  std::vector<json> out;
  out.push_back(
      event({{"type", "response.output_item.added"}, {"output_index", index}, {"item", item}}));
  out.push_back(event({{"type", "response." + events + ".delta"},
                       {"item_id", item["id"]},
                       {"output_index", index},
                       {"delta", text}}));
  json done = {{"type", "response." + events + ".done"},
               {"item_id", item["id"]},
               {"output_index", index},
               {field, text}};
  if (item["type"] == "function_call") done["name"] = item["name"]; // as OpenAI's event has it
  out.push_back(event(std::move(done)));
  item[field] = text;
  item["status"] = "completed";
  output_.push_back(item);
  out.push_back(
      event({{"type", "response.output_item.done"}, {"output_index", index}, {"item", item}}));
  return out;
}

json usage(size_t prompt_tokens, int cached_tokens, int output_tokens, int reasoning_tokens) {
  return {{"input_tokens", prompt_tokens},
          {"input_tokens_details", {{"cached_tokens", cached_tokens}}},
          {"output_tokens", output_tokens},
          {"output_tokens_details", {{"reasoning_tokens", reasoning_tokens}}},
          {"total_tokens", prompt_tokens + size_t(output_tokens)}};
}

json response_object(const std::string &id, int64_t created, const std::string &model,
                     const Request &req, const json &output, const Outcome *outcome) {
  json r = {{"id", id},
            {"object", "response"},
            {"created_at", created},
            {"status", outcome ? outcome->status : "in_progress"},
            {"error", nullptr},
            {"incomplete_details", nullptr},
            {"model", model},
            {"output", output}};
  for (const auto &[key, value] : req.echo.items()) r[key] = value;
  r["usage"] = outcome ? outcome->usage : json(nullptr);
  if (outcome && outcome->status == "incomplete")
    r["incomplete_details"] = {{"reason", outcome->incomplete}};
  if (outcome && outcome->status == "failed")
    r["error"] = {{"code", outcome->incomplete.empty() ? "server_error" : outcome->incomplete},
                  {"message", outcome->error}};
  return r;
}

} // namespace offgraph::server::responses
