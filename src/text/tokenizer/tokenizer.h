// BPE tokenizer: byte-level (GGUF `tokenizer.ggml.model = "gpt2"`), as used by Llama 3/4, Qwen 2
// and GPT-2 family models, and SentencePiece-style (`"gemma4"`: spaces as U+2581, merges over UTF-8
// characters, `<0xXX>` byte fallback). Token ids agree with llama.cpp's for the pre-tokenizers in
// pretokenize.h.
#pragma once

#include "base/status.h"
#include "text/tokenizer/pretokenize.h"

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

struct gguf_context;

namespace offgraph::text {

// GGUF `tokenizer.ggml.token_type` values.
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

class Tokenizer {
public:
  static Result<std::unique_ptr<Tokenizer>> from_gguf(const std::string &path);
  static Result<std::unique_ptr<Tokenizer>> from_gguf(const gguf_context *ctx);

  // `add_bos` prepends BOS (when the vocabulary has one). The literal text of USER_DEFINED tokens
  // becomes those tokens always, and with `parse_special` that of CONTROL tokens too, longest
  // first (llama.cpp's and Hugging Face's rule: user-defined tokens are added words of the
  // vocabulary). Invalid UTF-8 bytes are tokenized as U+FFFD, one per byte that starts no
  // sequence.
  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const;
  // Text as plain text only: no special or user-defined token is matched (what a chat's caller
  // typed, which must not forge the template's markers).
  std::vector<int32_t> encode_literal(std::string_view text) const;
  // Concatenated raw bytes of the tokens (no UTF-8 repair; see Detokenizer for that).
  std::string decode(const std::vector<int32_t> &ids) const;

  // The raw bytes a token stands for (byte-level mapping undone); empty for an unknown id.
  const std::string &token_piece(int32_t id) const;
  std::optional<int32_t> find_token(std::string_view piece) const;
  TokenType token_type(int32_t id) const;
  bool is_control(int32_t id) const { return token_type(id) == TokenType::kControl; }

  int32_t n_vocab() const { return static_cast<int32_t>(pieces_.size()); }
  // -1 when the vocabulary names none.
  int32_t bos() const { return bos_; }
  int32_t eos() const { return eos_; }
  int32_t eot() const { return eot_; }
  int32_t pad() const { return pad_; }
  // `tokenizer.ggml.add_bos_token`: whether a plain prompt should start with BOS.
  bool add_bos_default() const { return add_bos_default_; }
  // Ids that end generation: EOT and EOS (never an end-of-message token such as `<|eom|>`), and
  // Gemma 4's `<|tool_response>` (the model waits there for a tool's answer).
  std::vector<int32_t> end_of_generation_ids() const;
  const std::string &pre_tokenizer_name() const { return pre_name_; }

private:
  Tokenizer() = default;
  Status load(const gguf_context *ctx);
  void encode_plain(std::string_view text, std::vector<int32_t> &out) const;
  void encode_word(std::string_view word, std::vector<int32_t> &out) const;
  // `symbols`: the word's starting symbols (a token id each, -1 for a character the vocabulary
  // lacks, with its byte span in `word`); merged in place and appended to `out`.
  struct Symbol {
    int32_t id;
    uint32_t begin, end; // bytes of the word
  };
  void merge_symbols(std::string_view word, std::vector<Symbol> &symbols,
                     std::vector<int32_t> &out) const;
  enum class Match { kUserDefined, kAll };
  // Splits text at special tokens the way llama.cpp does: each special token, longest first,
  // claims its occurrences in the text not yet claimed.
  struct Fragment {
    int32_t special; // token id, or -1 for plain text
    size_t offset, length;
  };
  std::vector<Fragment> split_special(std::string_view text, Match match) const;

  struct Merge {
    int32_t rank;
    int32_t result;
  };
  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }

  struct TrieNode {
    std::vector<std::pair<uint8_t, int32_t>> next;
    int32_t token = -1;
  };

  std::vector<std::string> pieces_;
  std::vector<TokenType> types_;
  std::unordered_map<std::string, int32_t> piece_to_id_;
  // SentencePiece-style only: token texts as stored (spaces as U+2581), and the `<0xXX>` tokens.
  std::unordered_map<std::string, int32_t> text_to_id_;
  int32_t byte_fallback_[256] = {};
  std::vector<int32_t> extra_eog_;
  bool has_user_defined_ = false; // plain encoding must look for them
  std::unordered_map<uint64_t, Merge> merges_;
  int32_t byte_ids_[256] = {};
  std::vector<TrieNode> special_trie_;
  std::string pre_name_;
  PreTokenizerInfo pre_{PreTokenizer::kGpt2, false};
  int32_t bos_ = -1, eos_ = -1, eot_ = -1, pad_ = -1;
  bool add_bos_default_ = false;

  // Words repeat (Zipf); their merges are remembered. Guarded so encode() stays thread-safe.
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> word_cache_;
};

// Turns a stream of token ids into text that is always valid UTF-8: bytes of a character split
// across tokens are held until it completes; bytes that can never form a character become U+FFFD
// (one U+FFFD per maximal invalid subpart, as Python and browsers decode; an unfinished character
// at flush() is one). Control tokens are skipped unless `render_control`.
class Detokenizer {
public:
  explicit Detokenizer(const Tokenizer &tokenizer, bool render_control = false)
      : tokenizer_(tokenizer), render_control_(render_control) {}
  // Text completed by this token (possibly empty).
  std::string feed(int32_t id);
  // Whatever is held back, an unfinished character as one U+FFFD; resets the stream.
  std::string flush();

  // Feeds raw bytes instead of a token (used by feed(); public for tests and byte streams).
  std::string feed_bytes(std::string_view bytes);

private:
  std::string drain(bool final);
  const Tokenizer &tokenizer_;
  bool render_control_;
  std::string pending_;
};

} // namespace offgraph::text
