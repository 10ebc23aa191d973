#include "server/server.h"

#include "sample/sampler.h"
#include "sample/stop.h"
#include "text/atem/atem_parser.h"
#include "text/chat/chat_prompt.h"

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <deque>

namespace offgraph::server {

using json = nlohmann::ordered_json;

namespace {

// An API error: OpenAI's shape, with a message that names the problem.
struct ApiError {
  int status;
  std::string message;
  std::string type = "invalid_request_error";
};

json error_body(const ApiError &e) {
  return {{"error", {{"message", e.message}, {"type", e.type}, {"code", e.status}}}};
}

// Events of one request, from the engine thread to its HTTP handler.
struct Channel {
  std::mutex m;
  std::condition_variable cv;
  std::deque<engine::Event> events;
  bool done = false;
  void push(const engine::Event &e) {
    {
      std::lock_guard lock(m);
      events.push_back(e);
      if (e.finish != engine::FinishReason::None) done = true;
    }
    cv.notify_one();
  }
  // Waits for the next event; false once the request finished and everything was taken.
  bool pop(engine::Event &out) {
    std::unique_lock lock(m);
    cv.wait(lock, [&] { return !events.empty() || done; });
    if (events.empty()) return false;
    out = events.front();
    events.pop_front();
    return true;
  }
};

std::string finish_reason(engine::FinishReason r, bool tool_calls) {
  if (tool_calls) return "tool_calls";
  return r == engine::FinishReason::Length ? "length" : "stop";
}

int64_t now_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Reads an optional number of a given kind, with a clear error for the wrong type or range.
template <class T>
std::optional<ApiError> read_number(const json &body, const char *key, T &out, double lo,
                                    double hi) {
  if (!body.contains(key) || body[key].is_null()) return std::nullopt;
  if (!body[key].is_number()) return ApiError{400, std::string("'") + key + "' must be a number"};
  const double v = body[key].get<double>();
  if (!(v >= lo && v <= hi))
    return ApiError{400, std::string("'") + key + "' must be between " + std::to_string(lo) +
                             " and " + std::to_string(hi)};
  out = static_cast<T>(v);
  return std::nullopt;
}

} // namespace

// What a handler needs to turn a request into engine work and the events back into a response.
struct Handlers {
  explicit Handlers(Server &server) : s(server) {}
  Server &s;

  struct Job {
    engine::Request request;
    bool chat = true;
    bool stream = false;
    std::vector<std::string> stop_strings;
    json tools = json::array();
  };

  // Sampling and limits shared by both routes.
  std::optional<ApiError> parse_common(const json &body, Job &job) {
    sample::SamplingParams p = sample::defaults_for(s.model_->config().arch_name);
    int32_t max_tokens = 256;
    if (auto e = read_number(body, "max_tokens", max_tokens, 1, 1 << 20)) return e;
    if (auto e = read_number(body, "max_completion_tokens", max_tokens, 1, 1 << 20)) return e;
    if (auto e = read_number(body, "temperature", p.temperature, 0, 2)) return e;
    if (auto e = read_number(body, "top_p", p.top_p, 0, 1)) return e;
    if (auto e = read_number(body, "top_k", p.top_k, 0, 1 << 20)) return e;
    if (auto e = read_number(body, "min_p", p.min_p, 0, 1)) return e;
    if (auto e = read_number(body, "presence_penalty", p.presence_penalty, -2, 2)) return e;
    if (auto e = read_number(body, "frequency_penalty", p.frequency_penalty, -2, 2)) return e;
    if (auto e = read_number(body, "repetition_penalty", p.repetition_penalty, 0.01, 10)) return e;
    double seed = -1;
    if (auto e = read_number(body, "seed", seed, -9.2e18, 9.2e18)) return e;
    p.seed = seed >= 0 ? uint64_t(seed) : std::random_device{}();
    if (body.contains("n") && !(body["n"].is_number_integer() && body["n"].get<int64_t>() == 1))
      return ApiError{400, "'n' other than 1 is not supported yet"};
    if (body.contains("stop") && !body["stop"].is_null()) {
      const json &st = body["stop"];
      if (st.is_string())
        job.stop_strings.push_back(st.get<std::string>());
      else if (st.is_array()) {
        for (const auto &x : st) {
          if (!x.is_string()) return ApiError{400, "'stop' must be a string or a list of strings"};
          job.stop_strings.push_back(x.get<std::string>());
        }
      } else
        return ApiError{400, "'stop' must be a string or a list of strings"};
      if (job.stop_strings.size() > 16) return ApiError{400, "at most 16 stop strings"};
    }
    if (body.contains("logit_bias") && body["logit_bias"].is_object())
      for (auto it = body["logit_bias"].begin(); it != body["logit_bias"].end(); ++it) {
        int32_t id = -1;
        try {
          id = std::stoi(it.key());
        } catch (...) {
          return ApiError{400, "'logit_bias' keys must be token ids"};
        }
        if (!it.value().is_number()) return ApiError{400, "'logit_bias' values must be numbers"};
        p.logit_bias[id] = it.value().get<float>();
      }
    if (Status v = sample::validate(p, s.model_->config().n_vocab); !v.ok())
      return ApiError{400, v.message()};
    job.stream = body.value("stream", false);
    job.request.sampling = p;
    job.request.max_tokens = max_tokens;
    job.request.stop_tokens = s.tokenizer_->end_of_generation_ids();
    return std::nullopt;
  }

