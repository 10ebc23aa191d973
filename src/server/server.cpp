#include "server/server.h"

#include "server/anthropic.h"
#include "server/connection.h"
#include "server/image_parts.h"
#include "server/metrics.h"
#include "server/output.h"
#include "server/responses.h"
#include "text/atem/atem_grammar.h"
#include "text/chat/chat_prompt.h"

#include <httplib.h>

#include <chrono>
#include <deque>
#include <filesystem>
#include <random>

namespace offgraph::server {

namespace {

// Compares without an early exit, so the time taken does not tell how much of a key was right.
bool constant_time_equal(const std::string &a, const std::string &b) {
  const size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

} // namespace

// Events of one request (all its choices), from the engine thread to its HTTP handler. A token
// event is handed over at the end of its step (`release`, from the engine loop), so a handler
// takes a step's tokens together; a last event is handed over at once, with those before it.
class Channel {
public:
  explicit Channel(int32_t choices) : choices_(choices) {}
  // Returns whether the event still waits for a `release`.
  bool push(const engine::Event &e) {
    const bool last = e.finish != engine::FinishReason::None;
    {
      std::lock_guard lock(m_);
      events_.push_back(e);
      if (last) ++finished_, released_ = events_.size();
    }
    if (last) cv_.notify_one();
    return !last;
  }
  void release() {
    {
      std::lock_guard lock(m_);
      released_ = events_.size();
    }
    cv_.notify_one();
  }
  enum class Pop { Events, Timeout, Done };
  // Every event released, in order (appended to `out`).
  Pop pop_all(std::vector<engine::Event> &out, std::chrono::milliseconds wait) {
    std::unique_lock lock(m_);
    // Once every choice has its last event, every event is released.
    if (!cv_.wait_for(lock, wait, [&] { return released_ > 0 || finished_ >= choices_; }))
      return Pop::Timeout;
    if (released_ == 0) return Pop::Done;
    out.insert(out.end(), events_.begin(), events_.begin() + std::ptrdiff_t(released_));
    events_.erase(events_.begin(), events_.begin() + std::ptrdiff_t(released_));
    released_ = 0;
    return Pop::Events;
  }

private:
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<engine::Event> events_;
  size_t released_ = 0; // events_'s first ones, handed over
  int32_t choices_, finished_ = 0;
};

namespace {

int64_t now_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string dump(const json &j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void send(httplib::Response &res, int status, const json &body) {
  res.status = status;
  res.set_content(dump(body), "application/json");
}

constexpr auto kPoll = std::chrono::milliseconds(200);
// Connections the kernel holds for the accept thread (capped at net.core.somaxconn): cpp-httplib's
// own 5 overflowed 50 times in one 1,200-request soak of 32 clients (docs/reliability.md).
constexpr int kListenBacklog = 1024;

// Anthropic's routes answer errors in Anthropic's shape (its clients read nothing else).
bool is_anthropic_route(const std::string &path) { return path.rfind("/v1/messages", 0) == 0; }

// True every kPoll: how often a waiting handler looks at its connection.
class Deadline {
public:
  bool due() {
    const auto now = std::chrono::steady_clock::now();
    if (now < next_) return false;
    next_ = now + kPoll;
    return true;
  }

private:
  std::chrono::steady_clock::time_point next_ = std::chrono::steady_clock::now() + kPoll;
};

} // namespace

// The route handlers; a friend of Server.
struct Routes {
  Server &s;

  // Whether the client of `req` has hung up, its socket found on the first call (a request with
  // images asks while it waits for image memory).
  std::function<bool()> client_gone(const httplib::Request &req) {
    return [this, &req, sock = std::optional<int>()]() mutable {
      if (!sock) sock = connection_socket(s.port_, req.remote_addr, req.remote_port);
      return peer_closed(*sock);
    };
  }

  bool loading(httplib::Response &res, bool anthropic = false) {
    auto shape = [anthropic](const ApiError &e) {
      return anthropic ? anthropic::error_body(e) : error_body(e);
    };
    if (!s.ready_) {
      send(res, 503,
           shape({503, "the model is still loading", "", "model_loading", "unavailable_error"}));
      return true;
    }
    // A split model whose device stopped cannot compute a step: new work is refused until the
    // server is restarted (the device's weights and KV went with it).
    if (std::string gone = s.model_->devices().failure(); !gone.empty()) {
      send(res, 503,
           shape({503,
                  "a device of the model is gone (" + gone +
                      "); restart the "
                      "server once it is back",
                  "", "device_lost", "unavailable_error"}));
      return true;
    }
    return false;
  }

  // attach_images' error: a client that left while its images waited is counted as abandoned.
  void fail_images(httplib::Response &res, const ApiError &e, bool anthropic = false) {
    if (e.status == kClientClosedRequest && !s.stopping_) ++s.counters_.abandoned;
    fail(res, e, anthropic);
  }

  void fail(httplib::Response &res, const ApiError &e, bool anthropic = false) {
    // 499: nobody reads the answer; counted where the client was found gone (a disconnect of an
    // accepted request, or a request abandoned before it was accepted).
    if (e.status != kClientClosedRequest) {
      (e.status >= 500 ? s.counters_.server_errors : s.counters_.client_errors)++;
    }
    send(res, e.status, anthropic ? anthropic::error_body(e) : error_body(e));
  }

  std::optional<json> body_of(const httplib::Request &req, httplib::Response &res,
                              bool anthropic = false) {
    json body;
    if (auto e = parse_body(req.body, body)) {
      fail(res, *e, anthropic);
      return std::nullopt;
    }
    return body;
  }

  void cancel(uint64_t id, int32_t choice = -1) {
    s.engine_->cancel(id, choice);
    s.wake_engine();
  }

  // Everything a completion handler shares between its streaming and non-streaming forms.
  struct Call {
    Job job;
    uint64_t id = 0;
    std::shared_ptr<Channel> channel;
    std::vector<std::unique_ptr<ChoiceOutput>> outs;
    std::vector<engine::FinishReason> reasons;
    std::string error;
    int cached = 0;
    int drafted = 0, accepted = 0; // speculative decoding, every choice's (Event::drafted)
    std::shared_ptr<const std::vector<sample::TokenLogprobs>> prompt_logprobs; // echo's
    std::vector<CompletionLogprobs> offsets; // per choice, of streamed completion logprobs
    ResponseHead head;
    // Choice 0's deltas in the order they came (keep_deltas): a non-streaming answer built from
    // them has its blocks or items in the order a stream shows them.
    bool keep_deltas = false;
    std::vector<ChoiceOutput::Delta> deltas;
    bool finished(int32_t c) const { return reasons[size_t(c)] != engine::FinishReason::None; }
  };

