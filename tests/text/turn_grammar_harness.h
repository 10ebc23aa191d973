// What the turn-grammar tests of every chat format share: a real vocabulary loaded once, its
// grammar token texts, and a format's turn grammar compiled against them.
#pragma once

#include "sample/grammar_matcher.h"
#include "text/chat/turn_grammar.h"
#include "text/tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

namespace offgraph::text::testing {

class TurnGrammarHarness {
public:
  using Build = Result<sample::Grammar> (*)(const Tokenizer &, const TurnSpec &);

  // `vocab_gguf`: a file of the pinned tree's models/ folder.
  TurnGrammarHarness(const std::string &vocab_gguf, Build build) : build_(build) {
    auto r = Tokenizer::from_gguf(std::string(OFFGRAPH_LLAMA_TREE) + "/models/" + vocab_gguf);
    EXPECT_TRUE(r.ok()) << r.message();
    tokenizer_ = std::move(r).value();
    vocabulary_ = std::make_shared<sample::GrammarVocabulary>(grammar_token_texts(*tokenizer_));
  }

  const Tokenizer &tokenizer() const { return *tokenizer_; }
  const std::shared_ptr<const sample::GrammarVocabulary> &vocabulary() const { return vocabulary_; }

  std::shared_ptr<const sample::CompiledGrammar> compile(const TurnSpec &spec) const {
    auto g = build_(*tokenizer_, spec);
    EXPECT_TRUE(g.ok()) << g.message();
    if (!g.ok()) return nullptr;
    auto c = sample::compile_grammar(std::move(g).value(), vocabulary_,
                                     tokenizer_->end_of_generation_ids());
    EXPECT_TRUE(c.ok()) << c.message();
    return std::move(c).value();
  }

private:
  Build build_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::shared_ptr<const sample::GrammarVocabulary> vocabulary_;
};

} // namespace offgraph::text::testing