  std::optional<ApiError> parse_chat(const json &body, Job &job) {
    if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty())
      return ApiError{400, "'messages' must be a non-empty list"};
    if (!s.template_) return ApiError{400, "the model has no chat template; use /v1/completions"};
    json messages = json::array();
    for (const auto &m : body["messages"]) {
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
        return ApiError{400, "each message needs a 'role' string"};
      json msg = m;
      if (msg["role"] == "developer") msg["role"] = "system"; // the template knows system only
      // OpenAI clients send tool-call arguments as a JSON string; templates want a mapping.
      if (msg.contains("tool_calls") && msg["tool_calls"].is_array())
        for (auto &tc : msg["tool_calls"])
          if (tc.contains("function") && tc["function"].contains("arguments") &&
              tc["function"]["arguments"].is_string()) {
            json parsed =
                json::parse(tc["function"]["arguments"].get<std::string>(), nullptr, false);
            if (parsed.is_discarded())
              return ApiError{400, "a tool call's 'arguments' is not valid JSON"};
            tc["function"]["arguments"] = parsed;
          }
      messages.push_back(msg);
    }
    json ctx;
    ctx["messages"] = messages;
    ctx["add_generation_prompt"] = true;
    const std::string effort = body.value("reasoning_effort", std::string("high"));
    if (effort != "low" && effort != "medium" && effort != "high" && effort != "xhigh" &&
        effort != "minimal" && effort != "none")
      return ApiError{400, "'reasoning_effort' must be low, medium, high or xhigh"};
    ctx["reasoning_strength"] =
        (effort == "minimal" || effort == "none") ? "low" : effort; // no "off" exists
    if (body.contains("tools") && body["tools"].is_array() &&
        body.value("tool_choice", json("auto")) != "none") {
      ctx["tools"] = body["tools"];
      job.tools = body["tools"];
    }
    ctx["bos_token"] =
        s.tokenizer_->bos() >= 0 ? s.tokenizer_->token_piece(s.tokenizer_->bos()) : "";
    ctx["eos_token"] =
        s.tokenizer_->eos() >= 0 ? s.tokenizer_->token_piece(s.tokenizer_->eos()) : "";
    std::lock_guard lock(text_mutex);
    auto tokens = text::tokenize_chat(*s.tokenizer_, *s.template_, ctx);
    if (!tokens.ok()) return ApiError{400, tokens.message()};
    job.request.prompt = std::move(tokens).value();
    return std::nullopt;
  }