  std::string finish_reason(const Call &call, int32_t c) {
    return server::finish_reason(*call.outs[size_t(c)],
                                 call.reasons[size_t(c)] == engine::FinishReason::Length);
  }

  json usage(const Call &call) {
    int completion = 0;
    for (const auto &o : call.outs) completion += o->completion_tokens();
    json u = usage_shape(call.job.request.prompt.size(), completion, call.cached);
    if (call.job.image_tokens > 0) // the prompt's image rows (counted in prompt_tokens)
      u["prompt_tokens_details"]["image_tokens"] = call.job.image_tokens;
    if (call.job.prediction) // Predicted Outputs' counts: every drafted token's
      u["completion_tokens_details"] = prediction_details(call.accepted, call.drafted);
    return u;
  }

  // Applies one engine event to the call's outputs; returns the delta for streaming.
  ChoiceOutput::Delta apply(Call &call, const engine::Event &e) {
    ChoiceOutput::Delta d;
    if (e.choice < 0 || e.choice >= call.job.request.n) return d;
    ChoiceOutput &o = *call.outs[size_t(e.choice)];
    if (e.prompt_logprobs && !call.prompt_logprobs) call.prompt_logprobs = e.prompt_logprobs;
    if (e.token >= 0 && !o.stopped()) {
      d = o.feed(e.token, e.logprobs ? &*e.logprobs : nullptr);
      if (o.stopped()) cancel(call.id, e.choice); // a stop string: the choice is done
    }
    if (e.finish != engine::FinishReason::None) {
      call.reasons[size_t(e.choice)] = e.finish;
      call.cached = std::max(call.cached, e.cached_tokens);
      call.drafted += e.drafted, call.accepted += e.accepted;
      if (e.finish == engine::FinishReason::Error && call.error.empty()) call.error = e.error;
      d.append(o.finish(e.finish == engine::FinishReason::Length));
    }
    if (call.keep_deltas && e.choice == 0 && !d.empty()) call.deltas.push_back(d);
    return d;
  }

  // A choice's log-probabilities in the route's shape, or null when not asked for: the whole
  // answer's, with an echoed prompt's before it (completions).
  json whole_logprobs(const Call &call, int32_t c, bool chat) {
    const engine::Request &r = call.job.request;
    if (r.top_logprobs < 0) return nullptr;
    const auto &generated = call.outs[size_t(c)]->logprobs();
    if (chat) return chat_logprobs(*s.tokenizer_, generated);
    std::vector<sample::TokenLogprobs> all;
    if (r.prompt_logprobs && call.prompt_logprobs) all = *call.prompt_logprobs;
    all.insert(all.end(), generated.begin(), generated.end());
    CompletionLogprobs shape{*s.tokenizer_, 0};
    return shape.shape(all, r.prompt_logprobs ? r.prompt[0] : -1);
  }

  // Those not yet streamed, for the chunk about to be written; null when none are.
  json streamed_logprobs(Call &call, int32_t c, bool chat) {
    if (call.job.request.top_logprobs < 0) return nullptr;
    const auto pending = call.outs[size_t(c)]->take_logprobs();
    if (pending.empty()) return nullptr;
    if (chat) return chat_logprobs(*s.tokenizer_, pending);
    return call.offsets[size_t(c)].shape(pending);
  }

  // The call's outputs and channel, and the job handed to the engine; false when it was refused
  // (the answer is written).
  bool submit(httplib::Response &res, Call &call, text::ChatFormat format, bool anthropic) {
    const int32_t n = call.job.request.n;
    call.channel = std::make_shared<Channel>(n);
    for (int32_t c = 0; c < n; ++c)
      call.outs.push_back(std::make_unique<ChoiceOutput>(*s.tokenizer_, format, call.job.tools,
                                                         call.job.stop_strings,
                                                         call.job.request.stop_tokens));
    call.reasons.assign(size_t(n), engine::FinishReason::None);
    for (int32_t c = 0; c < n; ++c) call.offsets.push_back(CompletionLogprobs{*s.tokenizer_, 0});
    if (s.stopping_) {
      fail(res, {503, "the server is shutting down", "", "shutting_down", "unavailable_error"},
           anthropic);
      return false;
    }
    auto channel = call.channel;
    // Events come from step() on the engine thread (engine.h).
    auto submitted = s.engine_->submit(call.job.request, [this, channel](const engine::Event &e) {
      if (!channel->push(e)) return;
      std::lock_guard lock(s.stepped_mutex_);
      if (s.stepped_.empty() || s.stepped_.back() != channel) s.stepped_.push_back(channel);
    });
    if (!submitted.ok()) {
      // A full queue is a moment, not a mistake: 429 and when to come back.
      const ApiError e = api_error(submitted.status());
      if (e.status == 429) {
        res.set_header("Retry-After", "1");
        ++s.counters_.rejected;
        send(res, 429, anthropic ? anthropic::error_body(e) : error_body(e));
        return false;
      }
      fail(res, e, anthropic);
      return false;
    }
    ++s.counters_.requests;
    call.id = *submitted;
    s.wake_engine();
    return true;
  }

  void completion(const httplib::Request &req, httplib::Response &res, bool chat) {
    if (loading(res)) return;
    auto body = body_of(req, res);
    if (!body) return;
    auto call = std::make_shared<Call>();
    {
      std::lock_guard lock(s.text_mutex_);
      if (auto e = parse_request(*body, chat, s.facts_, call->job)) return fail(res, *e);
    }
    if (auto e = attach_images(s.facts_, call->job, client_gone(req))) return fail_images(res, *e);
    if (!submit(res, *call, chat ? s.facts_.format : text::ChatFormat::kPlain, false)) return;
    call->head = {(chat ? "chatcmpl-" : "cmpl-") + std::to_string(call->id), chat, now_seconds(),
                  s.options_.model_name};
    if (call->job.stream)
      stream(req, res, call, chat);
    else
      whole(req, res, call, chat);
  }

  // A stream's client went away (or the server is stopping): its request is cancelled; the
  // channel outlives the handler, so the engine's last events are harmless. False: the provider
  // stops.
  bool stream_gone(const Call &call) {
    if (!s.stopping_) ++s.counters_.disconnects;
    cancel(call.id);
    return false;
  }

