// What the llama.cpp peer programs share: the model loaded on the plain CPU path, a context
// whose f32 cache stays f32, and a decoder that keeps a logits row per decoded position in a
// LogitsFile and decodes greedily from the last one. Header-only; only programs linked against
// the cached peer build (scripts/peer.sh) include it.
#pragma once

#include "logits_file.h"

#include "llama.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace offgraph::peer {

// Errors only; a continuation (GGML_LOG_LEVEL_CONT, e.g. the loader's progress dots) only
// after an error.
inline void quiet_log(ggml_log_level level, const char *text, void *) {
  static bool in_error = false;
  if (level != GGML_LOG_LEVEL_CONT) in_error = level == GGML_LOG_LEVEL_ERROR;
  if (in_error) std::fputs(text, stderr);
}

// The model on the CPU, or null (llama.cpp has logged why). On CPUs with AMX the pinned tree
// repacks Q8_0 weights for its AMX kernel, which crashes (SIGSEGV in ggml_backend_amx_mul_mat) on
// these models: no extra buffer types, the plain CPU path is the reference.
inline llama_model *load_reference_model(const std::string &path) {
  llama_log_set(quiet_log, nullptr);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  mp.use_extra_bufts = false;
  return llama_model_load_from_file(path.c_str(), mp);
}

// One sequence, chunks of `chunk` tokens. llama.cpp's flash-attention path casts f32 K/V to f16
// before attending, so an "f32 cache" would be compared at f16 precision: an f32 cache takes the
// plain path; quantized caches need flash attention.
inline llama_context *reference_context(llama_model *model, uint32_t n_ctx, int chunk, int threads,
                                        ggml_type type_k = GGML_TYPE_F32,
                                        ggml_type type_v = GGML_TYPE_F32) {
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = n_ctx;
  cp.n_batch = uint32_t(chunk);
  cp.n_ubatch = uint32_t(chunk);
  cp.n_seq_max = 1;
  cp.n_threads = threads;
  cp.n_threads_batch = threads;
  cp.flash_attn_type = type_k == GGML_TYPE_F32 && type_v == GGML_TYPE_F32
                           ? LLAMA_FLASH_ATTN_TYPE_DISABLED
                           : LLAMA_FLASH_ATTN_TYPE_ENABLED;
  cp.type_k = type_k;
  cp.type_v = type_v;
  return llama_init_from_model(model, cp);
}

// Decodes token spans of sequence 0 into `file`: every position's logits row, in order.
class LogitsDecoder {
public:
  LogitsDecoder(const char *tool, llama_context *ctx, LogitsFile &file, int chunk)
      : tool_(tool), ctx_(ctx), file_(file), batch_(llama_batch_init(chunk, 0, 1)) {}
  ~LogitsDecoder() { llama_batch_free(batch_); }
  LogitsDecoder(const LogitsDecoder &) = delete;
  LogitsDecoder &operator=(const LogitsDecoder &) = delete;

  // n (at most chunk) tokens at positions pos..; exits the program on failure.
  void decode(const llama_token *tokens, int n, llama_pos pos) {
    batch_.n_tokens = n;
    for (int i = 0; i < n; ++i) {
      batch_.token[i] = tokens[i];
      batch_.pos[i] = pos + i;
      batch_.n_seq_id[i] = 1;
      batch_.seq_id[i][0] = 0;
      batch_.logits[i] = 1;
    }
    if (llama_decode(ctx_, batch_) != 0) {
      std::fprintf(stderr, "%s: llama_decode failed at %d\n", tool_, int(pos));
      std::exit(1);
    }
    for (int i = 0; i < n; ++i) {
      const float *row = llama_get_logits_ith(ctx_, i);
      file_.logits.insert(file_.logits.end(), row, row + file_.n_vocab);
    }
  }

  // `count` greedy picks, each the argmax of the last logits row, appended to file.tokens; all
  // but the last are decoded, from position pos on (G picks decode G - 1 tokens).
  void greedy(int count, llama_pos pos) {
    for (int g = 0; g < count; ++g) {
      const float *row = file_.logits.data() + file_.logits.size() - file_.n_vocab;
      const llama_token next = llama_token(std::max_element(row, row + file_.n_vocab) - row);
      file_.tokens.push_back(uint32_t(next));
      if (g + 1 < count) decode(&next, 1, pos++);
    }
  }

private:
  const char *tool_;
  llama_context *ctx_;
  LogitsFile &file_;
  llama_batch batch_;
};

} // namespace offgraph::peer
