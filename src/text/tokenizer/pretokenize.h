// Pre-tokenizers: split text into the words that BPE then merges independently. Each follows the
// split regex of its model family, hand-written over code points (std::regex is slow and lacks
// \p{..}), reproducing llama.cpp's reading of the regex so that token ids agree with it.
#pragma once

#include "base/status.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace offgraph::text {

enum class PreTokenizer {
  kGpt2,   // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kLlama3, // (?i:'s|..)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|..
  kQwen2,  // as kLlama3 but single digits: \p{N}
  kGpt4o,  // GPT-4o / Llama 4: case-aware letter runs, see pretokenize.cpp
  kNewlineRuns, // [^\n]+|[\n]+ (Gemma 4: BPE over whole lines)
};

struct PreTokenizerInfo {
  PreTokenizer kind;
  // The whole word is looked up as a token before merging (llama.cpp's ignore_merges).
  bool whole_word_first;
  // SentencePiece-style BPE (Gemma 4): spaces are written U+2581 before splitting, merges start
  // from the UTF-8 characters themselves (no byte-level mapping), and a character the vocabulary
  // lacks falls back to its bytes' `<0xXX>` tokens. A run of newlines is one token when the
  // vocabulary has it.
  bool spm_style = false;
};

// Maps a GGUF `tokenizer.ggml.pre` value; an unknown name is an error listing the supported ones.
Result<PreTokenizerInfo> pre_tokenizer_from_name(const std::string &name);
std::string supported_pre_tokenizer_names();

// Splits cps[begin, end) into words, appending the (exclusive) end index of each word, in code
// points. The range is treated as a whole text: lookaheads see nothing past `end`.
void split_words(PreTokenizer kind, const std::vector<uint32_t> &cps, size_t begin, size_t end,
                 std::vector<size_t> &word_ends);

} // namespace offgraph::text
