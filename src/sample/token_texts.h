// What each token id writes, as a grammar sees a vocabulary.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace offgraph::sample {

// The bytes of each token id (control tokens as their text), and which ids are special
// (control) tokens: a grammar matches those only as themselves, never as their text.
struct TokenTexts {
  std::vector<std::string> bytes;
  std::vector<uint8_t> special; // empty, or one flag per id
};

} // namespace offgraph::sample
