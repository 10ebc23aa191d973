#include "text/tokenizer/unicode.h"

#include <algorithm>
#include <array>
#include <utility>

namespace offgraph::text {
namespace {

constexpr uint32_t kMaxCodepoint = 0x10FFFF;

struct ClassRun {
  uint32_t first;
  uint8_t klass;
};

constexpr ClassRun kClassRuns[] = {
#include "text/tokenizer/unicode_table.inc"
};

// One byte per code point (1.1 MB) makes the hot lookup a single load; built once, on first use.
const std::vector<uint8_t> &class_table() {
  static const std::vector<uint8_t> table = [] {
    std::vector<uint8_t> t(kMaxCodepoint + 1, 0);
    constexpr size_t n = sizeof(kClassRuns) / sizeof(kClassRuns[0]);
    for (size_t i = 0; i < n; ++i) {
      const uint32_t end = i + 1 < n ? kClassRuns[i + 1].first : kMaxCodepoint + 1;
      std::fill(t.begin() + kClassRuns[i].first, t.begin() + end, kClassRuns[i].klass);
    }
    return t;
  }();
  return table;
}

} // namespace

CodepointClass codepoint_class(uint32_t cp) {
  if (cp > kMaxCodepoint) return CodepointClass::kOther;
  return static_cast<CodepointClass>(class_table()[cp]);
}

bool is_whitespace(uint32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
  switch (cp) {
  case 0x85:
  case 0xA0:
  case 0x1680:
  case 0x2028:
  case 0x2029:
  case 0x202F:
  case 0x205F:
  case 0x3000:
    return true;
  default:
    return cp >= 0x2000 && cp <= 0x200A;
  }
}

DecodedText decode_lenient(std::string_view text) {
  DecodedText d;
  d.cps.reserve(text.size());
  d.offsets.reserve(text.size() + 1);
  d.utf8.reserve(text.size());
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const auto is_cont = [&](size_t i) { return i < text.size() && (byte(i) & 0xC0) == 0x80; };
  size_t i = 0;
  while (i < text.size()) {
    const uint8_t b = byte(i);
    uint32_t cp = kReplacementChar;
    size_t len = 1;
    if (b < 0x80) {
      cp = b;
    } else if ((b & 0xE0) == 0xC0 && is_cont(i + 1)) {
      cp = ((b & 0x1Fu) << 6) | (byte(i + 1) & 0x3Fu);
      len = 2;
    } else if ((b & 0xF0) == 0xE0 && is_cont(i + 1) && is_cont(i + 2)) {
      cp = ((b & 0x0Fu) << 12) | ((byte(i + 1) & 0x3Fu) << 6) | (byte(i + 2) & 0x3Fu);
      len = 3;
    } else if ((b & 0xF8) == 0xF0 && is_cont(i + 1) && is_cont(i + 2) && is_cont(i + 3)) {
      cp = ((b & 0x07u) << 18) | ((byte(i + 1) & 0x3Fu) << 12) | ((byte(i + 2) & 0x3Fu) << 6) |
           (byte(i + 3) & 0x3Fu);
      len = 4;
      if (cp > kMaxCodepoint) {
        cp = kReplacementChar;
        len = 1;
      }
    }
    d.cps.push_back(cp);
    d.offsets.push_back(d.utf8.size());
    append_utf8(d.utf8, cp);
    i += len;
  }
  d.offsets.push_back(d.utf8.size());
  return d;
}

size_t well_formed_sequence_length(std::string_view s, bool *incomplete) {
  *incomplete = false;
  if (s.empty()) return 0;
  const auto b = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  const uint8_t lead = b(0);
  if (lead < 0x80) return 1;
  size_t len = 0;
  uint8_t lo = 0x80, hi = 0xBF; // allowed range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    len = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    len = 3;
    if (lead == 0xE0) lo = 0xA0; // no overlong forms
    if (lead == 0xED) hi = 0x9F; // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    len = 4;
    if (lead == 0xF0) lo = 0x90;
    if (lead == 0xF4) hi = 0x8F; // nothing above U+10FFFF
  } else {
    return 0;
  }
  for (size_t i = 1; i < len; ++i) {
    if (i >= s.size()) {
      *incomplete = true;
      return 0;
    }
    const uint8_t c = b(i);
    const uint8_t min = i == 1 ? lo : 0x80, max = i == 1 ? hi : 0xBF;
    if (c < min || c > max) return 0;
  }
  return len;
}

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    bool incomplete = false;
    const size_t n = well_formed_sequence_length(s.substr(i), &incomplete);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

} // namespace offgraph::text