  std::optional<ApiError> parse_completion(const json &body, Job &job) {
    if (!body.contains("prompt") || !body["prompt"].is_string())
      return ApiError{400, "'prompt' must be a string"};
    std::lock_guard lock(text_mutex);
    job.request.prompt = s.tokenizer_->encode(body["prompt"].get<std::string>(),
                                              s.tokenizer_->add_bos_default(), false);
    job.chat = false;
    return std::nullopt;
  }

  // Output assembly for one request: detokenize, apply stop strings, parse ATEM (chat).
  struct Output {
    text::Detokenizer detok;
    std::optional<sample::StopSet> stops;
    std::optional<sample::StopMatcher> matcher;
    text::AtemParser atem;
    bool use_atem;
    std::string content;   // completions, or chat without ATEM
    size_t calls_seen = 0; // tool calls emitted so far: their index and id
    json call(const text::ToolCall &c) {
      const size_t i = calls_seen++;
      return {{"index", i},
              {"id", "call_" + std::to_string(i)},
              {"type", "function"},
              {"function", {{"name", c.name}, {"arguments", c.arguments.dump()}}}};
    }
    Output(const text::Tokenizer &t, bool atem_, json tools)
        : detok(t, atem_), atem(std::move(tools)), use_atem(atem_) {}
  };

  std::mutex text_mutex;
};

Result<std::unique_ptr<Server>> Server::create(const model::Model &model,
                                               engine::EngineOptions engine_options,
                                               ServerOptions options) {
  std::unique_ptr<Server> s(new Server());
  s->model_ = &model;
  s->options_ = options;
  if (s->options_.model_name.empty())
    s->options_.model_name = model.config().name.empty() ? "offgraph" : model.config().name;
  auto tok = text::Tokenizer::from_gguf(model.file().path());
  if (!tok.ok()) return tok.status();
  s->tokenizer_ = std::move(tok).value();
  if (auto t = model.file().str("tokenizer.chat_template"); t.ok()) {
    auto parsed = text::Template::parse(*t);
    if (!parsed.ok()) return Status::error("the model's chat template: " + parsed.message());
    s->template_ = std::move(parsed).value();
    s->atem_ = t->find("<atem:function_calls>") != std::string::npos &&
               t->find("<|eom|>") != std::string::npos;
  }
  auto e = engine::Engine::create(model, engine_options);
  if (!e.ok()) return e.status();
  s->engine_ = std::move(e).value();
  s->http_ = std::make_unique<httplib::Server>();
  s->routes();
  return s;
}

Server::~Server() { stop(); }

void Server::engine_loop() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    if (engine_->active() == 0 && engine_->queued() == 0) {
      wake_.wait_for(lock, std::chrono::milliseconds(100));
      continue;
    }
    engine_->step();
  }
}

Status Server::start() {
  if (options_.port == 0)
    port_ = http_->bind_to_any_port(options_.host.c_str());
  else
    port_ = http_->bind_to_port(options_.host.c_str(), options_.port) ? options_.port : -1;
  if (port_ <= 0)
    return Status::error("cannot listen on " + options_.host + ":" + std::to_string(options_.port));
  engine_thread_ = std::thread([this] { engine_loop(); });
  http_thread_ = std::thread([this] { http_->listen_after_bind(); });
  return ok_status();
}

void Server::stop() {
  if (stopping_.exchange(true)) return;
  if (http_) http_->stop();
  wake_.notify_all();
  if (http_thread_.joinable()) http_thread_.join();
  if (engine_thread_.joinable()) engine_thread_.join();
}

void Server::wait() {
  if (http_thread_.joinable()) http_thread_.join();
}

