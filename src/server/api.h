// The OpenAI request surface: JSON bodies in, engine requests out, with errors in OpenAI's shape
// that name the field at fault. Pure functions of the body and the loaded model's facts, so that
// they can be tested and fuzzed without a server.
#pragma once

#include "engine/engine.h"
#include "engine/images.h"
#include "server/request.h"
#include "server/structured.h"
#include "text/chat/chat_format.h"
#include "text/template/chat_template.h"
#include "text/tokenizer/tokenizer.h"

#include <nlohmann/json.hpp>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace offgraph::server {

using json = nlohmann::ordered_json;

// An API error: {"error": {"message", "type", "param", "code"}} with an HTTP status.
struct ApiError {
  int status = 400;
  std::string message;
  std::string param; // the request field at fault, if one is
  std::string code;  // a machine-readable reason, if one applies
  std::string type = "invalid_request_error";
};
json error_body(const ApiError &e);
// A Status from below as an API error: its code chooses the HTTP status and the error type.
ApiError api_error(const Status &s);

// What request parsing needs to know of the served model.
struct ModelFacts {
  const text::Tokenizer *tokenizer = nullptr;
  const text::Template *chat_template = nullptr;      // null: the model has none
  text::ChatFormat format = text::ChatFormat::kPlain; // what the template speaks (chat_format.h)
  // A Gemma 4 template that reads tool results only from `tool_responses` (fold_tool_results).
  bool fold_tool_results = false;
  std::string arch;
  sample::SamplingParams sampling; // a request's defaults (engine::default_sampling)
  int32_t n_vocab = 0;
  int32_t context = 0;                  // per sequence
  int32_t max_tokens_cap = 0;           // the most tokens one request may ask for
  std::vector<std::string> model_names; // ids a request may name
  // For constrained output (structured.h): the vocabulary as grammars see it, and the grammars
  // compiled against it so far.
  std::shared_ptr<const sample::GrammarVocabulary> vocabulary;
  std::shared_ptr<GrammarCache> grammars;
  // The server's speculative decoding, which the request's speculative.* fields adjust.
  engine::SpeculationOptions speculation;
  bool draft_model = false; // one is loaded (speculative.type "draft")
  // Images in (--mmproj): the encoder (null: image parts are refused), the tokens an image part
  // is written with, and the most images one request may hold.
  engine::ImageEncoder *images = nullptr;
  engine::ImageMarkers image_markers;
  int32_t max_images = 8;
  // Set when the server stops: a request waiting for image memory gives up (503).
  const std::atomic<bool> *stopping = nullptr;
};

// One HTTP request turned into engine work and the instructions to assemble its answer.
struct Job {
  engine::Request request;
  bool chat = true;
  bool stream = false;
  // The model's reasoning shown in the answer (Anthropic's: only when `thinking` asks for it).
  bool show_reasoning = true;
  bool include_usage = false; // stream_options.include_usage
  std::vector<std::string> stop_strings;
  json tools = json::array();
  // /v1/completions `echo`: the answer's text starts with the prompt's (scored with the
  // prompt's log-probabilities when `logprobs` is set: Request::prompt_logprobs).
  bool echo = false;
  std::string echo_text;
  bool prediction = false;       // `prediction` given (usage then reports its counts)
  int32_t max_tokens_asked = -1; // the request's max_tokens (-1: not given)
  // Image parts' bytes in prompt order, and the field each came from, until attach_images
  // (image_parts.h) encodes them; then the rows they put in the prompt.
  std::vector<std::vector<uint8_t>> images;
  std::vector<std::string> image_params;
  int32_t image_tokens = 0;
};

// Parses /v1/chat/completions (chat) or /v1/completions bodies. The chat template is rendered
// here; callers serialize calls that share a tokenizer or template if those are not thread-safe.
std::optional<ApiError> parse_request(const json &body, bool chat, const ModelFacts &facts,
                                      Job &job);

// A conversation (request.h) read by any chat API into `job`, whose sampling fields and
// max_tokens_asked the API's parser has set: the conversation checked, the chat template
// rendered, the answer's constraints built, the prompt measured against the context.
std::optional<ApiError> build_chat_job(const Conversation &conv, const ModelFacts &facts, Job &job);

// Parts every API's parser shares. `model` against the names the server answers to (404
// model_not_found otherwise).
std::optional<ApiError> check_model(const json &body, const ModelFacts &facts);
// max_tokens (or max_completion_tokens), temperature, top_p, top_k, min_p, penalties, seed,
// logit_bias, n, stream_options, stop: into job.request.sampling, job.stop_strings and
// `max_tokens` (-1 when not given; 0 only where `zero_ok`).
std::optional<ApiError> parse_sampling(const json &body, const ModelFacts &facts, Job &job,
                                       int32_t &max_tokens, bool zero_ok);

// The exact prompt text the model would see for a chat body (messages, tools, reasoning_effort),
// as /apply-template returns it.
std::optional<ApiError> render_chat_prompt(const json &body, const ModelFacts &facts,
                                           std::string &prompt);

// The prompt and max_tokens against the context (max_tokens from the context when not asked):
// parse_request's last check, or attach_images' with the length the prompt will have once its
// images are in it (`prompt_tokens`; by default job.request.prompt's).
std::optional<ApiError> check_prompt_budget(const ModelFacts &facts, Job &job,
                                            std::optional<int64_t> prompt_tokens = std::nullopt);

// Parses a request body, refusing (instead of recursing into) nesting deeper than `max_depth`:
// a body of a million '[' must not exhaust the stack.
std::optional<ApiError> parse_body(std::string_view text, json &out, int max_depth = 64);

} // namespace offgraph::server
