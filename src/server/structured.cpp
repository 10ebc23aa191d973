#include "server/structured.h"

#include "sample/gbnf.h"
#include "sample/json_schema.h"
#include "sample/lark.h"
#include "server/api.h"
#include "text/atem/atem_grammar.h"
#include "text/chat/chat_format.h"

#include <cstdio>

namespace offgraph::server {

std::shared_ptr<const sample::CompiledGrammar> GrammarCache::find(const std::string &key) {
  std::lock_guard lock(mutex_);
  auto it = index_.find(key);
  if (it == index_.end()) return nullptr;
  order_.splice(order_.begin(), order_, it->second);
  return it->second->second;
}

void GrammarCache::put(const std::string &key,
                       std::shared_ptr<const sample::CompiledGrammar> grammar) {
  std::lock_guard lock(mutex_);
  if (auto it = index_.find(key); it != index_.end()) {
    it->second->second = std::move(grammar);
    order_.splice(order_.begin(), order_, it->second);
    return;
  }
  order_.emplace_front(key, std::move(grammar));
  index_[key] = order_.begin();
  while (order_.size() > capacity_) {
    index_.erase(order_.back().first);
    order_.pop_back();
  }
}

size_t GrammarCache::size() const {
  std::lock_guard lock(mutex_);
  return order_.size();
}

namespace {

using Content = text::TurnSpec::Content;

ApiError bad(const std::string &param, const std::string &message,
             const std::string &code = "invalid_value") {
  return ApiError{400, message, param, code};
}

bool given(const json &body, const char *key) { return body.contains(key) && !body[key].is_null(); }

std::optional<ApiError> read_response_format(const json &rf, text::TurnSpec &spec) {
  if (rf.is_null()) return std::nullopt;
  if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string())
    return bad("response_format", "'response_format' must be an object with a 'type'",
               "invalid_type");
  const std::string type = rf["type"];
  if (type == "text") return std::nullopt;
  if (type == "json_object") {
    spec.content = Content::kJsonObject;
    return std::nullopt;
  }
  if (type != "json_schema")
    return bad("response_format",
               "'response_format' type '" + type +
                   "' is not supported (text, json_object, "
                   "json_schema)",
               "unsupported");
  if (!given(rf, "json_schema") || !rf["json_schema"].is_object())
    return bad("response_format.json_schema",
               "'response_format' json_schema needs a 'json_schema' object", "invalid_type");
  const json &js = rf["json_schema"];
  for (const auto &[key, value] : js.items()) {
    if (key == "name" || key == "schema" || key == "strict") continue;
    if (key == "description")
      return bad("response_format.json_schema.description",
                 "'response_format.json_schema.description' is not supported: the model is not "
                 "shown it (describe the format in a message)",
                 "unsupported");
    return bad("response_format.json_schema." + key,
               "'response_format.json_schema." + key + "' is not a field of json_schema");
  }
  // OpenAI's rule for the name: letters, digits, '_' and '-', at most 64.
  if (!js.contains("name") || !js["name"].is_string() || js["name"].get<std::string>().empty() ||
      js["name"].get<std::string>().size() > 64 ||
      js["name"].get<std::string>().find_first_not_of(
          "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") != std::string::npos)
    return bad("response_format.json_schema.name",
               "'response_format.json_schema.name' must be 1 to 64 letters, digits, '_' or '-'");
  if (js.contains("strict") && !js["strict"].is_null() && !js["strict"].is_boolean())
    return bad("response_format.json_schema.strict",
               "'response_format.json_schema.strict' must be a boolean", "invalid_type");
  spec.schema_strict = js.contains("strict") && js["strict"] == true;
  // Without a schema, any JSON value.
  spec.schema = js.contains("schema") && !js["schema"].is_null() ? js["schema"] : json::object();
  if (!spec.schema.is_object() && !spec.schema.is_boolean())
    return bad("response_format.json_schema.schema",
               "'response_format.json_schema.schema' must be a JSON Schema object",
               "invalid_json_schema");
  spec.content = Content::kJsonSchema;
  return std::nullopt;
}

std::optional<ApiError> read_grammar(const json &grammar, const ModelFacts &facts,
                                     text::TurnSpec &spec) {
  if (grammar.is_null()) return std::nullopt;
  if (!grammar.is_string()) return bad("grammar", "'grammar' must be GBNF text", "invalid_type");
  if (spec.content != Content::kText)
    return bad("grammar", "'grammar' and 'response_format' cannot both constrain the answer");
  const text::Tokenizer &t = *facts.tokenizer;
  sample::GbnfOptions options;
  options.special_token = [&t](std::string_view ref) -> std::optional<int32_t> {
    // Only control tokens: a grammar's token element matches a special token, never text.
    if (auto id = sample::gbnf_token_id(ref); id && *id < t.n_vocab() && t.is_control(*id))
      return id;
    if (auto id = t.find_token(ref); id && t.is_control(*id)) return id;
    return std::nullopt;
  };
  auto g = sample::parse_gbnf(grammar.get<std::string>(), options);
  if (!g.ok()) return bad("grammar", "'grammar': " + g.message(), "invalid_grammar");
  spec.grammar = std::move(g).value();
  spec.content = Content::kGrammar;
  return std::nullopt;
}

std::optional<ApiError> read_tools(const json &tools, const Conversation &conv,
                                   text::TurnSpec &spec, bool &strict_any) {
  for (size_t i = 0; i < tools.size(); ++i) {
    const json &fn = tools[i]["function"];
    const std::string name = fn["name"];
    const bool strict_given = fn.contains("strict") && !fn["strict"].is_null();
    if (strict_given && !fn["strict"].is_boolean())
      return bad("tools", "tools[" + std::to_string(i) + "].function.strict must be a boolean",
                 "invalid_type");
    const bool strict = strict_given && fn["strict"] == true;
    strict_any |= strict;
    if (conv.tool_choice == "named" && name != conv.named_tool) continue;
    spec.tools.push_back({name, fn["parameters"], strict, std::nullopt});
    // A custom tool's input grammar binds every call (read once the cache misses, below).
    strict_any |= conv.tool_grammars.contains(name);
  }
  return std::nullopt;
}

// The custom tools' input grammars (Conversation::tool_grammars): always enforced, as the format
// promises; plain text too, so that the input comes back whole (no marker of the call inside it).
std::optional<ApiError> read_tool_grammars(const Conversation &conv, text::TurnSpec &spec) {
  for (auto &tool : spec.tools) {
    if (!conv.tool_grammars.contains(tool.name)) continue;
    const json &g = conv.tool_grammars[tool.name];
    const std::string syntax = g["syntax"], definition = g.value("definition", "");
    Result<sample::Grammar> grammar = Status::error("");
    if (syntax == "lark") {
      grammar = sample::parse_lark(definition);
    } else if (syntax == "regex") {
      grammar = sample::regex_grammar(definition, "regex");
    } else {
      sample::GrammarBuilder b;
      auto any = b.repeat("text", {b.any_code_point()}, 0, sample::kUnbounded);
      const uint32_t root = b.rule("input", {{*any}}).value;
      grammar = std::move(b).finish(root);
    }
    if (!grammar.ok())
      return bad("tools",
                 "the " + syntax + " grammar of tool '" + tool.name + "': " + grammar.message(),
                 "invalid_grammar");
    tool.raw_input = std::move(grammar).value();
  }
  return std::nullopt;
}

// Whether a constrained turn may reason first. Muse Glimmer has no "off" (MUSE_GLIMMER.md
// section 10): under a grammar, "none" can be enforced. Gemma 4's prompt closes the thought
// channel itself when thinking is off (enable_thinking: none and minimal), so the turn has none.
bool reasoning_allowed(text::ChatFormat format, const std::string &effort) {
  if (format == text::ChatFormat::kGemma4) return effort != "none" && effort != "minimal";
  return effort != "none";
}

} // namespace

