// A grammar walked against a vocabulary: which tokens may come next, and the state after each.
//
// The grammar runs as a pushdown automaton over bytes. A state is a set of stacks; a stack is a
// chain of grammar positions (the top one a terminal: a byte set or a special token), stored
// hash-consed so that equal stacks are one id and a state is a sorted list of ids. A token is
// allowed when feeding its bytes (or, for a special token, its symbol) leaves some stack alive.
//
// Masks follow XGrammar's idea. The first time a stack stands at a terminal position, the
// vocabulary is walked, as a trie, from that position with nothing known below it, sorting the
// tokens into accepted there whatever the stack below (a path consumed them inside the position's
// rule), rejected whatever it (every path died inside, or left the rule on a byte that cannot
// follow the rule anywhere), and uncertain (a path left the rule with bytes to read). At run time a
// mask is the union of the accepted tokens of each stack's top, plus the uncertain ones that
// survive a walk on the real stack. Masks are cached per state, which repeats whenever a rule loops
// (inside a string, a number, a list), so most steps cost a lookup.
#pragma once

#include "base/status.h"
#include "sample/grammar.h"
#include "sample/token_texts.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace offgraph::sample {

struct GrammarTableCache;

// The ordinary tokens of a vocabulary as a byte trie, built once per model and shared by every
// compiled grammar. Special tokens (TokenTexts::special) stay out of it: they match only a
// grammar's special elements. Tokens that write no bytes are never allowed under a grammar.
// It also holds the mask tables that grammars share (thread-safe; see grammar_tables.cpp).
class GrammarVocabulary {
public:
  explicit GrammarVocabulary(std::shared_ptr<const TokenTexts> texts);
  size_t size() const { return texts_->bytes.size(); }
  const TokenTexts &texts() const { return *texts_; }
  bool is_special(int32_t token) const;

  // Depth-first preorder; a node's subtree runs to `skip`.
  struct Node {
    uint8_t byte;
    uint16_t depth; // bytes from the root (the root is depth 0); tokens are cut at 65,535
    uint32_t skip;  // the first node after this one's subtree
    uint32_t first; // tokens ending here: token_ids[first, last)
    uint32_t last;
  };
  const std::vector<Node> &nodes() const { return nodes_; }
  const std::vector<int32_t> &token_ids() const { return token_ids_; }
  // The most bytes an ordinary token writes (cut at 65,535 as in the trie).
  size_t longest_token() const { return longest_token_; }

  GrammarTableCache &table_cache() const { return *tables_; }
  // The shared tables held now, and their size.
  size_t shared_tables() const;
  size_t shared_table_bytes() const;
  // Bytes past which the least recently used tables go (those a grammar holds stay with it, and
  // the most recent one always): 256 MiB unless set.
  size_t shared_table_budget() const;
  void set_shared_table_budget(size_t bytes);

private:
  std::shared_ptr<const TokenTexts> texts_;
  std::shared_ptr<GrammarTableCache> tables_;
  std::vector<Node> nodes_;
  std::vector<int32_t> token_ids_;
  size_t longest_token_ = 0;
};

class CompiledGrammar;

// Compiles `grammar` against `vocabulary`. `end_tokens` are the tokens allowed once the grammar
// is complete (the model's end-of-turn tokens): nothing else may follow a complete sentence.
Result<std::shared_ptr<const CompiledGrammar>>
compile_grammar(Grammar grammar, std::shared_ptr<const GrammarVocabulary> vocabulary,
                std::vector<int32_t> end_tokens);

