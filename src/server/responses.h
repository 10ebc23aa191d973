// OpenAI's Responses API (POST /v1/responses, GET/DELETE /v1/responses/{id}): bodies read into
// the wire-neutral request (request.h, api.h), output items and stream events written from a
// choice's output (output.h), a bounded store for previous_response_id. Pure functions but the
// store, tested without a server.
#pragma once

#include "server/api.h"
#include "server/output.h"

#include <list>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace offgraph::server::responses {

using json = nlohmann::ordered_json;

// What a response keeps for a later one that continues it: its whole input (the items before it,
// its instructions) and its output, and the response object GET returns.
struct Stored {
  json input = json::array(); // the items the model read, previous responses' included
  json output = json::array();
  json response; // the response object
};

// The last `capacity` stored responses, least recently used dropped first. Thread-safe.
class Store {
public:
  explicit Store(size_t capacity) : capacity_(capacity) {}
  size_t capacity() const { return capacity_; }
  void put(const std::string &id, Stored s);
  std::optional<Stored> get(const std::string &id);
  bool erase(const std::string &id);

private:
  size_t capacity_;
  std::mutex mutex_;
  std::list<std::pair<std::string, Stored>> order_; // most recent first
  std::unordered_map<std::string, std::list<std::pair<std::string, Stored>>::iterator> index_;
};

// What the request asked that the answer's shape needs besides the Job.
struct Request {
  json input = json::array(); // every item the model reads (a previous response's first)
  std::string instructions;
  bool store = true;
  std::string previous_response_id;
  bool encrypted_reasoning = false;       // include: reasoning.encrypted_content
  bool summary = false;                   // reasoning.summary asked
  std::vector<std::string> dropped_tools; // hosted tools left out (drop_hosted_tools)
  json echo = json::object();             // the request's fields the response object repeats
  // How calls come back: a namespace tool's full name (namespace.function) to {"namespace",
  // "name"}; a custom tool's name to {"name", "custom": true} (custom_tool_call items).
  json tool_shapes = json::object();
};

struct Options {
  Store *store = nullptr;         // null or capacity 0: store and previous_response_id refused
  bool drop_hosted_tools = false; // hosted tools (web_search, ...) left out and reported
};

// A Responses body into `job` and `req`.
std::optional<ApiError> parse(const json &body, const ModelFacts &facts, const Options &options,
                              Job &job, Request &req);

// The output items a choice's answer makes, and the stream events each addition makes: one item
// open at a time (reasoning, message, function_call, custom_tool_call), every event with its
// sequence_number, output_index and (for parts) content_index; an output_item.done item is the one
// the final output holds.
class OutputBuilder {
public:
  // `tool_shapes`: Request::tool_shapes.
  OutputBuilder(std::string response_id, bool encrypted_reasoning, bool summary, json tool_shapes)
      : id_(std::move(response_id)), encrypted_(encrypted_reasoning), summary_(summary),
        tool_shapes_(std::move(tool_shapes)) {}
  std::vector<json> add(const ChoiceOutput::Delta &delta);
  std::vector<json> close();
  const json &output() const { return output_; }
  // Numbers an event of the stream (the response's own events too).
  json event(json e);

private:
  enum class Open { None, Reasoning, Message };
  void open(Open kind, std::vector<json> &out);
  std::vector<json> custom_call(size_t index, const json &call);
  std::vector<json> finished_call(size_t index, json item, const std::string &events,
                                  const char *field, const std::string &text);
  std::string id_;
  bool encrypted_, summary_;
  json tool_shapes_;
  Open open_ = Open::None;
  json output_ = json::array();
  int64_t sequence_ = 0;
  int calls_ = 0;
};

// A reasoning item's encrypted_content: the reasoning, so that a client that keeps no state
// (store false) gives it back; opaque to it, read back by parse().
std::string encrypt_reasoning(const std::string &text);

struct Outcome {
  std::string status;     // completed, incomplete, failed
  std::string incomplete; // max_output_tokens (status incomplete)
  std::string error;      // status failed
  json usage;
};
json usage(size_t prompt_tokens, int cached_tokens, int output_tokens, int reasoning_tokens);
// The response object: in_progress (no outcome yet) or final.
json response_object(const std::string &id, int64_t created, const std::string &model,
                     const Request &req, const json &output, const Outcome *outcome);

} // namespace offgraph::server::responses