void Server::routes() {
  auto handlers = std::make_shared<Handlers>(*this);
  httplib::Server &http = *http_;
  http.set_payload_max_length(options_.max_body_bytes);
  auto send = [](httplib::Response &res, int status, const json &body) {
    res.status = status;
    res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
  };

  http.Get("/health", [send](const httplib::Request &, httplib::Response &res) {
    send(res, 200, {{"status", "ok"}});
  });
  http.Get("/metrics", [this](const httplib::Request &, httplib::Response &res) {
    // Prometheus text format.
    engine::EngineStats st;
    size_t active = 0, queued = 0, cached = 0;
    int64_t kv_bytes = 0, kv_min = 0;
    {
      std::lock_guard lock(mutex_);
      st = engine_->stats();
      active = engine_->active(), queued = engine_->queued(), cached = engine_->cached();
      const kv::MemoryUse m = engine_->store().memory();
      kv_bytes = m.buffers + m.snapshots;
      kv_min = m.minimum;
    }
    std::string t;
    auto metric = [&t](const char *name, const char *type, const char *help, double v) {
      t += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" +
           name + " " + std::to_string(v) + "\n";
    };
    metric("offgraph_requests_total", "counter", "requests accepted", double(metrics_.requests));
    metric("offgraph_requests_rejected_total", "counter", "requests refused with 429",
           double(metrics_.rejected));
    metric("offgraph_prompt_tokens_total", "counter", "prompt tokens of admitted requests",
           double(st.prompt_tokens));
    metric("offgraph_prompt_tokens_computed_total", "counter", "prompt tokens computed",
           double(st.computed_prompt_tokens));
    metric("offgraph_prompt_tokens_cached_total", "counter", "prompt tokens reused from the cache",
           double(st.reused_prompt_tokens));
    metric("offgraph_generated_tokens_total", "counter", "tokens generated",
           double(st.generated_tokens));
    metric("offgraph_steps_total", "counter", "engine steps", double(st.steps));
    metric("offgraph_snapshot_restores_total", "counter", "ring snapshots restored",
           double(st.snapshot_restores));
    metric("offgraph_requests_active", "gauge", "requests being computed", double(active));
    metric("offgraph_requests_queued", "gauge", "requests waiting", double(queued));
    metric("offgraph_sequences_cached", "gauge", "finished conversations kept for reuse",
           double(cached));
    metric("offgraph_kv_bytes", "gauge", "KV cache bytes held (buffers and snapshots)",
           double(kv_bytes));
    metric("offgraph_kv_min_bytes", "gauge", "theoretical minimum KV bytes for the current lengths",
           double(kv_min));
    res.set_content(t, "text/plain; version=0.0.4");
  });
  http.Get("/v1/models", [this, send](const httplib::Request &, httplib::Response &res) {
    send(res, 200,
         {{"object", "list"},
          {"data", json::array({{{"id", options_.model_name},
                                 {"object", "model"},
                                 {"owned_by", "offgraph"},
                                 {"created", now_seconds()}}})}});
  });

  auto serve = [this, handlers, send](const httplib::Request &req, httplib::Response &res,
                                      bool chat) {
    json body = json::parse(req.body, nullptr, false);
    if (body.is_discarded() || !body.is_object())
      return send(res, 400, error_body({400, "the request body is not a JSON object"}));
    Handlers::Job job;
    if (auto e = handlers->parse_common(body, job)) return send(res, e->status, error_body(*e));
    if (auto e = chat ? handlers->parse_chat(body, job) : handlers->parse_completion(body, job))
      return send(res, e->status, error_body(*e));
    auto channel = std::make_shared<Channel>();
    uint64_t id = 0;
    {
      std::lock_guard lock(mutex_);
      auto submitted =
          engine_->submit(job.request, [channel](const engine::Event &e) { channel->push(e); });
      if (!submitted.ok()) {
        // A full queue is a moment, not a mistake: 429 and when to come back.
        if (submitted.message().find("queue is full") != std::string::npos) {
          res.set_header("Retry-After", "1");
          ++metrics_.rejected;
          return send(res, 429, error_body({429, submitted.message(), "rate_limit_error"}));
        }
        return send(res, 400, error_body({400, submitted.message()}));
      }
      ++metrics_.requests;
      id = *submitted;
    }
    wake_.notify_all();
    const std::string rid = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(id);
    const int64_t created = now_seconds();
    const size_t prompt_tokens = job.request.prompt.size();
    auto out = std::make_shared<Handlers::Output>(*tokenizer_, chat && atem_, job.tools);
    if (!job.stop_strings.empty()) {
      auto set = sample::StopSet::create({}, job.stop_strings);
      if (set.ok()) {
        out->stops = std::move(set).value();
        out->matcher.emplace(*out->stops);
      }
    }
    // Turns new text into deltas: (reasoning, content, tool calls). Returns true once a stop string
    // matched.
    auto absorb = [out](const std::string &piece, json &reasoning, std::string &content,
                        json &calls) {
      std::string text = piece;
      bool stopped = false;
      if (out->matcher) {
        auto u = out->matcher->push(piece);
        text = u.emit;
        stopped = u.stop_string.has_value();
      }
      if (out->use_atem) {
        for (const auto &e : out->atem.feed(text)) {
          if (e.kind == text::AtemEvent::Kind::Reasoning)
            reasoning = reasoning.get<std::string>() + e.text;
          if (e.kind == text::AtemEvent::Kind::Content) content += e.text;
          if (e.kind == text::AtemEvent::Kind::ToolCall) calls.push_back(out->call(e.call));
        }
      } else {
        content += text;
      }
      return stopped;
    };
    auto cancel = [this, id] {
      std::lock_guard lock(mutex_);
      engine_->cancel(id);
      wake_.notify_all();
    };
    // A generated token's text; an end-of-turn token is text only where the ATEM parser wants it.
    auto piece_of = [out, stops = job.request.stop_tokens](int32_t token) {
      std::string piece = out->detok.feed(token);
      if (!out->use_atem && std::find(stops.begin(), stops.end(), token) != stops.end())
        piece.clear();
      return piece;
    };
    auto usage_of = [prompt_tokens](int completion, int cached) {
      return json{{"prompt_tokens", prompt_tokens},
                  {"completion_tokens", completion},
                  {"total_tokens", prompt_tokens + size_t(completion)},
                  {"prompt_tokens_details", {{"cached_tokens", cached}}}};
    };

    if (!job.stream) {
      json reasoning = "", calls = json::array();
      std::string content;
      engine::Event e;
      engine::FinishReason reason = engine::FinishReason::None;
      int completion = 0, cached = 0;
      std::string error;
      bool stopped = false;
      while (channel->pop(e)) {
        if (e.token >= 0 && !stopped) {
          ++completion;
          const std::string piece = piece_of(e.token);
          if (absorb(piece, reasoning, content, calls)) stopped = true, cancel();
        }
        if (e.finish != engine::FinishReason::None)
          reason = e.finish, cached = e.cached_tokens, error = e.error;
      }
      if (reason == engine::FinishReason::Error)
        return send(res, 500, error_body({500, error, "server_error"}));
      if (!stopped) {
        absorb(out->detok.flush(), reasoning, content, calls);
        if (out->matcher) absorb(out->matcher->finish(), reasoning, content, calls);
        if (out->use_atem) out->atem.finish();
      }
      if (out->use_atem) { // the parser's aggregate includes what finish() flushed
        content = out->atem.message().content;
        reasoning = out->atem.message().reasoning_content;
        calls = json::array();
        out->calls_seen = 0;
        for (const auto &c : out->atem.message().tool_calls) calls.push_back(out->call(c));
      }
      const std::string why = stopped ? "stop" : finish_reason(reason, !calls.empty());
      const json usage = usage_of(completion, cached);
      json body_out;
      if (chat) {
        json message = {{"role", "assistant"}, {"content", content}};
        if (!reasoning.get<std::string>().empty()) message["reasoning_content"] = reasoning;
        if (!calls.empty()) {
          for (json &c : calls) c.erase("index"); // a streaming field
          message["tool_calls"] = calls;
        }
        body_out = {{"id", rid},
                    {"object", "chat.completion"},
                    {"created", created},
                    {"model", options_.model_name},
                    {"choices",
                     json::array({{{"index", 0}, {"message", message}, {"finish_reason", why}}})},
                    {"usage", usage}};
      } else {
        body_out = {
            {"id", rid},
            {"object", "text_completion"},
            {"created", created},
            {"model", options_.model_name},
            {"choices", json::array({{{"index", 0}, {"text", content}, {"finish_reason", why}}})},
            {"usage", usage}};
      }
      return send(res, 200, body_out);
    }

    // Streaming: server-sent events, one chunk per delta, then [DONE]. A client that goes away
    // cancels its request.
    res.set_chunked_content_provider("text/event-stream", [=, this](size_t,
                                                                    httplib::DataSink &sink) {
      auto emit = [&](const json &delta, const json &finish) {
        json chunk;
        if (chat)
          chunk = {{"id", rid},
                   {"object", "chat.completion.chunk"},
                   {"created", created},
                   {"model", options_.model_name},
                   {"choices",
                    json::array({{{"index", 0}, {"delta", delta}, {"finish_reason", finish}}})}};
        else
          chunk = {{"id", rid},
                   {"object", "text_completion"},
                   {"created", created},
                   {"model", options_.model_name},
                   {"choices", json::array({{{"index", 0},
                                             {"text", delta.value("content", "")},
                                             {"finish_reason", finish}}})}};
        const std::string line =
            "data: " + chunk.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
        return sink.write(line.data(), line.size());
      };
      if (chat && !emit({{"role", "assistant"}}, nullptr)) return cancel(), false;
      engine::Event e;
      engine::FinishReason reason = engine::FinishReason::None;
      bool stopped = false;
      int completion = 0, cached = 0;
      auto flush_deltas = [&](const std::string &piece) {
        json reasoning = "", calls = json::array();
        std::string content;
        const bool hit = absorb(piece, reasoning, content, calls);
        bool ok = true;
        if (!reasoning.get<std::string>().empty())
          ok = ok && emit({{"reasoning_content", reasoning}}, nullptr);
        if (!content.empty()) ok = ok && emit({{"content", content}}, nullptr);
        for (const json &c : calls) ok = ok && emit({{"tool_calls", json::array({c})}}, nullptr);
        if (!ok) cancel();
        return std::pair{ok, hit};
      };
      while (channel->pop(e)) {
        if (e.token >= 0 && !stopped) {
          ++completion;
          const std::string piece = piece_of(e.token);
          auto [ok, hit] = flush_deltas(piece);
          if (!ok) return false;
          if (hit) stopped = true, cancel();
        }
        if (e.finish != engine::FinishReason::None) reason = e.finish, cached = e.cached_tokens;
      }
      if (!stopped) {
        flush_deltas(out->detok.flush());
        if (out->matcher) flush_deltas(out->matcher->finish());
        if (out->use_atem) {
          // What the parser held back when the stream ended: every kind, not only content.
          for (const auto &ev : out->atem.finish()) {
            if (ev.kind == text::AtemEvent::Kind::Content) emit({{"content", ev.text}}, nullptr);
            if (ev.kind == text::AtemEvent::Kind::Reasoning)
              emit({{"reasoning_content", ev.text}}, nullptr);
            if (ev.kind == text::AtemEvent::Kind::ToolCall)
              emit({{"tool_calls", json::array({out->call(ev.call)})}}, nullptr);
          }
        }
      }
      const bool tools = out->use_atem && !out->atem.message().tool_calls.empty();
      emit(json::object(), stopped ? "stop" : finish_reason(reason, tools));
      const json usage = usage_of(completion, cached);
      const std::string tail = "data: " +
                               json{{"id", rid},
                                    {"object", "chat.completion.chunk"},
                                    {"choices", json::array()},
                                    {"usage", usage}}
                                   .dump() +
                               "\n\ndata: [DONE]\n\n";
      sink.write(tail.data(), tail.size());
      sink.done();
      return true;
    });
  };
  http.Post("/v1/chat/completions", [serve](const httplib::Request &req, httplib::Response &res) {
    serve(req, res, true);
  });
  http.Post("/v1/completions", [serve](const httplib::Request &req, httplib::Response &res) {
    serve(req, res, false);
  });
  http.set_exception_handler(
      [send](const httplib::Request &, httplib::Response &res, std::exception_ptr) {
        send(res, 500, error_body({500, "internal error", "server_error"}));
      });
}

} // namespace offgraph::server
