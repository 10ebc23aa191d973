// What a constrained turn may hold, whatever the chat format spells it in (TurnSpec: the answer's
// content, the tools it may call, reasoning first or not, one call or several), and the grammar
// parts every format's turn grammar shares (text/atem/atem_grammar, text/gemma4/gemma4_grammar):
// markers as the model writes them, the answer's content, raw strings kept free of the markers a
// parser reads, the token texts grammars read.
#pragma once

#include "base/status.h"
#include "sample/grammar.h"
#include "sample/json_schema.h"
#include "sample/token_texts.h"
#include "text/tokenizer/tokenizer.h"

#include <nlohmann/json.hpp>

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace offgraph::text {

struct TurnSpec {
  enum class Content { kText, kJsonObject, kJsonSchema, kGrammar };
  // Whether the turn may end in an answer to the user (tool_choice none or auto), and what it
  // holds.
  bool answer = true;
  Content content = Content::kText;
  nlohmann::ordered_json schema; // kJsonSchema: the answer's JSON Schema
  bool schema_strict = false;
  sample::Grammar grammar; // kGrammar: what the answer holds (the request's GBNF)
  struct Tool {
    std::string name;
    nlohmann::ordered_json parameters; // a JSON Schema of type object
    bool strict = false;
    // A custom tool's free-form input: the tool's one string property is written raw under this
    // grammar (with the markers the parser reads taken out of its language, so that what the
    // grammar allows reads back whole). Makes the call strict.
    std::optional<sample::Grammar> raw_input;
  };
  std::vector<Tool> tools;    // the tools the turn may call (tool_choice named: that one)
  bool reasoning = true;      // reasoning may come first
  bool parallel_calls = true; // several calls in one turn (parallel_tool_calls)
};

// `text` as the model writes it: the vocabulary's control tokens as themselves, the rest as bytes
// (user-defined tokens included: their text is what a parser reads).
sample::Sequence marked(sample::GrammarBuilder &b, const Tokenizer &t, std::string_view text);
sample::Sequence join(std::initializer_list<sample::Sequence> parts);

// The answer's content under spec.content: free text is `text`; JSON is written with '<' escaped
// (no chat marker can be spelled inside it). `compiler` is made here and must outlive the builder
// use.
Result<sample::Element> answer_content(sample::GrammarBuilder &b, const TurnSpec &spec,
                                       sample::Element text,
                                       std::optional<sample::JsonSchemaCompiler> &compiler);

// A string argument written raw (neither quoted nor escaped): the schema's strings with
// `markers` taken out exactly, so that code with '<' in it can be written. The product costs
// about 90 rules per count of a bounded string, so each value may take up to
// kMaxExcludedValueRules out of a turn's `budget`; past either, strings without `fallback_stop`
// (a byte every marker begins with): sound, and small.
inline constexpr size_t kMaxExcludedValueRules = 8000;
inline constexpr size_t kExcludedRulesPerTurn = 40000;
Result<sample::Element>
raw_string_value(sample::GrammarBuilder &b, sample::JsonSchemaCompiler &compiler,
                 const nlohmann::ordered_json &params, const nlohmann::ordered_json &schema,
                 const std::string &path, size_t &budget, std::span<const std::string> markers,
                 std::string_view fallback_stop);

// Whether a schema's type admits strings.
bool accepts_string(const nlohmann::ordered_json &schema);

// What each token id writes, as grammars read it: the bytes of ordinary tokens, the text of
// control ones (flagged special).
std::shared_ptr<const sample::TokenTexts> grammar_token_texts(const Tokenizer &tokenizer);

// For models without a known chat format: the whole output is the answer's content alone
// (spec.content other than kText; tools and reasoning do not apply).
Result<sample::Grammar> plain_answer_grammar(const TurnSpec &spec);

} // namespace offgraph::text