  // Waits for every choice's last event, applying each; false when the client went away (its
  // request is then cancelled).
  bool wait_all(const httplib::Request &req, Call &call) {
    const int sock = connection_socket(s.port_, req.remote_addr, req.remote_port);
    std::vector<engine::Event> events;
    bool gone = false;
    Deadline check;
    for (;;) {
      events.clear();
      const auto r = call.channel->pop_all(events, kPoll);
      if (r == Channel::Pop::Done) break;
      if (!gone && check.due() && (peer_closed(sock) || s.stopping_)) {
        gone = true;
        if (!s.stopping_) ++s.counters_.disconnects;
        cancel(call.id);
      }
      for (const engine::Event &e : events) apply(call, e);
    }
    return !gone;
  }

  // Non-streaming: wait for every choice, then answer once. A client that goes away meanwhile
  // cancels its request.
  void whole(const httplib::Request &req, httplib::Response &res, const std::shared_ptr<Call> &call,
             bool chat) {
    if (!wait_all(req, *call))
      return fail(res,
                  {kClientClosedRequest, "the client closed the connection", "", "client_closed"});
    bool all_failed = true;
    for (auto r : call->reasons) all_failed = all_failed && r == engine::FinishReason::Error;
    if (all_failed) return fail(res, {500, call->error, "", "engine_error", "server_error"});
    json choices = json::array();
    for (int32_t c = 0; c < call->job.request.n; ++c)
      choices.push_back(whole_choice(chat, c, *call->outs[size_t(c)], call->job.echo_text,
                                     whole_logprobs(*call, c, chat), finish_reason(*call, c)));
    ++s.counters_.completed;
    send(res, 200, response_body(call->head, std::move(choices), usage(*call)));
  }

  // Streaming: server-sent events, then [DONE]. What a choice gained from the events taken
  // together (a step's: a verify span's tokens) goes out as one chunk per kind of delta, as vLLM
  // streams; its last event's finish follows in a chunk of its own.
  void stream(const httplib::Request &req, httplib::Response &res,
              const std::shared_ptr<Call> &call, bool chat) {
    res.set_header("Cache-Control", "no-cache");
    const int sock = connection_socket(s.port_, req.remote_addr, req.remote_port);
    res.set_chunked_content_provider("text/event-stream", [this, call, chat,
                                                           sock](size_t, httplib::DataSink &sink) {
      auto write = [&](const json &j) {
        const std::string line = "data: " + dump(j) + "\n\n";
        return sink.write(line.data(), line.size());
      };
      auto chunk = [&](int32_t c, const json &delta, const json &finish) {
        return write(chunk_body(call->head, c, delta, streamed_logprobs(*call, c, chat), finish));
      };
      auto gone = [&] { return stream_gone(*call); };
      if (chat)
        for (int32_t c = 0; c < call->job.request.n; ++c)
          if (!chunk(c, {{"role", "assistant"}, {"content", ""}}, nullptr)) return gone();
      std::vector<engine::Event> events;
      std::vector<ChoiceOutput::Delta> pending(size_t(call->job.request.n));
      auto flush = [&](int32_t c) {
        bool ok = true;
        for (const json &part : delta_parts(pending[size_t(c)])) ok = ok && chunk(c, part, nullptr);
        pending[size_t(c)] = {};
        return ok;
      };
      Deadline check;
      for (;;) {
        events.clear();
        const auto r = call->channel->pop_all(events, kPoll);
        if (r == Channel::Pop::Done) break;
        // A write to a closed connection can succeed for a while (kernel buffers), so the
        // connection is looked at on its own.
        if (check.due() && (peer_closed(sock) || s.stopping_)) return gone();
        bool ok = true;
        for (const engine::Event &e : events) {
          if (e.choice < 0 || e.choice >= call->job.request.n) continue;
          pending[size_t(e.choice)].append(apply(*call, e));
          if (e.finish == engine::FinishReason::None) continue;
          ok = ok && flush(e.choice);
          if (e.finish == engine::FinishReason::Error)
            ok = ok && write(error_body({500, e.error, "", "engine_error", "server_error"}));
          else
            ok = ok && chunk(e.choice, json::object(), finish_reason(*call, e.choice));
        }
        for (int32_t c = 0; c < call->job.request.n; ++c) ok = ok && flush(c);
        if (!ok) return gone();
      }
      if (call->job.include_usage) write(usage_chunk(call->head, usage(*call)));
      const std::string done = "data: [DONE]\n\n";
      sink.write(done.data(), done.size());
      sink.done();
      ++s.counters_.completed;
      return true;
    });
  }

  // POST /v1/messages (Anthropic's Messages API) and /v1/messages/count_tokens.
  void messages(const httplib::Request &req, httplib::Response &res, bool count_only) {
    if (loading(res, true)) return;
    auto body = body_of(req, res, true);
    if (!body) return;
    auto call = std::make_shared<Call>();
    Job &job = call->job;
    {
      std::lock_guard lock(s.text_mutex_);
      auto e = count_only ? anthropic::parse_count_tokens(*body, s.facts_, job)
                          : anthropic::parse_messages(*body, s.facts_, job);
      if (e) return fail(res, *e, true);
    }
    if (auto e = attach_images(s.facts_, job, client_gone(req))) {
      if (e->code == "context_length_exceeded")
        e = anthropic::context_error(int64_t(job.request.prompt.size()), job.max_tokens_asked,
                                     s.facts_.context);
      return fail_images(res, *e, true);
    }
    if (count_only) return send(res, 200, {{"input_tokens", job.request.prompt.size()}});
    job.request.report_admission = job.stream; // message_start tells the cache before the answer
    call->keep_deltas = !job.stream;
    if (!submit(res, *call, s.facts_.format, true)) return;
    const anthropic::MessageHead head{"msg_" + s.boot_id_ + std::to_string(call->id),
                                      s.options_.model_name};
    if (job.stream) return message_stream(req, res, call, head);
    if (!wait_all(req, *call))
      return fail(res,
                  {kClientClosedRequest, "the client closed the connection", "", "client_closed"},
                  true);
    if (call->reasons[0] == engine::FinishReason::Error)
      return fail(res, {500, call->error, "", "engine_error", "api_error"}, true);
    const ChoiceOutput &out = *call->outs[0];
    anthropic::MessageBuilder blocks(s.boot_id_ + std::to_string(call->id), job.show_reasoning);
    for (const ChoiceOutput::Delta &d : call->deltas) (void)blocks.add(d);
    (void)blocks.close();
    ++s.counters_.completed;
    send(res, 200,
         anthropic::message_body(
             head, blocks.content(),
             anthropic::stop_reason(out, call->reasons[0] == engine::FinishReason::Length),
             out.stop_string(),
             anthropic::usage(job.request.prompt.size(), call->cached, out.completion_tokens())));
  }

