// Structured output: response_format, llama-server's `grammar`, strict tools and tool_choice
// become the grammar the engine constrains sampling with (Request::grammar). Compiled grammars
// are cached by what they were built from, since compiling walks the whole vocabulary.
#pragma once

#include "sample/grammar_matcher.h"

#include <nlohmann/json.hpp>

#include <atomic>
#include <list>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

namespace offgraph::server {

struct ApiError;
struct ModelFacts;
struct Job;
struct Conversation;

// Compiled grammars by key, least recently used dropped first. Thread-safe.
class GrammarCache {
public:
  explicit GrammarCache(size_t capacity = 64) : capacity_(capacity) {}
  std::shared_ptr<const sample::CompiledGrammar> find(const std::string &key);
  void put(const std::string &key, std::shared_ptr<const sample::CompiledGrammar> grammar);
  size_t size() const;

private:
  using Entry = std::pair<std::string, std::shared_ptr<const sample::CompiledGrammar>>;
  size_t capacity_;
  mutable std::mutex mutex_;
  std::list<Entry> order_; // most recent first
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
};

// Makes, on a thread of its own, the mask tables most constrained answers reach (JSON strings,
// numbers and whitespace; on ATEM models also the free text of reasoning and the escaped JSON of
// answers), so that the first such request does not pay their full-vocabulary walks on the
// engine's thread. What needs the tokenizer is done before it returns; the thread then reads only
// the vocabulary, and stops early once `cancel` is set (it must outlive the thread). A failure
// (a bug in the samples) is written to stderr.
std::thread start_grammar_warm_up(const ModelFacts &facts, const std::atomic<bool> &cancel);

// Sets job.request.grammar when the conversation asks for a constrained answer: its
// response_format, grammar, parallel_tool_calls, tool_choice and reasoning effort, and the strict
// ones among job.tools (the tools the answer may call, after tool_choice). `chat` false: only
// response_format and grammar count (a completion's whole text). Errors: 400 naming the field,
// with code invalid_json_schema for a schema that cannot be enforced and invalid_grammar for bad
// GBNF.
std::optional<ApiError> parse_structured(const Conversation &conv, bool chat,
                                         const ModelFacts &facts, Job &job);

} // namespace offgraph::server
