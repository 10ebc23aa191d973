// JSON Schemas, GBNF and Lark grammars from arbitrary input, compiled and walked.
// Input: a mode byte (bit 2: Lark, else bit 0: GBNF, else a JSON Schema; bit 1: strict; bit 3:
// "<|" and "ab" taken out of the language by exclude_substrings), the source text up to a NUL,
// then NUL-separated test strings, then the bytes that steer a random walk.
// Properties: every input compiles or is refused with a message, never a crash or a hang; the
// compiled automaton agrees with the direct (Earley) interpretation of the grammar on every test
// string and on the text of a walk through its own masks; every mask token is accepted; a schema's
// grammar accepts only text that parses as JSON.
#include "fuzz_util.h"

#include "sample/gbnf.h"
#include "sample/grammar_exclude.h"
#include "sample/grammar_matcher.h"
#include "sample/json_schema.h"
#include "sample/lark.h"

#include <nlohmann/json.hpp>

#include <memory>
#include <vector>

using namespace offgraph;

namespace {

// Every byte alone, pieces that cross JSON token boundaries, multi-byte UTF-8, and one special.
std::shared_ptr<const sample::GrammarVocabulary> vocabulary() {
  static const auto v = [] {
    auto t = std::make_shared<sample::TokenTexts>();
    for (int b = 0; b < 256; ++b) t->bytes.push_back(std::string(1, char(b)));
    for (const char *p : {"{\"",
                          "\":",
                          "\",",
                          "\"}",
                          "true",
                          "false",
                          "null",
                          "12",
                          "-0.",
                          "e+",
                          "\n ",
                          ", \"",
                          "[]",
                          "{}",
                          "\\u00",
                          "é",
                          "\xF0\x9F\x98\x80",
                          "ab",
                          "root",
                          "::=",
                          "a\"",
                          "\"a"})
      t->bytes.push_back(p);
    t->bytes.push_back("<|end|>");
    t->special.assign(t->bytes.size(), 0);
    t->special.back() = 1;
    return std::make_shared<sample::GrammarVocabulary>(t);
  }();
  return v;
}

bool earley(const sample::Grammar &g, const std::string &s) {
  auto r = sample::grammar_accepts(g, s);
  FUZZ_CHECK(r.ok(), "grammar_accepts failed on a valid grammar: %s", r.message().c_str());
  return *r;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz::Input in(data, size);
  const uint8_t mode = in.byte();
  const std::string source = in.until(0);
  Result<sample::Grammar> grammar = Status::error("");
  const bool schema = !(mode & 1) && !(mode & 4);
  if (mode & 4) {
    grammar = sample::parse_lark(source);
  } else if (schema) {
    const auto j = nlohmann::ordered_json::parse(source, nullptr, false);
    if (j.is_discarded()) return 0;
    grammar = sample::json_schema_grammar(j, {.strict = bool(mode & 2)});
  } else {
    grammar = sample::parse_gbnf(source);
  }
  if (!grammar.ok()) {
    FUZZ_CHECK(!grammar.message().empty(), "a refusal without a message");
    return 0;
  }
  // Earley is cubic: keep what it checks small.
  if (grammar->rules.size() > 3000) return 0;
  if (mode & 8) {
    // The excluded grammar against its definition: the original's sentences without the strings.
    const std::vector<std::string> forbidden = {"<|", "ab"};
    auto excluded = sample::exclude_substrings(*grammar, forbidden);
    if (!excluded.ok()) {
      FUZZ_CHECK(excluded.message().find("matches nothing") != std::string::npos ||
                     excluded.message().find("grows past") != std::string::npos,
                 "exclude_substrings refused a valid grammar: %s", excluded.message().c_str());
      return 0;
    }
    if (excluded->rules.size() > 3000) return 0;
    fuzz::Input probe(data, size); // the test strings again, from the start
    probe.byte();
    probe.until(0);
    for (int k = 0; k < 6 && !probe.empty(); ++k) {
      std::string t = probe.until(0);
      if (t.size() > 200) t.resize(200);
      const bool want = earley(*grammar, t) && t.find("<|") == std::string::npos &&
                        t.find("ab") == std::string::npos;
      FUZZ_CHECK(earley(*excluded, t) == want, "exclude_substrings: %d on '%s', want %d",
                 int(!want), t.c_str(), int(want));
    }
    grammar = std::move(excluded);
  }
  const int32_t end = int32_t(vocabulary()->size() - 1);
  auto compiled = sample::compile_grammar(*grammar, vocabulary(), {end});
  if (!compiled.ok()) {
    // The one refusal of a valid grammar: it matches nothing (its root derives no finite string,
    // e.g. every alternative recurses). Earley must then accept none of the input's strings.
    FUZZ_CHECK(compiled.message().find("matches nothing") != std::string::npos,
               "a valid grammar failed to compile: %s", compiled.message().c_str());
    for (int k = 0; k < 6 && !in.empty(); ++k) {
      std::string s = in.until(0);
      if (s.size() > 200) s.resize(200);
      FUZZ_CHECK(!earley(*grammar, s), "compile refused as matching nothing, Earley accepts '%s'",
                 s.c_str());
    }
    return 0;
  }

  for (int k = 0; k < 6 && !in.empty(); ++k) {
    std::string s = in.until(0);
    if (s.size() > 200) s.resize(200);
    sample::GrammarMatcher m(*compiled);
    const bool matcher = m.accept_bytes(s) && m.can_end();
    if (m.too_ambiguous()) continue; // more parses than the matcher walks: refused, not wrong
    FUZZ_CHECK(matcher == earley(*grammar, s), "matcher %d, Earley %d on '%s'", int(matcher),
               int(!matcher), s.c_str());
    if (schema && matcher)
      FUZZ_CHECK(!nlohmann::json::parse(s, nullptr, false).is_discarded(),
                 "the schema's grammar accepted non-JSON '%s'", s.c_str());
  }

  // A walk through the masks, steered by the rest of the input.
  sample::GrammarMatcher m(*compiled);
  std::vector<uint64_t> bits;
  std::string text;
  for (int step = 0; step < 48 && !m.finished(); ++step) {
    if (!m.fill_mask(bits).ok()) return 0; // too ambiguous: refused, not a failure
    std::vector<int32_t> allowed;
    for (size_t t = 0; t < vocabulary()->size(); ++t)
      if ((bits[t >> 6] >> (t & 63)) & 1) allowed.push_back(int32_t(t));
    if (allowed.empty()) break;
    const int32_t pick = allowed[in.u32() % allowed.size()];
    const bool accepted = m.accept_token(pick);
    // Reading it met more parses than the matcher walks: refused with an error, not a failure.
    if (!accepted && m.too_ambiguous()) {
      FUZZ_CHECK(!m.fill_mask(bits).ok(), "too ambiguous to read a token, yet a mask was made");
      return 0;
    }
    FUZZ_CHECK(accepted, "the mask allowed token %d after '%s', which was then refused", pick,
               text.c_str());
    if (pick != end) text += vocabulary()->texts().bytes[size_t(pick)];
    if (text.size() > 200) break;
  }
  if (m.can_end() || m.finished()) {
    FUZZ_CHECK(earley(*grammar, text), "a walk ended on '%s', which Earley refuses", text.c_str());
    if (schema)
      FUZZ_CHECK(!nlohmann::json::parse(text, nullptr, false).is_discarded(),
                 "a walk wrote non-JSON '%s'", text.c_str());
  }
  return 0;
}
