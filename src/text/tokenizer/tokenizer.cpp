#include "text/tokenizer/tokenizer.h"

#include "text/tokenizer/unicode.h"

#include "gguf.h"

#include <algorithm>
#include <array>
#include <queue>

namespace offgraph::text {
namespace {

// GPT-2's byte-level mapping: printable Latin-1 bytes stand for themselves; the other 68 bytes are
// shifted to U+0100.. so that every token text is printable.
struct ByteMapping {
  std::array<uint32_t, 256> to_cp{};
  std::array<int16_t, 512> to_byte{}; // -1: the code point stands for no byte
  ByteMapping() {
    to_byte.fill(-1);
    uint32_t shifted = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      to_cp[b] = printable ? b : shifted++;
      to_byte[to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteMapping &byte_mapping() {
  static const ByteMapping m;
  return m;
}

// Undoes the byte-level mapping; a code point outside it is kept as its own UTF-8.
std::string unmap_bytes(std::string_view text) {
  const DecodedText d = decode_lenient(text);
  std::string out;
  out.reserve(d.cps.size());
  for (const uint32_t cp : d.cps) {
    const int16_t b = cp < 512 ? byte_mapping().to_byte[cp] : -1;
    if (b >= 0) {
      out.push_back(static_cast<char>(b));
    } else {
      append_utf8(out, cp);
    }
  }
  return out;
}

// SentencePiece's whitespace mark, U+2581, which stands for a space in token texts.
constexpr std::string_view kSpaceMark = "\xE2\x96\x81";

std::string unescape_spaces(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    if (text.substr(i, kSpaceMark.size()) == kSpaceMark) {
      out += ' ';
      i += kSpaceMark.size();
    } else {
      out += text[i++];
    }
  }
  return out;
}

// The byte of a SentencePiece byte token "<0xXX>" (hex digits in either case), or -1.
int byte_token_value(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
  int value = 0;
  for (const char ch : text.substr(3, 2)) {
    const int digit = ch >= '0' && ch <= '9'   ? ch - '0'
                      : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10
                      : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
                                               : -1;
    if (digit < 0) return -1;
    value = value * 16 + digit;
  }
  return value;
}

struct GgufDeleter {
  void operator()(gguf_context *ctx) const { gguf_free(ctx); }
};

Result<std::string> get_str(const gguf_context *ctx, const char *key, bool required) {
  const int64_t k = gguf_find_key(ctx, key);
  if (k < 0) {
    if (required) return Status::error(std::string("GGUF key '") + key + "' is missing");
    return std::string();
  }
  if (gguf_get_kv_type(ctx, k) != GGUF_TYPE_STRING) {
    return Status::error(std::string("GGUF key '") + key + "' is not a string");
  }
  return std::string(gguf_get_val_str(ctx, k));
}

Result<int64_t> get_string_array(const gguf_context *ctx, const char *key) {
  const int64_t k = gguf_find_key(ctx, key);
  if (k < 0) return Status::error(std::string("GGUF key '") + key + "' is missing");
  if (gguf_get_kv_type(ctx, k) != GGUF_TYPE_ARRAY ||
      gguf_get_arr_type(ctx, k) != GGUF_TYPE_STRING) {
    return Status::error(std::string("GGUF key '") + key + "' is not an array of strings");
  }
  return k;
}

// A token id key: -1 when absent; an error when of the wrong type or outside the vocabulary.
Result<int32_t> get_token_id(const gguf_context *ctx, const char *key, size_t n_vocab) {
  const int64_t k = gguf_find_key(ctx, key);
  if (k < 0) return -1;
  int64_t id = 0;
  switch (gguf_get_kv_type(ctx, k)) {
  case GGUF_TYPE_UINT32:
    id = gguf_get_val_u32(ctx, k);
    break;
  case GGUF_TYPE_INT32:
    id = gguf_get_val_i32(ctx, k);
    break;
  default:
    return Status::error(std::string("GGUF key '") + key + "' is not a 32-bit integer");
  }
  if (id < 0 || static_cast<size_t>(id) >= n_vocab) {
    return Status::error(std::string("GGUF key '") + key + "' = " + std::to_string(id) +
                         " lies outside the vocabulary of " + std::to_string(n_vocab) + " tokens");
  }
  return static_cast<int32_t>(id);
}

// Word caching pays for typical words; very long ones (a CJK paragraph) rarely repeat.
constexpr size_t kMaxCachedWordBytes = 128;
constexpr size_t kMaxCachedWords = 1 << 18;

} // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_gguf(const std::string &path) {
  gguf_init_params params{};
  params.no_alloc = true;
  params.ctx = nullptr;
  std::unique_ptr<gguf_context, GgufDeleter> ctx(gguf_init_from_file(path.c_str(), params));
  if (!ctx) return Status::error("cannot read '" + path + "' as a GGUF file");
  auto tok = from_gguf(ctx.get());
  if (!tok.ok()) return Status::error(path + ": " + tok.message());
  return tok;
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_gguf(const gguf_context *ctx) {
  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  if (Status s = tok->load(ctx); !s.ok()) return s;
  return tok;
}

Status Tokenizer::load(const gguf_context *ctx) {
  auto model = get_str(ctx, "tokenizer.ggml.model", true);
  if (!model.ok()) return model.status();
  if (*model == "test" || *model == "none" || *model == "no_vocab")
    return Status::error("tokenizer model '" + *model +
                         "' (tokenizer.ggml.model) is llama.cpp's placeholder for a file without a "
                         "vocabulary and has no text form: such files run on token ids only "
                         "(offgraph logits --tokens or --random, offgraph bench)");
  if (*model != "gpt2" && *model != "gemma4") {
    return Status::error("tokenizer model '" + *model +
                         "' (tokenizer.ggml.model) is not supported; 'gpt2' (byte-level BPE) and "
                         "'gemma4' (SentencePiece-style BPE) are");
  }
  auto pre = get_str(ctx, "tokenizer.ggml.pre", false);
  if (!pre.ok()) return pre.status();
  // llama.cpp gives a gemma4 vocabulary its own pre-tokenizer whatever the key says.
  pre_name_ = *model == "gemma4" ? "gemma4" : pre->empty() ? "default" : *pre;
  auto info = pre_tokenizer_from_name(pre_name_);
  if (!info.ok()) return info.status();
  pre_ = *info;

  auto tokens_key = get_string_array(ctx, "tokenizer.ggml.tokens");
  if (!tokens_key.ok()) return tokens_key.status();
  const size_t n = gguf_get_arr_n(ctx, *tokens_key);
  if (n == 0 || n > static_cast<size_t>(INT32_MAX)) {
    return Status::error("tokenizer.ggml.tokens holds " + std::to_string(n) + " tokens");
  }

  types_.assign(n, TokenType::kNormal);
  if (const int64_t k = gguf_find_key(ctx, "tokenizer.ggml.token_type"); k >= 0) {
    if (gguf_get_kv_type(ctx, k) != GGUF_TYPE_ARRAY ||
        gguf_get_arr_type(ctx, k) != GGUF_TYPE_INT32 || gguf_get_arr_n(ctx, k) != n) {
      return Status::error("tokenizer.ggml.token_type must be an int32 array with one entry per "
                           "token (" +
                           std::to_string(n) + ")");
    }
    const auto *raw = static_cast<const int32_t *>(gguf_get_arr_data(ctx, k));
    for (size_t i = 0; i < n; ++i) types_[i] = static_cast<TokenType>(raw[i]);
  }

  // Token texts as stored (byte-mapped, or with U+2581 for spaces) index the merges; raw pieces
  // index everything else.
  std::unordered_map<std::string_view, int32_t> text_to_id;
  text_to_id.reserve(n);
  pieces_.resize(n);
  piece_to_id_.reserve(n);
  std::fill(std::begin(byte_ids_), std::end(byte_ids_), -1);
  std::fill(std::begin(byte_fallback_), std::end(byte_fallback_), -1);
  for (size_t i = 0; i < n; ++i) {
    const std::string_view text = gguf_get_arr_str(ctx, *tokens_key, i);
    const auto id = static_cast<int32_t>(i);
    text_to_id[text] = id;
    const bool special = types_[i] == TokenType::kControl || types_[i] == TokenType::kUserDefined;
    if (special) {
      pieces_[i] = std::string(text);
    } else if (!pre_.spm_style) {
      pieces_[i] = unmap_bytes(text);
    } else if (const int byte = byte_token_value(text); types_[i] == TokenType::kByte) {
      if (byte < 0)
        return Status::error("tokenizer.ggml.tokens[" + std::to_string(i) + "] = '" +
                             std::string(text) + "' is a byte token but not of the form <0xXX>");
      pieces_[i] = std::string(1, static_cast<char>(byte));
      byte_fallback_[byte] = id;
    } else {
      pieces_[i] = unescape_spaces(text);
    }
  }
  // A SentencePiece byte token's piece is also a character's: the character's own token wins.
  for (size_t i = 0; i < n; ++i)
    if (!pre_.spm_style || types_[i] != TokenType::kByte)
      piece_to_id_[pieces_[i]] = static_cast<int32_t>(i);
  if (pre_.spm_style)
    for (size_t i = 0; i < n; ++i)
      if (types_[i] == TokenType::kByte)
        piece_to_id_.try_emplace(pieces_[i], static_cast<int32_t>(i));
  if (pre_.spm_style) {
    text_to_id_.reserve(n);
    for (const auto &[text, id] : text_to_id) text_to_id_.emplace(std::string(text), id);
  }
  for (int b = 0; b < 256; ++b) {
    std::string one(1, static_cast<char>(b));
    if (auto it = piece_to_id_.find(one); it != piece_to_id_.end()) byte_ids_[b] = it->second;
  }

  auto merges_key = get_string_array(ctx, "tokenizer.ggml.merges");
  if (!merges_key.ok()) return merges_key.status();
  const size_t n_merges = gguf_get_arr_n(ctx, *merges_key);
  merges_.reserve(n_merges);
  std::string joined;
  for (size_t i = 0; i < n_merges; ++i) {
    const std::string_view m = gguf_get_arr_str(ctx, *merges_key, i);
    const size_t space = m.size() > 1 ? m.find(' ', 1) : std::string_view::npos;
    if (space == std::string_view::npos) {
      return Status::error("tokenizer.ggml.merges[" + std::to_string(i) + "] = '" + std::string(m) +
                           "' is not two tokens separated by a space");
    }
    const auto left = text_to_id.find(m.substr(0, space));
    const auto right = text_to_id.find(m.substr(space + 1));
    joined.assign(m.substr(0, space));
    joined.append(m.substr(space + 1));
    const auto result = text_to_id.find(joined);
    // A merge naming tokens the vocabulary lacks can never apply; skip it.
    if (left == text_to_id.end() || right == text_to_id.end() || result == text_to_id.end()) {
      continue;
    }
    merges_.try_emplace(pair_key(left->second, right->second),
                        Merge{static_cast<int32_t>(i), result->second});
  }

  for (auto [key, field] : {std::pair{"tokenizer.ggml.bos_token_id", &bos_},
                            {"tokenizer.ggml.eos_token_id", &eos_},
                            {"tokenizer.ggml.eot_token_id", &eot_}}) {
    auto id = get_token_id(ctx, key, n);
    if (!id.ok()) return id.status();
    *field = *id;
  }
  // Some converters write a padding id past the vocabulary; padding is never encoded, so ignore it.
  auto pad = get_token_id(ctx, "tokenizer.ggml.padding_token_id", n);
  pad_ = pad.ok() ? *pad : -1;
  if (eot_ < 0) {
    for (const char *name :
         {"<|eot_id|>", "<|eot|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<turn|>"}) {
      if (auto id = find_token(name); id && is_control(*id)) {
        eot_ = *id;
        break;
      }
    }
  }

  // Gemma 4 waits for a tool's answer at <|tool_response>, which llama.cpp ends generation on.
  if (pre_.kind == PreTokenizer::kNewlineRuns)
    if (auto id = find_token("<|tool_response>"); id && token_type(*id) != TokenType::kNormal) {
      extra_eog_.push_back(*id);
      // llama.cpp makes every end-of-generation token a control token.
      types_[size_t(*id)] = TokenType::kControl;
    }

  add_bos_default_ = pre_.kind == PreTokenizer::kLlama3;
  if (const int64_t k = gguf_find_key(ctx, "tokenizer.ggml.add_bos_token"); k >= 0) {
    if (gguf_get_kv_type(ctx, k) != GGUF_TYPE_BOOL) {
      return Status::error("GGUF key 'tokenizer.ggml.add_bos_token' is not a bool");
    }
    add_bos_default_ = gguf_get_val_bool(ctx, k);
  }
  // Gemma 4 needs its BOS; llama.cpp adds it even where a converter wrote false.
  if (pre_.kind == PreTokenizer::kNewlineRuns) add_bos_default_ = true;

  special_trie_.assign(1, TrieNode{});
  for (size_t i = 0; i < n; ++i) {
    if (pieces_[i].empty() ||
        (types_[i] != TokenType::kControl && types_[i] != TokenType::kUserDefined)) {
      continue;
    }
    int32_t node = 0;
    for (const char ch : pieces_[i]) {
      const auto b = static_cast<uint8_t>(ch);
      auto &next = special_trie_[node].next;
      auto it = std::find_if(next.begin(), next.end(), [&](const auto &e) { return e.first == b; });
      if (it != next.end()) {
        node = it->second;
      } else {
        const auto child = static_cast<int32_t>(special_trie_.size());
        next.emplace_back(b, child);
        special_trie_.emplace_back();
        node = child;
      }
    }
    special_trie_[node].token = static_cast<int32_t>(i);
    has_user_defined_ = has_user_defined_ || types_[i] == TokenType::kUserDefined;
  }
  return ok_status();
}

const std::string &Tokenizer::token_piece(int32_t id) const {
  static const std::string none;
  return id >= 0 && id < n_vocab() ? pieces_[id] : none;
}

TokenType Tokenizer::token_type(int32_t id) const {
  return id >= 0 && id < n_vocab() ? types_[id] : TokenType::kUndefined;
}

std::optional<int32_t> Tokenizer::find_token(std::string_view piece) const {
  const auto it = piece_to_id_.find(std::string(piece));
  if (it == piece_to_id_.end()) return std::nullopt;
  return it->second;
}

std::vector<int32_t> Tokenizer::end_of_generation_ids() const {
  std::vector<int32_t> ids;
  std::vector<int32_t> all = {eot_, eos_};
  all.insert(all.end(), extra_eog_.begin(), extra_eog_.end());
  for (const int32_t id : all) {
    if (id >= 0 && std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  }
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t> &ids) const {
  std::string out;
  for (const int32_t id : ids) out += token_piece(id);
  return out;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos,
                                       bool parse_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos && bos_ >= 0) out.push_back(bos_);
  for (const Fragment &f : split_special(text, parse_special ? Match::kAll : Match::kUserDefined)) {
    if (f.special >= 0) {
      out.push_back(f.special);
    } else {
      encode_plain(text.substr(f.offset, f.length), out);
    }
  }
  return out;
}

std::vector<int32_t> Tokenizer::encode_literal(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1);
  encode_plain(text, out);
  return out;
}

std::vector<Tokenizer::Fragment> Tokenizer::split_special(std::string_view text,
                                                          Match match) const {
  if (match == Match::kUserDefined && !has_user_defined_) return {{-1, 0, text.size()}};
  // Which special tokens occur at all (usually none or a few), found with one pass over a trie.
  std::vector<int32_t> found;
  for (size_t i = 0; i < text.size(); ++i) {
    int32_t node = 0;
    for (size_t j = i; j < text.size(); ++j) {
      const auto b = static_cast<uint8_t>(text[j]);
      const auto &next = special_trie_[node].next;
      auto it = std::find_if(next.begin(), next.end(), [&](const auto &e) { return e.first == b; });
      if (it == next.end()) break;
      node = it->second;
      const int32_t id = special_trie_[node].token;
      if (id >= 0 && (match == Match::kAll || types_[id] == TokenType::kUserDefined))
        found.push_back(id);
    }
  }
  std::sort(found.begin(), found.end(), [&](int32_t a, int32_t b) {
    const size_t la = pieces_[a].size(), lb = pieces_[b].size();
    return la != lb ? la > lb : a < b;
  });
  found.erase(std::unique(found.begin(), found.end()), found.end());

  std::vector<Fragment> frags{{-1, 0, text.size()}};
  for (const int32_t id : found) {
    const std::string &piece = pieces_[id];
    std::vector<Fragment> next;
    for (const Fragment &f : frags) {
      if (f.special >= 0) {
        next.push_back(f);
        continue;
      }
      size_t start = f.offset;
      const size_t end = f.offset + f.length;
      while (true) {
        const size_t at = text.substr(0, end).find(piece, start);
        if (at == std::string_view::npos) break;
        if (at > start) next.push_back({-1, start, at - start});
        next.push_back({id, at, piece.size()});
        start = at + piece.size();
      }
      if (start < end) next.push_back({-1, start, end - start});
    }
    frags.swap(next);
  }
  return frags;
}

void Tokenizer::encode_plain(std::string_view text, std::vector<int32_t> &out) const {
  if (text.empty()) return;
  std::string escaped;
  if (pre_.spm_style) { // spaces become U+2581 before anything else sees the text
    escaped.reserve(text.size() + text.size() / 4);
    for (const char ch : text) {
      if (ch == ' ')
        escaped += kSpaceMark;
      else
        escaped += ch;
    }
    text = escaped;
  }
  const DecodedText d = decode_lenient(text);
  std::vector<size_t> ends;
  ends.reserve(d.cps.size() / 3 + 1);
  split_words(pre_.kind, d.cps, 0, d.cps.size(), ends);
  size_t begin = 0;
  for (const size_t end : ends) {
    const std::string_view word(d.utf8.data() + d.offsets[begin],
                                d.offsets[end] - d.offsets[begin]);
    encode_word(word, out);
    begin = end;
  }
}

void Tokenizer::encode_word(std::string_view word, std::vector<int32_t> &out) const {
  if (!pre_.spm_style && word.size() == 1 && byte_ids_[static_cast<uint8_t>(word[0])] >= 0) {
    out.push_back(byte_ids_[static_cast<uint8_t>(word[0])]);
    return;
  }
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  std::string key;
  if (cacheable) {
    key.assign(word);
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (auto it = word_cache_.find(key); it != word_cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  std::optional<int32_t> whole;
  if (pre_.whole_word_first) {
    if (auto it = piece_to_id_.find(std::string(word)); it != piece_to_id_.end())
      whole = it->second;
  } else if (pre_.spm_style && word.find_first_not_of('\n') == std::string_view::npos) {
    // A run of newlines is looked up whole (llama.cpp's fix for Gemma 4's newline tokens).
    if (auto it = text_to_id_.find(std::string(word)); it != text_to_id_.end()) whole = it->second;
  }
  if (whole) {
    out.push_back(*whole);
  } else {
    std::vector<Symbol> symbols;
    symbols.reserve(word.size());
    if (pre_.spm_style) { // UTF-8 characters (the word is well-formed: decode_lenient made it)
      for (size_t i = 0; i < word.size();) {
        bool incomplete = false;
        const size_t len =
            std::max<size_t>(1, well_formed_sequence_length(word.substr(i), &incomplete));
        const auto it = text_to_id_.find(std::string(word.substr(i, len)));
        symbols.push_back(
            {it != text_to_id_.end() ? it->second : -1, uint32_t(i), uint32_t(i + len)});
        i += len;
      }
    } else { // bytes, each the token of its byte-level mapping
      for (size_t i = 0; i < word.size(); ++i)
        symbols.push_back({byte_ids_[static_cast<uint8_t>(word[i])], uint32_t(i), uint32_t(i + 1)});
    }
    merge_symbols(word, symbols, out);
  }
  if (cacheable) {
    std::vector<int32_t> ids(out.begin() + static_cast<std::ptrdiff_t>(first), out.end());
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (word_cache_.size() >= kMaxCachedWords) word_cache_.clear();
    word_cache_.emplace(std::move(key), std::move(ids));
  }
}

// Classic BPE: repeatedly apply the lowest-ranked merge among adjacent symbols (leftmost on a tie),
// with a heap of candidate pairs and lazy deletion of pairs that a previous merge made stale.
void Tokenizer::merge_symbols(std::string_view word, std::vector<Symbol> &symbols,
                              std::vector<int32_t> &out) const {
  struct Link {
    int32_t prev, next;
  };
  struct Candidate {
    int32_t rank, left, left_id, right_id, result;
    bool operator<(const Candidate &o) const { // inverted: priority_queue pops the largest
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  const auto n = static_cast<int32_t>(symbols.size());
  std::vector<Link> link(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) link[i] = {i - 1, i + 1 < n ? i + 1 : -1};
  std::priority_queue<Candidate> heap;
  const auto consider = [&](int32_t left) {
    if (left < 0 || link[left].next < 0) return;
    const Symbol &l = symbols[left], &r = symbols[link[left].next];
    if (l.id < 0 || r.id < 0) return;
    const auto it = merges_.find(pair_key(l.id, r.id));
    if (it != merges_.end()) heap.push({it->second.rank, left, l.id, r.id, it->second.result});
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol &l = symbols[c.left];
    const int32_t right = link[c.left].next;
    if (l.id != c.left_id || right < 0 || symbols[right].id != c.right_id) continue; // stale
    l.id = c.result;
    l.end = symbols[right].end;
    link[c.left].next = link[right].next;
    if (link[c.left].next >= 0) link[link[c.left].next].prev = c.left;
    symbols[right].id = -2; // merged away
    consider(link[c.left].prev);
    consider(c.left);
  }
  for (int32_t i = 0; i >= 0 && i < n; i = link[i].next) {
    if (symbols[i].id >= 0) {
      out.push_back(symbols[i].id);
    } else if (pre_.spm_style) {
      // A character the vocabulary lacks: its bytes' <0xXX> tokens (one missing is dropped, as
      // llama.cpp drops it).
      for (uint32_t b = symbols[i].begin; b < symbols[i].end; ++b)
        if (const int32_t id = byte_fallback_[static_cast<uint8_t>(word[b])]; id >= 0)
          out.push_back(id);
    }
    // A byte with no token of its own cannot be represented; llama.cpp drops it too.
  }
}

std::string Detokenizer::feed(int32_t id) {
  if (!render_control_ && tokenizer_.is_control(id)) return std::string();
  return feed_bytes(tokenizer_.token_piece(id));
}

std::string Detokenizer::feed_bytes(std::string_view bytes) {
  pending_.append(bytes);
  return drain(false);
}

std::string Detokenizer::flush() { return drain(true); }

std::string Detokenizer::drain(bool final) {
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    bool incomplete = false;
    const size_t len =
        well_formed_sequence_length(std::string_view(pending_).substr(i), &incomplete);
    if (len > 0) {
      out.append(pending_, i, len);
      i += len;
    } else if (incomplete && !final) {
      break; // the rest of this character comes with a later token
    } else if (incomplete) {
      append_utf8(out, kReplacementChar); // an unfinished character at the end: one U+FFFD
      i = pending_.size();
    } else {
      // One U+FFFD per maximal subpart (Unicode's recommended practice, as Python and browsers
      // decode): the lead byte and the continuation bytes that were still valid after it.
      size_t part = 1;
      for (size_t k = std::min<size_t>(3, pending_.size() - i - 1); k > 1; --k) {
        bool prefix_incomplete = false;
        if (well_formed_sequence_length(std::string_view(pending_).substr(i, k),
                                        &prefix_incomplete) == 0 &&
            prefix_incomplete) {
          part = k;
          break;
        }
      }
      append_utf8(out, kReplacementChar);
      i += part;
    }
  }
  pending_.erase(0, i);
  return out;
}

} // namespace offgraph::text