  // Anthropic's event grammar: message_start once the request is admitted (its cached prefix
  // known) or after kStartWait, pings while nothing else is written, the blocks as they grow,
  // message_delta with the cumulative usage, message_stop.
  void message_stream(const httplib::Request &req, httplib::Response &res,
                      const std::shared_ptr<Call> &call, const anthropic::MessageHead &head) {
    res.set_header("Cache-Control", "no-cache");
    const int sock = connection_socket(s.port_, req.remote_addr, req.remote_port);
    res.set_chunked_content_provider("text/event-stream", [this, call, head,
                                                           sock](size_t, httplib::DataSink &sink) {
      using Clock = std::chrono::steady_clock;
      constexpr auto kStartWait = std::chrono::seconds(2), kPingEvery = std::chrono::seconds(5);
      auto last_write = Clock::now();
      const auto began = last_write;
      auto write = [&](const anthropic::Event &e) {
        const std::string text = anthropic::sse(e);
        last_write = Clock::now();
        return sink.write(text.data(), text.size());
      };
      auto gone = [&] { return stream_gone(*call); };
      const size_t prompt = call->job.request.prompt.size();
      bool started = false;
      auto start = [&](int cached) {
        started = true;
        return write(anthropic::message_start(head, anthropic::usage(prompt, cached, 0))) &&
               write(anthropic::ping());
      };
      anthropic::MessageBuilder blocks(s.boot_id_ + std::to_string(call->id),
                                       call->job.show_reasoning);
      std::vector<engine::Event> events;
      Deadline check;
      for (;;) {
        events.clear();
        const auto r = call->channel->pop_all(events, kPoll);
        if (r == Channel::Pop::Done) break;
        if (check.due() && (peer_closed(sock) || s.stopping_)) return gone();
        bool ok = true;
        if (!started && (!events.empty() || Clock::now() - began >= kStartWait))
          ok = start(events.empty() ? 0 : events.front().cached_tokens);
        for (const engine::Event &e : events) {
          // One event at a time: the blocks keep the order the model wrote them in.
          for (const auto &ev : blocks.add(apply(*call, e))) ok = ok && write(ev);
          if (e.finish == engine::FinishReason::None) continue;
          if (e.finish == engine::FinishReason::Error) {
            ok = ok && write({"error", anthropic::error_body({500, e.error, "", "", "api_error"})});
            continue;
          }
          for (const auto &ev : blocks.close()) ok = ok && write(ev);
          const ChoiceOutput &out = *call->outs[0];
          for (const auto &ev : anthropic::message_end(
                   anthropic::stop_reason(out, e.finish == engine::FinishReason::Length),
                   out.stop_string(),
                   anthropic::usage(prompt, call->cached, out.completion_tokens())))
            ok = ok && write(ev);
        }
        if (started && Clock::now() - last_write >= kPingEvery) ok = ok && write(anthropic::ping());
        if (!ok) return gone();
      }
      sink.done();
      ++s.counters_.completed;
      return true;
    });
  }

  // POST /v1/responses (OpenAI's Responses API).
  void responses_post(const httplib::Request &req, httplib::Response &res) {
    if (loading(res)) return;
    auto body = body_of(req, res);
    if (!body) return;
    auto call = std::make_shared<Call>();
    Job &job = call->job;
    auto meta = std::make_shared<responses::Request>();
    const responses::Options options{s.responses_store_.get(), s.options_.drop_hosted_tools};
    std::optional<ApiError> e;
    {
      std::lock_guard lock(s.text_mutex_);
      e = responses::parse(*body, s.facts_, options, job, *meta);
    }
    if (!e) {
      e = attach_images(s.facts_, job, client_gone(req));
      if (e && e->status == kClientClosedRequest) return fail_images(res, *e);
    }
    if (!meta->dropped_tools.empty()) {
      std::string names;
      for (const std::string &n : meta->dropped_tools) names += (names.empty() ? "" : ", ") + n;
      res.set_header("X-Offgraph-Dropped-Tools", names);
      s.counters_.dropped_tools += int64_t(meta->dropped_tools.size());
    }
    if (e) {
      // A stream that overflows the context fails as a stream (Codex compacts on it).
      if (job.stream && e->code == "context_length_exceeded")
        return overflow_stream(res, *e, *meta);
      return fail(res, *e);
    }
    call->keep_deltas = !job.stream;
    if (!submit(res, *call, s.facts_.format, false)) return;
    // Unguessable: a stored response is read, continued or deleted by its id alone.
    thread_local std::mt19937_64 random_bits{std::random_device{}()};
    char nonce[24];
    std::snprintf(nonce, sizeof nonce, "_%016llx", (unsigned long long)random_bits());
    const std::string id = "resp_" + s.boot_id_ + std::to_string(call->id) + nonce;
    const int64_t created = now_seconds();
    if (job.stream) return responses_stream(req, res, call, meta, id, created);
    if (!wait_all(req, *call))
      return fail(res,
                  {kClientClosedRequest, "the client closed the connection", "", "client_closed"});
    responses::OutputBuilder items(s.boot_id_ + std::to_string(call->id), meta->encrypted_reasoning,
                                   meta->summary, meta->tool_shapes);
    for (const ChoiceOutput::Delta &d : call->deltas) (void)items.add(d);
    (void)items.close();
    const responses::Outcome outcome = responses_outcome(*call);
    json response = responses::response_object(id, created, s.options_.model_name, *meta,
                                               items.output(), &outcome);
    if (outcome.status != "failed") keep_response(id, *meta, items.output(), response);
    ++s.counters_.completed;
    send(res, 200, response);
  }

  responses::Outcome responses_outcome(const Call &call) {
    const ChoiceOutput &out = *call.outs[0];
    responses::Outcome o;
    int reasoning = 0;
    {
      std::lock_guard lock(s.text_mutex_);
      reasoning = int(s.tokenizer_->encode(out.reasoning(), false, false).size());
    }
    o.usage = responses::usage(call.job.request.prompt.size(), call.cached, out.completion_tokens(),
                               std::min(reasoning, out.completion_tokens()));
    const engine::FinishReason r = call.reasons[0];
    o.status = r == engine::FinishReason::Error    ? "failed"
               : r == engine::FinishReason::Length ? "incomplete"
                                                   : "completed";
    if (r == engine::FinishReason::Length) o.incomplete = "max_output_tokens";
    if (r == engine::FinishReason::Error) o.error = call.error;
    return o;
  }

