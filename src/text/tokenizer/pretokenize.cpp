#include "text/tokenizer/pretokenize.h"

#include "text/tokenizer/unicode.h"

#include <array>
#include <string_view>

namespace offgraph::text {
namespace {

struct Name {
  std::string_view name;
  PreTokenizerInfo info;
};

// Names as llama.cpp groups them (src/llama-vocab.cpp), for the families implemented here.
constexpr std::array<Name, 10> kNames = {{
    {"gpt-2", {PreTokenizer::kGpt2, false}},
    {"llama-bpe", {PreTokenizer::kLlama3, true}},
    {"llama3", {PreTokenizer::kLlama3, true}},
    {"llama-v3", {PreTokenizer::kLlama3, true}},
    {"qwen2", {PreTokenizer::kQwen2, false}},
    {"deepseek-r1-qwen", {PreTokenizer::kQwen2, false}},
    {"llama4", {PreTokenizer::kGpt4o, false}},
    {"gpt-4o", {PreTokenizer::kGpt4o, false}},
    {"gemma4", {PreTokenizer::kNewlineRuns, false, true}},
    {"granite-embed-multi-311m", {PreTokenizer::kNewlineRuns, false, true}},
}};

// Reads code points of one range; positions outside it read as "nothing", like end of text.
class Cursor {
public:
  Cursor(const std::vector<uint32_t> &cps, size_t end) : cps_(cps), end_(end) {}
  bool in(size_t p) const { return p < end_; }
  uint32_t at(size_t p) const { return cps_[p]; }
  bool is(size_t p, uint32_t c) const { return in(p) && cps_[p] == c; }
  bool letter(size_t p) const {
    return in(p) && codepoint_class(cps_[p]) == CodepointClass::kLetter;
  }
  bool number(size_t p) const {
    return in(p) && codepoint_class(cps_[p]) == CodepointClass::kNumber;
  }
  bool space(size_t p) const { return in(p) && is_whitespace(cps_[p]); }
  // Neither whitespace, letter nor number: [^\s\p{L}\p{N}].
  bool other(size_t p) const { return in(p) && !space(p) && !letter(p) && !number(p); }
  bool newline(size_t p) const { return is(p, '\r') || is(p, '\n'); }
  size_t end() const { return end_; }

private:
  const std::vector<uint32_t> &cps_;
  size_t end_;
};

uint32_t ascii_lower(uint32_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

// Length of 's|'t|'re|'ve|'m|'ll|'d at p (0 if none); ASCII case-folded when `any_case`.
size_t contraction_length(const Cursor &c, size_t p, bool any_case) {
  if (!c.is(p, '\'') || !c.in(p + 1)) return 0;
  const auto fold = [&](size_t q) { return any_case ? ascii_lower(c.at(q)) : c.at(q); };
  const uint32_t a = fold(p + 1);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (!c.in(p + 2)) return 0;
  const uint32_t b = fold(p + 2);
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

// \s*[\r\n]+ | \s+(?!\S) | \s+ at p; 0 when p is not whitespace.
size_t whitespace_end(const Cursor &c, size_t p, bool newline_runs) {
  size_t q = p, after_newline = 0;
  while (c.space(q)) {
    if (c.newline(q)) after_newline = q + 1;
    ++q;
  }
  if (q == p) return 0;
  if (newline_runs && after_newline) return after_newline;
  // \s+(?!\S): leave the last space to prefix the word that follows.
  if (q - p > 1 && c.in(q)) return q - 1;
  return q;
}

void split_gpt2(const Cursor &c, size_t pos, std::vector<size_t> &ends) {
  while (pos < c.end()) {
    size_t e = pos + contraction_length(c, pos, false);
    if (e == pos) {
      const size_t p = c.is(pos, ' ') ? pos + 1 : pos; // the optional leading space
      if (c.letter(p)) {
        for (e = p; c.letter(e);) ++e;
      } else if (c.number(p)) {
        for (e = p; c.number(e);) ++e;
      } else if (c.other(p)) {
        for (e = p; c.other(e);) ++e;
      } else {
        e = whitespace_end(c, pos, false);
        if (e == pos) e = pos + 1;
      }
    }
    ends.push_back(e);
    pos = e;
  }
}

void split_llama3(const Cursor &c, size_t pos, size_t max_digits, std::vector<size_t> &ends) {
  while (pos < c.end()) {
    size_t e = pos + contraction_length(c, pos, true);
    if (e == pos && !c.newline(pos) && !c.number(pos) && (c.letter(pos) || c.letter(pos + 1))) {
      // [^\r\n\p{L}\p{N}]?\p{L}+
      for (e = pos + 1; c.letter(e);) ++e;
    } else if (e == pos && c.number(pos)) {
      // \p{N}{1,max}: a long digit run becomes several words.
      while (c.number(e) && e - pos < max_digits) ++e;
    } else if (e == pos) {
      const size_t p = c.is(pos, ' ') ? pos + 1 : pos;
      if (c.other(p)) { // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
        for (e = p; c.other(e);) ++e;
        while (c.newline(e)) ++e;
      } else {
        e = whitespace_end(c, pos, true);
        if (e == pos) e = pos + 1;
      }
    }
    ends.push_back(e);
    pos = e;
  }
}

// llama.cpp runs the GPT-4o regex through std::regex over text where every non-ASCII code point is
// collapsed to its category. So "upper" ([^a-z] letters) and "lower" ([^A-Z] letters) differ only
// for ASCII: any non-ASCII letter counts as both, and combining marks are not letters at all.
void split_gpt4o(const Cursor &c, size_t pos, std::vector<size_t> &ends) {
  const auto upper = [&](size_t p) { return c.letter(p) && !(c.at(p) >= 'a' && c.at(p) <= 'z'); };
  const auto lower = [&](size_t p) { return c.letter(p) && !(c.at(p) >= 'A' && c.at(p) <= 'Z'); };
  // [^\r\n\p{L}\p{N}]
  const auto prefix = [&](size_t p) {
    return c.in(p) && !c.newline(p) && !c.letter(p) && !c.number(p);
  };
  while (pos < c.end()) {
    size_t e = pos;
    const size_t s = prefix(pos) ? pos + 1 : pos;
    if (c.letter(s)) {
      size_t k = s;
      while (upper(k)) ++k;
      if (lower(k)) {
        // Alternative 1, no backtracking: upper* then lower+.
        for (e = k; lower(e);) ++e;
      } else {
        // Alternative 1 after backtracking: the last non-ASCII letter of the upper run is also
        // "lower"; without one, alternative 2 (upper+ lower*) takes the whole upper run.
        e = k;
        for (size_t j = k; j > s; --j) {
          if (c.at(j - 1) >= 0x80) {
            e = j;
            break;
          }
        }
      }
      e += contraction_length(c, e, true);
    } else if (c.number(pos)) {
      while (c.number(e) && e - pos < 3) ++e;
    } else {
      const size_t p = c.is(pos, ' ') ? pos + 1 : pos;
      if (c.other(p)) { // ` ?[^\s\p{L}\p{N}]+[\r\n/]*`
        for (e = p; c.other(e);) ++e;
        while (c.newline(e) || c.is(e, '/')) ++e;
      } else {
        e = whitespace_end(c, pos, true);
        if (e == pos) e = pos + 1;
      }
    }
    ends.push_back(e);
    pos = e;
  }
}

// [^\n]+|[\n]+
void split_newline_runs(const Cursor &c, size_t pos, std::vector<size_t> &ends) {
  while (c.in(pos)) {
    const bool newline = c.is(pos, '\n');
    size_t e = pos + 1;
    while (c.in(e) && c.is(e, '\n') == newline) ++e;
    ends.push_back(e);
    pos = e;
  }
}

} // namespace

std::string supported_pre_tokenizer_names() {
  std::string names;
  for (const auto &n : kNames) {
    if (!names.empty()) names += ", ";
    names += n.name;
  }
  return names;
}

Result<PreTokenizerInfo> pre_tokenizer_from_name(const std::string &name) {
  for (const auto &n : kNames) {
    if (n.name == name) return n.info;
  }
  return Status::error("unsupported pre-tokenizer '" + name +
                       "' (tokenizer.ggml.pre); supported: " + supported_pre_tokenizer_names());
}

void split_words(PreTokenizer kind, const std::vector<uint32_t> &cps, size_t begin, size_t end,
                 std::vector<size_t> &word_ends) {
  const Cursor c(cps, end);
  switch (kind) {
  case PreTokenizer::kGpt2:
    split_gpt2(c, begin, word_ends);
    break;
  case PreTokenizer::kLlama3:
    split_llama3(c, begin, 3, word_ends);
    break;
  case PreTokenizer::kQwen2:
    split_llama3(c, begin, 1, word_ends);
    break;
  case PreTokenizer::kGpt4o:
    split_gpt4o(c, begin, word_ends);
    break;
  case PreTokenizer::kNewlineRuns:
    split_newline_runs(c, begin, word_ends);
    break;
  }
}

} // namespace offgraph::text