// What compilation measured, for benchmarks and logs. Position tables are computed on first use
// for the stack contexts answers reach (CompiledGrammar::table says why): `computed_tables`
// tables so far, against `terminal_positions` positions in the grammar.
struct GrammarCompileStats {
  size_t terminal_positions = 0, computed_tables = 0; // tables: one per stack context reached
  // Of those, the ones another grammar had made (shared through the vocabulary), and the ones
  // sorted again from another grammar's table for a wider FOLLOW set: neither walked the trie.
  size_t shared_tables = 0, refined_tables = 0;
  // Of those, the ones in a bounded repetition derived from a walk that counts its iterations
  // (one walk for every count; itself shared like a table), and the counting walks made.
  size_t counted_tables = 0, counting_walks = 0;
  size_t trie_nodes_walked = 0;       // by the tables this grammar walked the trie for: their cost
  size_t accepted = 0, uncertain = 0; // summed over computed positions (accepted: when listed)
  double seconds = 0;                 // compile_grammar itself
  double table_seconds = 0;           // computing position tables, so far
};
GrammarCompileStats compile_stats(const CompiledGrammar &grammar);
// Computes a one-frame table (nothing known below) for every position, for benchmarks. These
// are not the contexts a matcher asks for (three frames, or rooted ones): a server computes
// tables for the contexts answers reach, as they reach them, and warms common ones with
// warm_up.
void precompute_all(const CompiledGrammar &grammar);
size_t grammar_vocabulary_size(const CompiledGrammar &grammar);

// Computes the masks, and so the tables, that a walk of `symbols` (0-255 a byte, 256 + id a
// special token) reaches, stopping after every byte so that any tokenization of the text finds
// its tables made. A warm-up on representative answers, off the engine thread: the tables are
// shared through the vocabulary with every grammar that has the same rules. Fails, naming the
// position, if the grammar refuses the text. Stops early, successfully, once `*cancel` is set.
Status warm_up(std::shared_ptr<const CompiledGrammar> grammar, std::span<const int32_t> symbols,
               const std::atomic<bool> *cancel = nullptr);

// What fill_mask fails with where the grammar is too ambiguous to walk.
Status too_ambiguous_error();

// The per-request state. Not thread-safe; the CompiledGrammar it reads is shared and immutable.
class GrammarMatcher {
public:
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar);
  // Copies are independent (a forked choice goes on from here on its own).
  GrammarMatcher(const GrammarMatcher &other);
  GrammarMatcher &operator=(const GrammarMatcher &other);
  GrammarMatcher(GrammarMatcher &&) = default;
  GrammarMatcher &operator=(GrammarMatcher &&) = default;

  // Feeds a sampled token. False (and the state unchanged) if the grammar does not allow it, or
  // if reading it meets more than kMaxStacks parses at once (then too_ambiguous() is true).
  bool accept_token(int32_t token);
  // Feeds bytes (tests, and text forced by other means). False, state unchanged, if refused (as
  // accept_token: a refusal for ambiguity leaves too_ambiguous() set).
  bool accept_bytes(std::string_view bytes);
  // The grammar is complete here (an end token may come; more may also, if the grammar allows).
  bool can_end() const;
  // An end token was accepted: nothing more is allowed.
  bool finished() const { return finished_; }
  // The walk met more than kMaxStacks parses (at the start, or reading a token or bytes the mask
  // allowed: the mask checks each parse's tables alone, the step reads all of them together).
  // From then on fill_mask fails with the same error.
  bool too_ambiguous() const { return ambiguous_; }

  // Allowed next tokens as a bitset over token ids ((vocabulary size + 63) / 64 words). Fails
  // only where the grammar is too ambiguous to walk (more than kMaxStacks stacks at once, here or
  // in a table this state needs): an error, never a mask that silently lost parses.
  Status fill_mask(std::vector<uint64_t> &bits);
  // Sets every disallowed token's logit to -infinity.
  Status mask_logits(std::span<float> logits);

  static constexpr size_t kMaxStacks = 4096;

private:
  struct Cached {
    std::vector<uint32_t> state;
    std::vector<uint64_t> bits;
  };
  bool advance(uint32_t symbol);
  void compact();

  std::shared_ptr<const CompiledGrammar> grammar_;
  struct Arena;
  std::shared_ptr<Arena> arena_; // the stacks' nodes
  std::vector<uint32_t> state_;  // sorted top node ids; kComplete marks a finished sentence
  bool finished_ = false;
  bool ambiguous_ = false; // some walk met more than kMaxStacks stacks
  std::vector<Cached> cache_;
  size_t cache_next_ = 0;
  std::vector<uint64_t> scratch_bits_;
  static constexpr size_t kCompactAt = 65536; // arena nodes before compaction is tried
  size_t compact_at_ = kCompactAt;
};

} // namespace offgraph::sample