std::thread start_grammar_warm_up(const ModelFacts &facts, const std::atomic<bool> &cancel) {
  std::optional<Result<text::AtemWarmUp>> turn;
  if (facts.format == text::ChatFormat::kAtem) turn = text::atem_warm_up_turn(*facts.tokenizer);
  const bool chat_json = facts.format != text::ChatFormat::kPlain;
  return std::thread([vocabulary = facts.vocabulary, turn = std::move(turn), chat_json, &cancel] {
    auto report = [](const Status &s) {
      if (!s.ok()) std::fprintf(stderr, "offgraph: grammar warm-up: %s\n", s.message().c_str());
    };
    // Completions (and models without a chat format) write plain JSON; chat formats escape '<'.
    report(sample::warm_json_tables(vocabulary, {}, &cancel));
    if (!chat_json) return;
    report(sample::warm_json_tables(vocabulary, {.escape_lt = true}, &cancel));
    if (!turn) return;
    if (!turn->ok()) return report(turn->status());
    auto compiled = sample::compile_grammar((*turn)->grammar, vocabulary, {});
    report(compiled.ok() ? sample::warm_up(*compiled, (*turn)->symbols, &cancel)
                         : compiled.status());
  });
}

std::optional<ApiError> parse_structured(const Conversation &conv, bool chat,
                                         const ModelFacts &facts, Job &job) {
  text::TurnSpec spec;
  if (auto e = read_response_format(conv.response_format, spec)) {
    if (e->param.rfind("response_format", 0) == 0) // in the API's own name
      e->param = conv.format_field + e->param.substr(std::string("response_format").size());
    return e;
  }
  if (auto e = read_grammar(conv.grammar, facts, spec)) return e;
  bool strict_any = false;
  const json &tools = job.tools;
  if (chat)
    if (auto e = read_tools(tools, conv, spec, strict_any)) return e;
  const bool forced = chat && (conv.tool_choice == "required" || conv.tool_choice == "named");
  // One call at most: enforced by the grammar, so it makes one.
  const bool single = chat && !tools.empty() && conv.parallel_tool_calls == false;
  spec.parallel_calls = !single;
  if (spec.content == Content::kText && !strict_any && !forced && !single) return std::nullopt;
  if (!facts.vocabulary) return ApiError{500, "no grammar vocabulary", "", "internal_error"};

  const text::ChatFormat format = chat ? facts.format : text::ChatFormat::kPlain;
  const bool formatted = format != text::ChatFormat::kPlain;
  if (!formatted && (strict_any || forced || single))
    return bad(forced   ? "tool_choice"
               : single ? "parallel_tool_calls"
                        : "tools",
               forced   ? "'tool_choice' required or a function needs a model whose chat template "
                          "has a known tool-call format"
               : single ? "'parallel_tool_calls': false needs a model whose chat template has a "
                          "known tool-call format"
                        : "strict and custom tools need a model whose chat template has a known "
                          "tool-call format",
               "unsupported");
  // The key is everything the grammar is built from.
  json key = {{"format", text::chat_format_name(format)},
              {"response_format", conv.response_format},
              {"grammar", conv.grammar},
              {"stop", job.request.stop_tokens}};
  if (formatted) {
    key["tools"] = json::array();
    for (const auto &t : spec.tools)
      key["tools"].push_back(
          {t.name, t.strict, t.strict ? t.parameters : json(),
           conv.tool_grammars.contains(t.name) ? conv.tool_grammars[t.name] : json()});
    key["answer"] = !forced;
    key["parallel"] = spec.parallel_calls;
    key["reasoning"] = reasoning_allowed(format, conv.reasoning_effort);
  }
  const std::string k = key.dump();
  if (auto hit = facts.grammars ? facts.grammars->find(k) : nullptr) {
    job.request.grammar = std::move(hit);
    return std::nullopt;
  }
  if (formatted)
    if (auto e = read_tool_grammars(conv, spec)) return e;
  spec.answer = !forced;
  spec.reasoning = reasoning_allowed(format, conv.reasoning_effort);
  auto grammar = text::turn_grammar(format, *facts.tokenizer, spec);
  if (!grammar.ok()) {
    const std::string &m = grammar.message();
    if (spec.content == Content::kGrammar && m.rfind("tools", 0) != 0)
      return bad("grammar", "'grammar': " + m, "invalid_grammar");
    const std::string param = m.rfind("tools", 0) == 0         ? "tools"
                              : m.rfind("tool_choice", 0) == 0 ? "tool_choice"
                                                               : "response_format";
    return bad(param, m, param == "tool_choice" ? "invalid_value" : "invalid_json_schema");
  }
  auto compiled = sample::compile_grammar(std::move(grammar).value(), facts.vocabulary,
                                          job.request.stop_tokens);
  if (!compiled.ok()) return bad("", compiled.message(), "invalid_grammar");
  if (facts.grammars) facts.grammars->put(k, *compiled);
  job.request.grammar = std::move(compiled).value();
  return std::nullopt;
}

} // namespace offgraph::server