  void keep_response(const std::string &id, const responses::Request &meta, const json &output,
                     const json &response) {
    if (!meta.store || !s.responses_store_) return;
    responses::Stored stored;
    stored.input = meta.input, stored.output = output;
    stored.response = response;
    s.responses_store_->put(id, std::move(stored));
  }

  void overflow_stream(httplib::Response &res, const ApiError &e, const responses::Request &meta) {
    ++s.counters_.client_errors;
    responses::OutputBuilder items("overflow", false, false, json::object());
    responses::Outcome outcome;
    outcome.status = "failed", outcome.incomplete = "context_length_exceeded";
    outcome.error = e.message;
    const std::string id = "resp_failed_" + std::to_string(now_seconds());
    const json failed = responses::response_object(id, now_seconds(), s.options_.model_name, meta,
                                                   json::array(), &outcome);
    std::string text;
    for (const json &ev :
         {items.event(
              {{"type", "response.created"},
               {"response", responses::response_object(id, now_seconds(), s.options_.model_name,
                                                       meta, json::array(), nullptr)}}),
          items.event({{"type", "response.failed"}, {"response", failed}})})
      text += "event: " + ev["type"].get<std::string>() + "\ndata: " + dump(ev) + "\n\n";
    res.status = 200;
    res.set_header("Cache-Control", "no-cache");
    res.set_content(text, "text/event-stream");
  }

  // The Responses stream: response.created and response.in_progress, the output items as they
  // grow (responses.h), response.in_progress again after kKeepAlive without another event (long
  // prefills), then response.completed, .incomplete or .failed with the whole response.
  void responses_stream(const httplib::Request &req, httplib::Response &res,
                        const std::shared_ptr<Call> &call,
                        const std::shared_ptr<responses::Request> &meta, const std::string &id,
                        int64_t created) {
    res.set_header("Cache-Control", "no-cache");
    const int sock = connection_socket(s.port_, req.remote_addr, req.remote_port);
    res.set_chunked_content_provider("text/event-stream", [this, call, meta, id, created,
                                                           sock](size_t, httplib::DataSink &sink) {
      using Clock = std::chrono::steady_clock;
      constexpr auto kKeepAlive = std::chrono::seconds(15);
      auto last_write = Clock::now();
      responses::OutputBuilder items(s.boot_id_ + std::to_string(call->id),
                                     meta->encrypted_reasoning, meta->summary, meta->tool_shapes);
      auto write = [&](const json &ev) {
        const std::string text =
            "event: " + ev["type"].get<std::string>() + "\ndata: " + dump(ev) + "\n\n";
        last_write = Clock::now();
        return sink.write(text.data(), text.size());
      };
      auto gone = [&] { return stream_gone(*call); };
      const json pending = responses::response_object(id, created, s.options_.model_name, *meta,
                                                      json::array(), nullptr);
      if (!write(items.event({{"type", "response.created"}, {"response", pending}})) ||
          !write(items.event({{"type", "response.in_progress"}, {"response", pending}})))
        return gone();
      std::vector<engine::Event> events;
      Deadline check;
      for (;;) {
        events.clear();
        const auto r = call->channel->pop_all(events, kPoll);
        if (r == Channel::Pop::Done) break;
        if (check.due() && (peer_closed(sock) || s.stopping_)) {
          if (s.stopping_) { // the stream still ends with a last event
            responses::Outcome down;
            down.status = "failed", down.incomplete = "shutting_down";
            down.error = "the server is shutting down";
            (void)write(items.event(
                {{"type", "response.failed"},
                 {"response", responses::response_object(id, created, s.options_.model_name, *meta,
                                                         items.output(), &down)}}));
          }
          return gone();
        }
        bool ok = true;
        for (const engine::Event &e : events) {
          for (const json &ev : items.add(apply(*call, e))) ok = ok && write(ev);
          if (e.finish == engine::FinishReason::None) continue;
          for (const json &ev : items.close()) ok = ok && write(ev);
          const responses::Outcome outcome = responses_outcome(*call);
          const json response = responses::response_object(id, created, s.options_.model_name,
                                                           *meta, items.output(), &outcome);
          if (outcome.status != "failed") keep_response(id, *meta, items.output(), response);
          ok = ok &&
               write(items.event({{"type", "response." + outcome.status}, {"response", response}}));
        }
        if (Clock::now() - last_write >= kKeepAlive)
          ok = ok && write(items.event({{"type", "response.in_progress"}, {"response", pending}}));
        if (!ok) return gone();
      }
      sink.done();
      ++s.counters_.completed;
      return true;
    });
  }

  void responses_get(const httplib::Request &req, httplib::Response &res, bool erase) {
    if (loading(res)) return;
    const std::string id = req.matches[1];
    auto missing = [&] {
      fail(res, {404,
                 "no stored response '" + id +
                     "' (never stored, deleted, or evicted: the server "
                     "keeps the last " +
                     std::to_string(s.responses_store_ ? s.responses_store_->capacity() : 0) + ")",
                 "", "not_found"});
    };
    if (!s.responses_store_) return missing();
    if (erase) {
      if (!s.responses_store_->erase(id)) return missing();
      return send(res, 200, {{"id", id}, {"object", "response.deleted"}, {"deleted", true}});
    }
    auto stored = s.responses_store_->get(id);
    if (!stored) return missing();
    send(res, 200, stored->response);
  }

  void tokenize(const httplib::Request &req, httplib::Response &res) {
    if (loading(res)) return;
    auto body = body_of(req, res);
    if (!body) return;
    if (!body->contains("content") || !(*body)["content"].is_string())
      return fail(res, {400, "'content' must be a string", "content", "invalid_type"});
    bool add_special = false, parse_special = true, with_pieces = false;
    for (auto [key, out] : {std::pair<const char *, bool *>{"add_special", &add_special},
                            {"parse_special", &parse_special},
                            {"with_pieces", &with_pieces}})
      if (body->contains(key) && !(*body)[key].is_null()) {
        if (!(*body)[key].is_boolean())
          return fail(
              res, {400, std::string("'") + key + "' must be true or false", key, "invalid_type"});
        *out = (*body)[key].get<bool>();
      }
    json tokens = json::array();
    {
      std::lock_guard lock(s.text_mutex_);
      const auto ids =
          s.tokenizer_->encode((*body)["content"].get<std::string>(),
                               add_special && s.tokenizer_->add_bos_default(), parse_special);
      for (int32_t id : ids)
        if (with_pieces)
          tokens.push_back({{"id", id}, {"piece", s.tokenizer_->decode({id})}});
        else
          tokens.push_back(id);
    }
    send(res, 200, {{"tokens", tokens}});
  }

