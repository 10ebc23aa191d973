#include "server/api.h"

#include "sample/sampler.h"
#include "server/image_parts.h"
#include "text/chat/chat_prompt.h"
#include "text/tokenizer/unicode.h"

#include <cmath>
#include <random>
#include <tuple>

namespace offgraph::server {

json error_body(const ApiError &e) {
  return {{"error",
           {{"message", e.message},
            {"type", e.type},
            {"param", e.param.empty() ? json(nullptr) : json(e.param)},
            {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
}

ApiError api_error(const Status &s) {
  switch (s.code()) {
  case StatusCode::kNotFound:
    return {404, s.message(), "", "not_found"};
  case StatusCode::kResourceExhausted:
    return {429, s.message(), "", "rate_limit_exceeded", "rate_limit_error"};
  case StatusCode::kUnavailable:
    return {503, s.message(), "", "unavailable", "unavailable_error"};
  case StatusCode::kUnimplemented:
    return {400, s.message(), "", "unsupported"};
  case StatusCode::kInternal:
    return {500, s.message(), "", "internal_error", "server_error"};
  case StatusCode::kOk:
  case StatusCode::kInvalidArgument:
    break;
  }
  return {400, s.message(), "", "invalid_value"};
}

namespace {

ApiError bad(const std::string &param, const std::string &message,
             const std::string &code = "invalid_value") {
  return ApiError{400, message, param, code};
}

// An optional number within [lo, hi]; integers refuse fractions.
template <class T>
std::optional<ApiError> read_number(const json &body, const char *key, T &out, double lo,
                                    double hi) {
  if (!body.contains(key) || body[key].is_null()) return std::nullopt;
  const json &v = body[key];
  if (!v.is_number())
    return bad(key, std::string("'") + key + "' must be a number, not " + v.type_name(),
               "invalid_type");
  const double d = v.get<double>();
  if constexpr (std::is_integral_v<T>)
    if (!v.is_number_integer() && d != std::floor(d))
      return bad(key, std::string("'") + key + "' must be an integer", "invalid_type");
  if (!(d >= lo && d <= hi)) {
    auto num = [](double x) {
      std::string s = std::to_string(x);
      s.erase(s.find_last_not_of('0') + 1);
      if (!s.empty() && s.back() == '.') s.pop_back();
      return s;
    };
    return bad(key, std::string("'") + key + "' must be between " + num(lo) + " and " + num(hi) +
                        ", not " + v.dump());
  }
  out = static_cast<T>(d);
  return std::nullopt;
}

std::optional<ApiError> read_bool(const json &body, const char *key, bool &out) {
  if (!body.contains(key) || body[key].is_null()) return std::nullopt;
  if (!body[key].is_boolean())
    return bad(key, std::string("'") + key + "' must be true or false", "invalid_type");
  out = body[key].get<bool>();
  return std::nullopt;
}

constexpr size_t kMaxStopStrings = 16;
constexpr size_t kMaxStopBytes = 1024;
constexpr size_t kMaxLogitBias = 1024;

// Log-probabilities. Chat: `logprobs` (bool) and `top_logprobs` (0-20, only with logprobs).
// Completions: `logprobs` (0-20: how many likeliest tokens beside each chosen one) and `echo`.
std::optional<ApiError> parse_logprobs(const json &body, bool chat, Job &job) {
  engine::Request &r = job.request;
  const int32_t most = sample::kMaxTopLogprobs;
  if (chat) {
    if (body.contains("echo") && body["echo"] == true)
      return bad("echo", "'echo' is a /v1/completions field", "unsupported");
    bool wanted = false;
    if (auto e = read_bool(body, "logprobs", wanted)) return e;
    int32_t top = -1;
    if (auto e = read_number(body, "top_logprobs", top, 0, most)) return e;
    if (top >= 0 && !wanted) return bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    r.top_logprobs = wanted ? std::max(top, 0) : -1;
    return std::nullopt;
  }
  if (body.contains("top_logprobs") && !body["top_logprobs"].is_null())
    return bad("top_logprobs",
               "'top_logprobs' is a chat field; /v1/completions takes 'logprobs': N",
               "unsupported");
  if (auto e = read_number(body, "logprobs", r.top_logprobs, 0, most)) return e;
  if (auto e = read_bool(body, "echo", job.echo)) return e;
  r.prompt_logprobs = job.echo && r.top_logprobs >= 0;
  if (job.echo && job.stream)
    return bad("echo", "'echo' with 'stream' is not supported; ask without streaming",
               "unsupported");
  return std::nullopt;
}

} // namespace

// Sampling fields and limits shared by both routes. `max_tokens` comes back -1 when not given;
// 0 only where `zero_ok` (an echoed prompt scored without an answer).
std::optional<ApiError> parse_sampling(const json &body, const ModelFacts &facts, Job &job,
                                       int32_t &max_tokens, bool zero_ok) {
  sample::SamplingParams p = facts.sampling;
  max_tokens = -1;
  const double least = zero_ok ? 0 : 1;
  if (auto e = read_number(body, "max_tokens", max_tokens, least, facts.max_tokens_cap)) return e;
  if (auto e = read_number(body, "max_completion_tokens", max_tokens, least, facts.max_tokens_cap))
    return e;
  if (auto e = read_number(body, "temperature", p.temperature, 0, 2)) return e;
  if (auto e = read_number(body, "top_p", p.top_p, 0, 1)) return e;
  if (auto e = read_number(body, "top_k", p.top_k, 0, facts.n_vocab)) return e;
  if (auto e = read_number(body, "min_p", p.min_p, 0, 1)) return e;
  if (auto e = read_number(body, "presence_penalty", p.presence_penalty, -2, 2)) return e;
  if (auto e = read_number(body, "frequency_penalty", p.frequency_penalty, -2, 2)) return e;
  if (auto e = read_number(body, "repetition_penalty", p.repetition_penalty, 0.01, 10)) return e;
  int64_t seed = -1;
  if (auto e = read_number(body, "seed", seed, -9.2e18, 9.2e18)) return e;
  p.seed = seed >= 0 ? uint64_t(seed) : std::random_device{}();
  if (auto e = read_number(body, "n", job.request.n, 1, 16)) return e;
  if (body.contains("stream_options") && !body["stream_options"].is_null()) {
    const json &so = body["stream_options"];
    if (!so.is_object()) return bad("stream_options", "'stream_options' must be an object");
    if (auto e = read_bool(so, "include_usage", job.include_usage)) return e;
  }
  if (body.contains("stop") && !body["stop"].is_null()) {
    const json &st = body["stop"];
    std::vector<std::string> list;
    if (st.is_string())
      list.push_back(st.get<std::string>());
    else if (st.is_array())
      for (const auto &x : st) {
        if (!x.is_string())
          return bad("stop", "'stop' must be a string or a list of strings", "invalid_type");
        list.push_back(x.get<std::string>());
      }
    else
      return bad("stop", "'stop' must be a string or a list of strings", "invalid_type");
    if (list.size() > kMaxStopStrings)
      return bad("stop", "at most " + std::to_string(kMaxStopStrings) + " stop strings, not " +
                             std::to_string(list.size()));
    for (const std::string &x : list) {
      if (x.empty()) return bad("stop", "a stop string is empty");
      if (x.size() > kMaxStopBytes)
        return bad("stop",
                   "a stop string is longer than " + std::to_string(kMaxStopBytes) + " bytes");
      if (!text::is_valid_utf8(x)) return bad("stop", "a stop string is not valid UTF-8");
    }
    job.stop_strings = std::move(list);
  }
  if (body.contains("logit_bias") && !body["logit_bias"].is_null()) {
    const json &lb = body["logit_bias"];
    if (!lb.is_object())
      return bad("logit_bias", "'logit_bias' must map token ids to numbers", "invalid_type");
    if (lb.size() > kMaxLogitBias)
      return bad("logit_bias", "at most " + std::to_string(kMaxLogitBias) + " logit_bias entries");
    for (auto it = lb.begin(); it != lb.end(); ++it) {
      const std::string &k = it.key();
      size_t used = 0;
      long long id = -1;
      try {
        id = std::stoll(k, &used);
      } catch (...) {
      }
      if (used != k.size() || id < 0 || id >= facts.n_vocab)
        return bad("logit_bias", "'logit_bias' key '" + k + "' is not a token id below " +
                                     std::to_string(facts.n_vocab));
      if (!it.value().is_number() || !(std::abs(it.value().get<double>()) <= 100))
        return bad("logit_bias", "'logit_bias' values must be numbers between -100 and 100");
      p.logit_bias[int32_t(id)] = it.value().get<float>();
    }
  }
  if (Status v = sample::validate(p, facts.n_vocab); !v.ok()) return bad("", v.message());
  job.request.sampling = p;
  job.request.stop_tokens = facts.tokenizer->end_of_generation_ids();
  return std::nullopt;
}

namespace {

// llama-server's per-request draft fields (speculative.n_max, speculative.n_min), spelled as it
// spells them, and offgraph's speculative.type and speculative.adaptive beside them: any of them
// given makes the request's own speculation, the server's with these changes.
std::optional<ApiError> parse_speculation(const json &body, const ModelFacts &facts, Job &job) {
  auto given = [&](const char *key) { return body.contains(key) && !body[key].is_null(); };
  if (given("speculative.p_min"))
    return bad("speculative.p_min", "'speculative.p_min' is not supported", "unsupported");
  engine::SpeculationOptions s = facts.speculation;
  bool any = false;
  if (given("speculative.type")) {
    const json &t = body["speculative.type"];
    if (!t.is_string())
      return bad("speculative.type", "'speculative.type' must be a string", "invalid_type");
    auto source = engine::parse_draft_source(t.get<std::string>());
    if (!source.ok()) return bad("speculative.type", "'speculative.type': " + source.message());
    s.source = *source, any = true;
    if (s.source == engine::DraftSource::Draft && !facts.draft_model)
      return bad("speculative.type", "'speculative.type' 'draft': no draft model is loaded "
                                     "(offgraph serve --spec-draft-model FILE)");
  }
  for (const auto &[key, out, lo] : {std::tuple{"speculative.n_max", &s.n_max, 1},
                                     std::tuple{"speculative.n_min", &s.n_min, 0}}) {
    if (!given(key)) continue;
    if (auto e = read_number(body, key, *out, lo, engine::kMaxDraftTokens)) return e;
    any = true;
  }
  for (const auto &[key, out] :
       {std::pair{"speculative.adaptive", &s.adaptive}, std::pair{"speculative.pq", &s.pq}}) {
    if (!given(key)) continue;
    if (auto e = read_bool(body, key, *out)) return e;
    any = true;
  }
  if (!any) return std::nullopt;
  if (s.n_min > s.n_max) {
    const char *key = given("speculative.n_min") ? "speculative.n_min" : "speculative.n_max";
    return bad(key, std::string("'") + key + "': speculative.n_min (" + std::to_string(s.n_min) +
                        ") must not exceed speculative.n_max (" + std::to_string(s.n_max) + ")");
  }
  // A prediction is drafted from by n-gram drafts: the type unless one is named (and refused).
  const bool predicted = body.contains("prediction") && !body["prediction"].is_null();
  if (predicted && !given("speculative.type")) s.source = engine::DraftSource::Ngram;
  // Lengths without drafts would be ignored: refused.
  if (s.source == engine::DraftSource::None)
    for (const char *key :
         {"speculative.n_max", "speculative.n_min", "speculative.adaptive", "speculative.pq"})
      if (given(key))
        return bad(key, std::string("'") + key +
                            "' has no effect without drafts: set speculative.type (the server's "
                            "is 'none')");
  if (s.pq && s.source != engine::DraftSource::Draft && given("speculative.pq"))
    return bad("speculative.pq", "'speculative.pq' (speculative sampling) needs a draft model's q: "
                                 "set speculative.type to 'draft'");
  if (s.source != engine::DraftSource::Ngram && predicted)
    return bad("speculative.type", std::string("'prediction' is drafted from by n-gram drafts; "
                                               "speculative.type '") +
                                       engine::draft_source_name(s.source) +
                                       "' refuses it (leave speculative.type out, or 'ngram')");
  job.request.speculation = s; // valid: each field checked above, the server's options at start
  return std::nullopt;
}

// OpenAI's Predicted Outputs: {"type": "content", "content": text or [{"type": "text", "text"}]}.
// The text, tokenized as plain text, is what n-gram drafts come from besides the context
// (engine::Request::prediction): it changes how fast the answer comes, never what it is.
std::optional<ApiError> parse_prediction(const json &body, const ModelFacts &facts, Job &job) {
  if (!body.contains("prediction") || body["prediction"].is_null()) return std::nullopt;
  const json &p = body["prediction"];
  if (!p.is_object() || !p.contains("type") || p["type"] != "content")
    return bad("prediction", "'prediction' must be {\"type\": \"content\", \"content\": ...}",
               "invalid_type");
  for (auto it = p.begin(); it != p.end(); ++it)
    if (it.key() != "type" && it.key() != "content")
      return bad("prediction", "'prediction." + it.key() + "' is not supported", "unsupported");
  std::string text;
  const json &c = p.contains("content") ? p["content"] : json();
  if (c.is_string()) {
    text = c.get<std::string>();
  } else if (c.is_array()) {
    for (const json &part : c) {
      if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
          !part["text"].is_string())
        return bad("prediction",
                   "'prediction.content' parts must be {\"type\": \"text\", "
                   "\"text\": string}",
                   "invalid_type");
      text += part["text"].get<std::string>();
    }
  } else {
    return bad("prediction", "'prediction.content' must be a string or a list of text parts",
               "invalid_type");
  }
  if (!text::is_valid_utf8(text))
    return bad("prediction", "'prediction.content' is not valid UTF-8");
  job.request.prediction = facts.tokenizer->encode(text, false, false);
  job.prediction = true;
  if (job.request.prediction.size() > size_t(facts.context))
    return bad("prediction", "'prediction.content' has " +
                                 std::to_string(job.request.prediction.size()) +
                                 " tokens; at most the context, " + std::to_string(facts.context));
  return std::nullopt;
}

} // namespace

std::optional<ApiError> check_model(const json &body, const ModelFacts &facts) {
  if (!body.contains("model") || body["model"].is_null()) return std::nullopt;
  if (!body["model"].is_string()) return bad("model", "'model' must be a string", "invalid_type");
  const std::string name = body["model"].get<std::string>();
  for (const std::string &n : facts.model_names)
    if (n == name ||
        (!n.empty() && n.back() == '*' && name.compare(0, n.size() - 1, n, 0, n.size() - 1) == 0))
      return std::nullopt;
  std::string known;
  for (const std::string &n : facts.model_names) known += (known.empty() ? "'" : ", '") + n + "'";
  return ApiError{404, "the model '" + name + "' does not exist; this server serves " + known,
                  "model", "model_not_found"};
}

namespace {

// Chat Completions' body into the wire-neutral conversation: the fields are the template's own
// shapes already, so this reads where they are and parses tool_choice's forms.
std::optional<ApiError> openai_conversation(const json &body, Conversation &conv) {
  if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty())
    return bad("messages", "'messages' must be a non-empty list");
  conv.messages = body["messages"];
  if (body.contains("tools") && !body["tools"].is_null()) {
    if (!body["tools"].is_array()) return bad("tools", "'tools' must be a list", "invalid_type");
    conv.tools = body["tools"];
  }
  if (body.contains("reasoning_effort") && !body["reasoning_effort"].is_null()) {
    if (!body["reasoning_effort"].is_string())
      return bad("reasoning_effort",
                 "'reasoning_effort' must be none, minimal, low, medium, high or xhigh");
    conv.reasoning_effort = body["reasoning_effort"];
  }
  if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
    const json &tc = body["tool_choice"];
    if (tc.is_string()) {
      conv.tool_choice = tc.get<std::string>();
      if (conv.tool_choice != "auto" && conv.tool_choice != "none" &&
          conv.tool_choice != "required")
        return bad("tool_choice", "'tool_choice' must be auto, none, required or a function");
    } else if (tc.is_object() && tc.contains("function") && tc["function"].is_object() &&
               tc["function"].contains("name") && tc["function"]["name"].is_string()) {
      conv.tool_choice = "named";
      conv.named_tool = tc["function"]["name"];
    } else {
      return bad("tool_choice", "'tool_choice' must be auto, none, required or "
                                "{\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
  }
  if (body.contains("parallel_tool_calls") && !body["parallel_tool_calls"].is_null()) {
    if (!body["parallel_tool_calls"].is_boolean())
      return bad("parallel_tool_calls", "'parallel_tool_calls' must be true or false",
                 "invalid_type");
    conv.parallel_tool_calls = body["parallel_tool_calls"].get<bool>();
  }
  if (body.contains("response_format")) conv.response_format = body["response_format"];
  if (body.contains("grammar")) conv.grammar = body["grammar"];
  return std::nullopt;
}

} // namespace

// The conversation's messages, tools and reasoning effort into the template's context; `tools_out`
// the tools the answer may call (none with tool_choice none). Image parts' bytes go to `job` (null:
// only checked, as /apply-template renders them).
static std::optional<ApiError> chat_context(const Conversation &conv, const ModelFacts &facts,
                                            json &ctx, json &tools_out, Job *job) {
  const std::string &field = conv.messages_field;
  if (!facts.chat_template)
    return bad(field, "the model has no chat template; use /v1/completions", "no_template");
  if (!conv.messages.is_array() || conv.messages.empty())
    return bad(field, "'" + field + "' must be a non-empty list");
  json messages = json::array();
  size_t i = 0;
  for (const auto &m : conv.messages) {
    const std::string where = field + "[" + std::to_string(i++) + "]";
    if (!m.is_object()) return bad(where, where + " must be an object", "invalid_type");
    if (!m.contains("role") || !m["role"].is_string())
      return bad(where + ".role", where + " needs a 'role' string");
    json msg = m;
    std::string role = msg["role"];
    if (role == "developer") role = msg["role"] = "system"; // the template knows system only
    if (role != "system" && role != "user" && role != "assistant" && role != "tool")
      return bad(where + ".role", where + " has role '" + role +
                                      "'; expected system, developer, user, assistant or tool");
    if (msg.contains("content") && !msg["content"].is_null()) {
      json &c = msg["content"];
      if (c.is_array()) {
        size_t j = 0;
        for (auto &part : c) {
          const std::string at = where + ".content[" + std::to_string(j++) + "]";
          if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
            return bad(where + ".content", where + ".content parts need a 'type'");
          const std::string type = part["type"];
          if (type == "text") {
            if (!part.contains("text") || !part["text"].is_string())
              return bad(at, at + " is a text part without a 'text' string", "invalid_type");
          } else if (type == "image_url") {
            if (role != "user")
              return bad(at, at + ": images are taken in user messages only", "unsupported");
            if (auto e = take_image_part(part, at, facts, job ? &job->images : nullptr)) return e;
            if (job) job->image_params.push_back(at + ".image_url");
          } else {
            return bad(at,
                       at + " has type '" + type + "'; content parts are 'text' and 'image_url'",
                       "unsupported");
          }
        }
      } else if (!c.is_string()) {
        return bad(where + ".content", where + ".content must be a string or a list of parts",
                   "invalid_type");
      }
    }
    // OpenAI clients send tool-call arguments as a JSON string; templates want a mapping.
    if (msg.contains("tool_calls") && !msg["tool_calls"].is_null()) {
      if (!msg["tool_calls"].is_array())
        return bad(where + ".tool_calls", where + ".tool_calls must be a list", "invalid_type");
      for (auto &tc : msg["tool_calls"]) {
        if (!tc.is_object() || !tc.contains("function") || !tc["function"].is_object() ||
            !tc["function"].contains("name") || !tc["function"]["name"].is_string())
          return bad(where + ".tool_calls", "a tool call needs a 'function' with a 'name'");
        json &args = tc["function"]["arguments"];
        if (args.is_string()) {
          // Bounded depth: a string is not covered by the body's own limit.
          json parsed;
          if (parse_body(args.get<std::string>(), parsed))
            return bad(where + ".tool_calls", "a tool call's 'arguments' is not a JSON object "
                                              "nesting at most 64 levels");
          args = parsed;
        } else if (args.is_null()) {
          args = json::object();
        }
      }
    }
    // ATEM templates write an assistant message's calls and not its text when it has both: the
    // text goes first as a message of its own within the turn (what the model writes).
    const bool calls =
        msg.contains("tool_calls") && msg["tool_calls"].is_array() && !msg["tool_calls"].empty();
    const bool text = msg.contains("content") &&
                      ((msg["content"].is_string() && !msg["content"].get<std::string>().empty()) ||
                       (msg["content"].is_array() && !msg["content"].empty()));
    if (facts.format == text::ChatFormat::kAtem && role == "assistant" && calls && text) {
      json said = msg;
      said.erase("tool_calls");
      said["end_turn"] = false;
      msg.erase("content");
      msg.erase("reasoning_content"); // written once, before the first message
      messages.push_back(std::move(said));
    }
    messages.push_back(std::move(msg));
  }
  if (facts.fold_tool_results) text::fold_tool_results(messages);
  ctx["messages"] = messages;
  ctx["add_generation_prompt"] = true;
  const std::string &e = conv.reasoning_effort;
  if (e != "low" && e != "medium" && e != "high" && e != "xhigh" && e != "minimal" && e != "none")
    return bad("reasoning_effort",
               "'reasoning_effort' must be none, minimal, low, medium, high or xhigh");
  text::set_reasoning(facts.format, e, ctx);

  tools_out = json::array();
  if (!conv.tools.is_array()) return bad("tools", "'tools' must be a list", "invalid_type");
  for (const auto &t : conv.tools)
    if (!t.is_object() || !t.contains("type") || t["type"] != "function" ||
        !t.contains("function") || !t["function"].is_object() || !t["function"].contains("name") ||
        !t["function"]["name"].is_string() || t["function"]["name"].get<std::string>().empty())
      return bad("tools", "each tool must be {\"type\": \"function\", \"function\": {\"name\", "
                          "\"parameters\"}}");
  // OpenAI makes a function's description and parameters optional; templates print them.
  tools_out = conv.tools;
  for (auto &t : tools_out) {
    json &fn = t["function"];
    if (!fn.contains("description") || fn["description"].is_null()) fn["description"] = "";
    if (!fn.contains("parameters") || fn["parameters"].is_null())
      fn["parameters"] = {{"type", "object"}, {"properties", json::object()}};
  }
  const std::string &choice = conv.tool_choice;
  if (choice != "auto" && choice != "none" && tools_out.empty())
    return bad("tool_choice", "'tool_choice' " + choice + " needs 'tools'");
  if (choice == "named") {
    bool found = false;
    for (const auto &t : tools_out) found = found || t["function"]["name"] == conv.named_tool;
    if (!found)
      return bad("tool_choice",
                 "'tool_choice' names '" + conv.named_tool + "', which is not among the tools");
  }
  if (!tools_out.empty() && choice != "none") ctx["tools"] = tools_out;
  if (!tools_out.empty() && choice != "none" && !conv.namespace_descriptions.empty())
    ctx["tool_namespace_descriptions"] = conv.namespace_descriptions;
  if (choice == "none") tools_out = json::array();
  text::add_token_variables(*facts.tokenizer, ctx);
  return std::nullopt;
}

namespace {

// Fields of OpenAI's API (and llama-server's, vLLM's) that would change the answer and that this
// server does not honour: refused by name, never ignored.
std::optional<ApiError> refuse_unsupported(const json &body) {
  auto given = [&](const char *key) { return body.contains(key) && !body[key].is_null(); };
  for (const char *key :
       {"json_schema",     "guided_json",         "guided_regex",    "guided_grammar",
        "guided_choice",   "functions",           "function_call",   "audio",
        "suffix",          "min_tokens",          "ignore_eos",      "stop_token_ids",
        "bad_words",       "allowed_token_ids",   "use_beam_search", "include_stop_str_in_output",
        "n_predict",       "typical_p",           "mirostat",        "mirostat_tau",
        "mirostat_eta",    "dry_multiplier",      "dry_base",        "dry_allowed_length",
        "xtc_probability", "xtc_threshold",       "repeat_penalty",  "repeat_last_n",
        "samplers",        "chat_template_kwargs"})
    if (given(key)) return bad(key, std::string("'") + key + "' is not supported", "unsupported");
  if (given("best_of") && body["best_of"] != 1)
    return bad("best_of", "'best_of' other than 1 is not supported; use 'n'", "unsupported");
  if (given("modalities") && body["modalities"] != json::array({"text"}))
    return bad("modalities", "only the 'text' modality is supported", "unsupported");
  return std::nullopt;
}

// /v1/completions `prompt`: a string, or token ids (what evaluation harnesses send, so that the
// scored tokens are theirs); a list holding one of these. Several prompts in one request are
// refused (send one request each).
std::optional<ApiError> completion_prompt(const json &body, const ModelFacts &facts, Job &job) {
  const char *shape = "'prompt' must be a string, a list of token ids, or a list of one of these";
  if (!body.contains("prompt") || body["prompt"].is_null()) return bad("prompt", shape);
  json prompt = body["prompt"];
  if (prompt.is_array() && prompt.size() == 1 && (prompt[0].is_string() || prompt[0].is_array()))
    prompt = json(prompt[0]);
  else if (prompt.is_array() && !prompt.empty() && !prompt[0].is_number())
    return bad("prompt",
               "'prompt' holds " + std::to_string(prompt.size()) +
                   " prompts; this server takes one per request",
               "unsupported");
  const text::Tokenizer &t = *facts.tokenizer;
  if (prompt.is_string()) {
    const std::string text = prompt.get<std::string>();
    if (!text::is_valid_utf8(text)) return bad("prompt", "'prompt' is not valid UTF-8");
    job.request.prompt = t.encode(text, t.add_bos_default(), false);
    job.echo_text = text;
  } else if (prompt.is_array()) {
    for (const auto &id : prompt) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= facts.n_vocab)
        return bad("prompt", "'prompt' token ids must be integers from 0 to " +
                                 std::to_string(facts.n_vocab - 1) + ", not " + id.dump());
      job.request.prompt.push_back(id.get<int32_t>());
    }
    text::Detokenizer d(t);
    for (int32_t id : job.request.prompt) job.echo_text += d.feed(id);
    job.echo_text += d.flush();
  } else {
    return bad("prompt", shape, "invalid_type");
  }
  if (job.request.prompt.empty()) return bad("prompt", "'prompt' is empty");
  if (!job.echo) job.echo_text.clear();
  return std::nullopt;
}

} // namespace

std::optional<ApiError> render_chat_prompt(const json &body, const ModelFacts &facts,
                                           std::string &prompt) {
  if (!body.is_object()) return bad("", "the request body is not a JSON object");
  Conversation conv;
  if (auto e = openai_conversation(body, conv)) return e;
  json ctx, tools;
  if (auto e = chat_context(conv, facts, ctx, tools, nullptr)) return e;
  auto r = facts.chat_template->render(ctx);
  if (!r.ok()) return bad("messages", "the chat template failed: " + r.message(), "template_error");
  prompt = std::move(r).value();
  prompt += text::missing_generation_prompt(facts.format, prompt, ctx);
  return std::nullopt;
}

std::optional<ApiError> build_chat_job(const Conversation &conv, const ModelFacts &facts,
                                       Job &job) {
  job.chat = true;
  json ctx;
  if (auto e = chat_context(conv, facts, ctx, job.tools, &job)) return e;
  auto tokens =
      text::tokenize_chat(*facts.tokenizer, *facts.chat_template, ctx, {}, [&](std::string_view r) {
        return text::missing_generation_prompt(facts.format, r, ctx);
      });
  if (!tokens.ok())
    return bad(conv.messages_field, "the chat template failed: " + tokens.message(),
               "template_error");
  job.request.prompt = std::move(tokens->tokens);
  job.request.message_starts = std::move(tokens->message_starts);
  if (auto e = parse_structured(conv, true, facts, job)) return e;
  // A prompt with images is measured once they are in it (attach_images).
  return job.images.empty() ? check_prompt_budget(facts, job) : std::nullopt;
}

std::optional<ApiError> parse_request(const json &body, bool chat, const ModelFacts &facts,
                                      Job &job) {
  if (!body.is_object()) return bad("", "the request body is not a JSON object", "invalid_json");
  if (auto e = check_model(body, facts)) return e;
  if (auto e = refuse_unsupported(body)) return e;
  if (auto e = read_bool(body, "stream", job.stream)) return e;
  if (auto e = parse_logprobs(body, chat, job)) return e;
  int32_t max_tokens = -1;
  if (auto e = parse_sampling(body, facts, job, max_tokens, !chat && job.echo)) return e;
  if (auto e = parse_speculation(body, facts, job)) return e;
  if (auto e = parse_prediction(body, facts, job)) return e;
  job.max_tokens_asked = max_tokens;
  if (chat) {
    Conversation conv;
    if (auto e = openai_conversation(body, conv)) return e;
    return build_chat_job(conv, facts, job);
  }
  job.chat = false;
  if (auto e = completion_prompt(body, facts, job)) return e;
  if (body.contains("parallel_tool_calls") && !body["parallel_tool_calls"].is_null() &&
      !body["parallel_tool_calls"].is_boolean())
    return bad("parallel_tool_calls", "'parallel_tool_calls' must be true or false",
               "invalid_type");
  Conversation constraints; // the answer's format only
  if (body.contains("response_format")) constraints.response_format = body["response_format"];
  if (body.contains("grammar")) constraints.grammar = body["grammar"];
  if (auto e = parse_structured(constraints, false, facts, job)) return e;
  return check_prompt_budget(facts, job);
}

std::optional<ApiError> check_prompt_budget(const ModelFacts &facts, Job &job,
                                            std::optional<int64_t> prompt_tokens) {
  int32_t max_tokens = job.max_tokens_asked;
  const int64_t prompt = prompt_tokens.value_or(int64_t(job.request.prompt.size()));
  // The answer needs room for a token; a prompt scored without one may fill the context.
  if (prompt > facts.context || (prompt == facts.context && max_tokens != 0))
    return ApiError{400,
                    "the prompt has " + std::to_string(prompt) + " tokens; the context holds " +
                        std::to_string(facts.context) + " in all, prompt and answer",
                    job.chat ? "messages" : "prompt", "context_length_exceeded"};
  if (max_tokens < 0)
    max_tokens = int32_t(std::min<int64_t>(facts.max_tokens_cap, facts.context - prompt));
  else if (prompt + max_tokens > facts.context)
    return ApiError{400,
                    "the prompt has " + std::to_string(prompt) +
                        " tokens and max_tokens asks for " + std::to_string(max_tokens) +
                        " more, " + std::to_string(prompt + max_tokens) +
                        " in all; the context holds " + std::to_string(facts.context),
                    "max_tokens", "context_length_exceeded"};
  job.request.max_tokens = max_tokens;
  return std::nullopt;
}

std::optional<ApiError> parse_body(std::string_view text, json &out, int max_depth) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    if (c == '[' || c == '{') {
      if (++depth > max_depth)
        return ApiError{
            400, "the request body nests deeper than " + std::to_string(max_depth) + " levels", "",
            "invalid_json"};
    }
    if (c == ']' || c == '}') --depth;
  }
  out = json::parse(text, nullptr, false);
  if (out.is_discarded()) {
    // Say where, without echoing the body.
    try {
      const json again = json::parse(text);
      (void)again;
    } catch (const json::exception &e) { // parse_error, or out_of_range for a number like 1e999
      return ApiError{400, "the request body is not valid JSON: " + std::string(e.what()), "",
                      "invalid_json"};
    }
    return ApiError{400, "the request body is not valid JSON", "", "invalid_json"};
  }
  if (!out.is_object())
    return ApiError{400, "the request body is not a JSON object", "", "invalid_json"};
  return std::nullopt;
}

} // namespace offgraph::server
