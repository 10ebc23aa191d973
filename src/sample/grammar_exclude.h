// A grammar with some substrings taken out of its language: what a chat format needs around text
// that a caller's grammar governs. A custom tool's input is written raw inside an ATEM parameter,
// where the markers the parser reads ("<|", "<atem:", "</atem:") must not appear; the caller's
// grammar says nothing of them. Intersecting the two keeps every sentence that holds none of the
// forbidden strings, and only those: exact, not an approximation such as leaving '<' out.
#pragma once

#include "base/status.h"
#include "sample/grammar.h"

#include <span>
#include <string>

namespace offgraph::sample {

// Most bytes the forbidden strings may hold together: the automaton's states are their prefixes.
inline constexpr size_t kMaxExcludedBytes = 63;

// The sentences of `grammar` that contain none of `forbidden` as a byte substring. A special
// token is not text: a forbidden string never spans one. Errors: an empty or over-long forbidden
// set, a grammar whose every sentence holds one ("matches nothing once ... is left out"), or a
// result past `max_rules` (at most kMaxGrammarRules: the construction pairs each rule and
// position with automaton states; a caller with a cheaper way out passes a smaller budget).
Result<Grammar> exclude_substrings(const Grammar &grammar, std::span<const std::string> forbidden,
                                   size_t max_rules = kMaxGrammarRules);

} // namespace offgraph::sample