  void detokenize(const httplib::Request &req, httplib::Response &res) {
    if (loading(res)) return;
    auto body = body_of(req, res);
    if (!body) return;
    if (!body->contains("tokens") || !(*body)["tokens"].is_array())
      return fail(res, {400, "'tokens' must be a list of token ids", "tokens", "invalid_type"});
    std::vector<int32_t> ids;
    for (const auto &t : (*body)["tokens"]) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= s.facts_.n_vocab)
        return fail(res, {400,
                          "'tokens' holds " + t.dump() + ", not a token id below " +
                              std::to_string(s.facts_.n_vocab),
                          "tokens", "invalid_value"});
      ids.push_back(t.get<int32_t>());
    }
    std::string text;
    {
      std::lock_guard lock(s.text_mutex_);
      text = s.tokenizer_->decode(ids);
    }
    send(res, 200, {{"content", text}});
  }

  void apply_template(const httplib::Request &req, httplib::Response &res) {
    if (loading(res)) return;
    auto body = body_of(req, res);
    if (!body) return;
    std::string prompt;
    {
      std::lock_guard lock(s.text_mutex_);
      if (auto e = render_chat_prompt(*body, s.facts_, prompt)) return fail(res, *e);
    }
    send(res, 200, {{"prompt", prompt}});
  }
};

Result<std::unique_ptr<Server>> Server::create_loading(ServerOptions options) {
  std::unique_ptr<Server> s(new Server());
  s->options_ = std::move(options);
  if (s->options_.http_threads < 1) return Status::error("server: http_threads must be >= 1");
  {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%08x_", unsigned(std::random_device{}()));
    s->boot_id_ = buf;
  }
  auto http = std::make_unique<httplib::Server>();
  const int threads = s->options_.http_threads;
  http->new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  s->http_ = std::move(http);
  s->routes();
  return s;
}

Result<std::unique_ptr<Server>> Server::create(const model::Model &model,
                                               engine::EngineOptions engine_options,
                                               ServerOptions options, ImageServing images) {
  auto s = create_loading(std::move(options));
  if (!s.ok()) return s.status();
  if (Status a = (*s)->attach(model, engine_options, images); !a.ok()) return a;
  return s;
}

Status Server::attach(const model::Model &model, engine::EngineOptions engine_options,
                      ImageServing images) {
  if (ready_) return Status::error("server: a model is already attached");
  if (stopping_) return Status::error("server: stopped", StatusCode::kUnavailable);
  auto tok = text::Tokenizer::from_gguf(model.file().path());
  if (!tok.ok()) return tok.status();
  std::optional<text::Template> chat_template;
  text::ChatFormat format = text::ChatFormat::kPlain;
  bool fold = false;
  if (auto t = model.file().str("tokenizer.chat_template"); t.ok()) {
    auto parsed = text::Template::parse(*t);
    if (!parsed.ok()) return Status::error("the model's chat template: " + parsed.message());
    chat_template = std::move(parsed).value();
    format = text::detect_chat_format(*t);
    fold = format == text::ChatFormat::kGemma4 && !text::reads_tool_messages(*t);
  }
  auto e = engine::Engine::create(model, engine_options);
  if (!e.ok()) return e.status();

  std::lock_guard lock(mutex_);
  model_ = &model;
  tokenizer_ = std::move(tok).value();
  template_ = std::move(chat_template);
  engine_ = std::move(e).value();
  if (options_.model_name.empty())
    options_.model_name = model.config().name.empty() ? "offgraph" : model.config().name;
  facts_.tokenizer = tokenizer_.get();
  facts_.chat_template = template_ ? &*template_ : nullptr;
  facts_.format = format;
  facts_.fold_tool_results = fold;
  facts_.arch = model.config().arch_name;
  facts_.sampling = engine::default_sampling(model);
  facts_.n_vocab = model.config().n_vocab;
  facts_.context = engine_options.context;
  facts_.speculation = engine_options.speculation;
  facts_.draft_model = engine_options.draft_model != nullptr;
  facts_.images = images.encoder;
  facts_.stopping = &stopping_;
  facts_.image_markers = images.markers;
  facts_.max_images = options_.max_images;
  facts_.max_tokens_cap = options_.max_tokens_cap > 0
                              ? std::min(options_.max_tokens_cap, engine_options.context)
                              : engine_options.context;
  facts_.model_names = {options_.model_name};
  const std::filesystem::path file(model.file().path());
  for (const std::string &n : {file.filename().string(), file.stem().string(), model.config().name})
    if (!n.empty()) facts_.model_names.push_back(n);
  for (const std::string &n : options_.model_aliases) facts_.model_names.push_back(n);
  {
    auto vocabulary =
        std::make_shared<sample::GrammarVocabulary>(text::grammar_token_texts(*tokenizer_));
    vocabulary->set_shared_table_budget(options_.grammar_table_bytes);
    facts_.vocabulary = std::move(vocabulary);
  }
  facts_.grammars = std::make_shared<GrammarCache>();
  warm_thread_ = start_grammar_warm_up(facts_, stopping_);
  published_kv_ = kv_metrics(engine_->store());
  if (options_.responses_store > 0)
    responses_store_ = std::make_unique<responses::Store>(options_.responses_store);
  ready_ = true;
  wake_.notify_all();
  return ok_status();
}

Server::~Server() {
  stop();
  if (warm_thread_.joinable()) warm_thread_.join(); // also when stop() ran before attach()
}

void Server::wake_stepped() {
  std::vector<std::shared_ptr<Channel>> stepped;
  {
    std::lock_guard lock(stepped_mutex_);
    stepped.swap(stepped_);
  }
  for (const auto &channel : stepped) channel->release();
}

void Server::wake_engine() {
  { std::lock_guard lock(mutex_); } // the loop is either before its check or waiting
  wake_.notify_all();
}

// The step loop runs without holding mutex_: handlers submit and cancel through the engine's
// inbox, and /metrics reads what the loop publishes after each step, so nothing waits for a
// long prefill step but the requests in it.
void Server::engine_loop() {
  while (!engine_done_) {
    engine::Engine *e = nullptr;
    {
      std::unique_lock lock(mutex_);
      e = engine_.get();
      if (!e || (e->active() == 0 && e->queued() == 0)) {
        // Last events a receiver could not take yet are offered again every 10 ms meanwhile.
        const bool retry = e && e->undelivered() > 0;
        wake_.wait_for(lock, std::chrono::milliseconds(retry ? 10 : 100));
        if (!retry) continue;
      }
    }
    if (stopping_) e->cancel_all(); // shutting down: accepted work ends as cancelled
    e->step();
    wake_stepped();
    KvMetrics kv = kv_metrics(e->store());
    std::lock_guard lock(published_mutex_);
    published_kv_ = std::move(kv);
  }
}

Status Server::start() {
  if (options_.port == 0)
    port_ = http_->bind_to_any_port(options_.host.c_str());
  else
    port_ = http_->bind_to_port(options_.host.c_str(), options_.port) ? options_.port : -1;
  if (port_ <= 0)
    return Status::error("cannot listen on " + options_.host + ":" + std::to_string(options_.port));
  // Room for a burst of clients while the accept thread is busy (connection.h). Serving goes on
  // without it (the caller says why: backlog_status).
  backlog_status_ = widen_listen_backlog(port_, kListenBacklog);
  engine_thread_ = std::thread([this] { engine_loop(); });
  http_thread_ = std::thread([this] { http_->listen_after_bind(); });
  // Returns once the accept loop runs: cpp-httplib's stop() does nothing before it does, so a
  // stop right after start() left the loop running and its join waiting forever.
  for (int i = 0; i < 10000 && !http_->is_running(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (!http_->is_running()) return Status::error("the HTTP accept loop did not start");
  return ok_status();
}

namespace {
// While a shutdown runs: once it has taken `grace`, gives up on the model's device servers, so
// that a step waiting on one that froze (stopped, deadlocked: it still acknowledges at the TCP
// level) fails as on a lost device and the shutdown can go on. Nothing on the CPU alone.
class DeviceStopWatchdog {
public:
  // grace_seconds <= 0: never give up.
  DeviceStopWatchdog(const model::Model *model, int grace_seconds) {
    if (!model || model->devices().size() <= 1 || grace_seconds <= 0) return;
    const model::Devices &devices = model->devices();
    thread_ = std::thread([this, &devices, grace_seconds] {
      std::unique_lock lock(mutex_);
      if (done_cv_.wait_for(lock, std::chrono::seconds(grace_seconds), [this] { return done_; }))
        return;
      devices.interrupt("offgraph is stopping and the step in flight waited " +
                        std::to_string(grace_seconds) + " s on its device servers");
    });
  }
  ~DeviceStopWatchdog() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    done_cv_.notify_all();
    thread_.join();
  }

private:
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::thread thread_;
};
} // namespace

void Server::stop() {
  // New requests get 503; waiting handlers cancel theirs, which the still-running engine loop
  // finishes, so that the HTTP threads can end; then the loop ends.
  if (stopping_.exchange(true)) return;
  {
    // Only while a step may still be waiting: once the engine's thread ended, nothing waits.
    DeviceStopWatchdog watchdog(model_, options_.device_stop_grace_seconds);
    wake_engine();
    if (http_) http_->stop();
    if (http_thread_.joinable()) http_thread_.join();
    engine_done_ = true;
    wake_engine();
    if (engine_thread_.joinable()) engine_thread_.join();
  }
  if (warm_thread_.joinable()) warm_thread_.join();
}

void Server::wait() {
  if (http_thread_.joinable()) http_thread_.join();
}

std::string Server::metrics_text() {
  MetricsInput in;
  in.ready = ready_;
  if (in.ready) {
    const engine::Engine::Load load = engine_->load();
    in.engine = engine_->published_stats();
    in.active = load.active;
    in.queued = engine_->queued();
    in.cached = load.cached;
    in.cached_bytes = load.cached_bytes;
    in.tree_nodes = load.tree_nodes;
    in.snapshots = load.snapshots;
    in.kv_budget = engine_->options().kv_budget;
    in.grammar_tables = facts_.vocabulary->shared_tables();
    in.grammar_table_bytes = facts_.vocabulary->shared_table_bytes();
    const engine::EngineOptions &eo = engine_->options();
    const int64_t row_bytes = int64_t(model_->config().n_vocab) * int64_t(sizeof(float));
    in.budgets = {
        {"kv", "--kv-mib", load.kv_in_use, eo.kv_budget},
        {"cached_conversations", "--cache-mib", load.cached_bytes, eo.cache_budget},
        {"snapshots", "--snapshot-mib", load.snapshot_bytes,
         std::max<int64_t>(0, load.snapshot_budget)},
        {"draft_kv", "--kv-mib", load.draft_kv, load.draft_kv_budget},
        // Logits of one step, the most so far against what one step can compute.
        {"step_logits", "", in.engine.peak_step_logit_rows * row_bytes,
         engine_->max_step_logit_rows() * row_bytes},
        {"grammar_tables", "--grammar-mib", int64_t(in.grammar_table_bytes),
         int64_t(facts_.vocabulary->shared_table_budget())},
    };
    // Compute buffers: every device's together, against the devices' budgets together (each
    // device's own: offgraph_device_memory_*{use="compute"}).
    int64_t compute = 0, compute_budget = 0;
    for (const engine::Engine::Load::DeviceBytes &b : load.by_device)
      if (std::string_view(b.use) == "compute") compute += b.bytes;
    for (const engine::Engine::Load::DeviceBytes &b : engine_->budget_by_device())
      if (std::string_view(b.use) == "compute") compute_budget += b.bytes;
    in.budgets.push_back({"compute", "--compute-mib", compute, compute_budget});
    if (facts_.images) {
      const engine::ImageEncoder::Stats is = facts_.images->stats();
      in.budgets.push_back({"image_rows", "--image-mib", is.live_bytes + is.reserved_bytes,
                            facts_.images->options().rows_budget});
      in.budgets.push_back(
          {"image_cache", "--image-cache", is.cached_bytes, facts_.images->options().cache_bytes});
    }
    const model::Devices &d = model_->devices();
    for (int32_t i = 0; i < d.size(); ++i)
      if (!d.is_cpu(i))
        in.devices.push_back({d.name(i), d.bytes_to(i), d.bytes_from(i), !d.failed(i)});
    // The ledger by device: weights (model::Model::device_weight_bytes), then what the engine
    // published.
    const std::vector<int64_t> weights = model_->device_weight_bytes();
    for (int32_t i = 0; i < d.size(); ++i)
      if (d.is_cpu(i) || weights[size_t(i)] > 0)
        in.device_memory.push_back({d.name(i), "weights", weights[size_t(i)]});
    for (const engine::Engine::Load::DeviceBytes &b : load.by_device)
      in.device_memory.push_back({d.name_of(b.buft), b.use, b.bytes});
    for (const engine::Engine::Load::DeviceBytes &b : engine_->budget_by_device())
      in.device_budgets.push_back({d.name_of(b.buft), b.use, b.bytes});
    std::lock_guard lock(published_mutex_);
    in.kv = published_kv_;
  }
  return render_metrics(in, counters_);
}

void Server::routes() {
  auto r = std::make_shared<Routes>(Routes{*this});
  httplib::Server &http = *http_;
  http.set_payload_max_length(options_.max_body_bytes);
  // Connections hold a handler thread each (cpp-httplib's model): idle and slow ones are cut
  // short so that they cannot starve the rest.
  http.set_read_timeout(options_.read_timeout_seconds, 0);
  http.set_keep_alive_timeout(options_.idle_seconds);
  http.set_write_timeout(options_.timeout_seconds, 0);

  // Auth first (every route but /health and CORS preflights), then CORS headers on every answer.
  http.set_pre_routing_handler([this](const httplib::Request &req, httplib::Response &res) {
    if (!options_.cors_origin.empty()) {
      res.set_header("Access-Control-Allow-Origin", options_.cors_origin);
      res.set_header("Access-Control-Allow-Headers",
                     "Authorization, Content-Type, x-api-key, anthropic-version, anthropic-beta");
      res.set_header("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
    }
    if (options_.api_key.empty() || req.path == "/health" || req.method == "OPTIONS")
      return httplib::Server::HandlerResponse::Unhandled;
    // Bearer (OpenAI's clients) or x-api-key (Anthropic's).
    const std::string auth = req.get_header_value("Authorization");
    const std::string x_api_key = req.get_header_value("x-api-key");
    const std::string prefix = "Bearer ";
    const std::string bearer = auth.rfind(prefix, 0) == 0 ? auth.substr(prefix.size()) : "";
    // Either may carry the key (both compared, in constant time).
    const bool bearer_ok = constant_time_equal(bearer, options_.api_key);
    const bool x_api_key_ok = constant_time_equal(x_api_key, options_.api_key);
    if (bearer_ok || x_api_key_ok) return httplib::Server::HandlerResponse::Unhandled;
    ++counters_.unauthorized;
    res.set_header("WWW-Authenticate", "Bearer");
    const ApiError e{401,
                     auth.empty() && x_api_key.empty()
                         ? "an API key is required: Authorization: Bearer <key> or x-api-key"
                         : "the API key is not valid",
                     "", "invalid_api_key"};
    send(res, 401, is_anthropic_route(req.path) ? anthropic::error_body(e) : error_body(e));
    return httplib::Server::HandlerResponse::Handled;
  });
  if (!options_.cors_origin.empty())
    http.Options(".*", [](const httplib::Request &, httplib::Response &res) { res.status = 204; });

  http.Get("/health", [this](const httplib::Request &, httplib::Response &res) {
    if (!ready_) return send(res, 503, {{"status", "loading model"}});
    if (std::string gone = model_->devices().failure(); !gone.empty())
      return send(res, 503, {{"status", "device lost"}, {"error", gone}});
    send(res, 200, {{"status", "ok"}});
  });
  http.Get("/metrics", [this](const httplib::Request &, httplib::Response &res) {
    res.set_content(metrics_text(), "text/plain; version=0.0.4");
  });
  http.Get("/v1/models", [this, r](const httplib::Request &, httplib::Response &res) {
    if (r->loading(res)) return;
    // The id first, then every other name the model answers to (patterns as given).
    json aliases = json::array();
    for (const std::string &n : options_.model_aliases)
      if (n != options_.model_name) aliases.push_back(n);
    send(res, 200,
         {{"object", "list"},
          {"data", json::array({{{"id", options_.model_name},
                                 {"object", "model"},
                                 {"owned_by", "offgraph"},
                                 {"created", now_seconds()},
                                 {"aliases", aliases},
                                 {"meta",
                                  {{"n_ctx", facts_.context},
                                   {"n_vocab", facts_.n_vocab},
                                   {"architecture", facts_.arch}}}}})}});
  });
  http.Post("/v1/chat/completions", [r](const httplib::Request &req, httplib::Response &res) {
    r->completion(req, res, true);
  });
  http.Post("/v1/completions", [r](const httplib::Request &req, httplib::Response &res) {
    r->completion(req, res, false);
  });
  http.Post("/v1/messages", [r](const httplib::Request &req, httplib::Response &res) {
    r->messages(req, res, false);
  });
  http.Post("/v1/messages/count_tokens", [r](const httplib::Request &req, httplib::Response &res) {
    r->messages(req, res, true);
  });
  http.Post("/v1/responses", [r](const httplib::Request &req, httplib::Response &res) {
    r->responses_post(req, res);
  });
  http.Get("/v1/responses/([A-Za-z0-9_]+)",
           [r](const httplib::Request &req, httplib::Response &res) {
             r->responses_get(req, res, false);
           });
  http.Delete("/v1/responses/([A-Za-z0-9_]+)",
              [r](const httplib::Request &req, httplib::Response &res) {
                r->responses_get(req, res, true);
              });
  http.Post("/tokenize",
            [r](const httplib::Request &req, httplib::Response &res) { r->tokenize(req, res); });
  http.Post("/detokenize",
            [r](const httplib::Request &req, httplib::Response &res) { r->detokenize(req, res); });
  http.Post("/apply-template", [r](const httplib::Request &req, httplib::Response &res) {
    r->apply_template(req, res);
  });

  // httplib's own refusals (no route, body too large, ...) get a JSON body that says why.
  http.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request &req,
                                                                     httplib::Response &res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    ApiError e{res.status, "HTTP " + std::to_string(res.status), "", ""};
    if (res.status == 404) e = {404, "no route " + req.method + " " + req.path, "", "not_found"};
    if (res.status == 413)
      e = {413,
           "the request body is larger than the limit of " +
               std::to_string(options_.max_body_bytes) + " bytes",
           "", "body_too_large"};
    if (res.status == 405) e = {405, req.method + " is not allowed on " + req.path, "", ""};
    (e.status >= 500 ? counters_.server_errors : counters_.client_errors)++;
    res.set_content(dump(is_anthropic_route(req.path) ? anthropic::error_body(e) : error_body(e)),
                    "application/json");
    return httplib::Server::HandlerResponse::Handled;
  }));
  http.set_exception_handler(
      [this](const httplib::Request &req, httplib::Response &res, std::exception_ptr ep) {
        std::string what = "internal error";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception &x) {
          what += std::string(": ") + x.what();
        } catch (...) {
        }
        ++counters_.server_errors;
        const ApiError e{500, what, "", "internal_error", "server_error"};
        send(res, 500, is_anthropic_route(req.path) ? anthropic::error_body(e) : error_body(e));
      });
}

} // namespace offgraph::server
