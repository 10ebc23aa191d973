// The llama.cpp side of the image-prompt peer comparison: loads a text GGUF with libllama and an
// mmproj with libmtmd from the pinned tree, tokenizes a prompt with one media marker
// (mtmd_default_marker(), "<__media__>") per image, evaluates the chunks in order, decodes
// greedily, and writes the logits file of `offgraph logits --mmproj ... --image ...`
// (logits_file.h). Built only against the cached peer build.
//
//   peer_mtmd_logits -m TEXT.gguf --mmproj MMPROJ.gguf --image FILE [--image FILE ...]
//                    --prompt TEXT --chunk C --greedy G -t THREADS -o OUT
//
// The file's tokens are every prompt position in order (the text token id, or kImageToken for
// each image embedding row), then the greedy picks; n_prompt counts every prompt position. The
// logits rows are one per text prompt position (image rows have none), in position order, then
// one after each greedy decode (as peer_logits: G greedy steps decode G - 1 tokens).
#include "llama_reference.h"

#include "mtmd-helper.h"
#include "mtmd.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

// The token id that stands for one image embedding position in the logits file.
constexpr uint32_t kImageToken = 0xFFFFFFFFu;

} // namespace

int main(int argc, char **argv) {
  std::string model_path, mmproj_path, out, prompt_text;
  std::vector<std::string> images;
  int chunk = 32, greedy = 0, threads = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "-m")
      model_path = v;
    else if (k == "--mmproj")
      mmproj_path = v;
    else if (k == "--image")
      images.push_back(v);
    else if (k == "--prompt")
      prompt_text = v;
    else if (k == "--chunk")
      chunk = std::atoi(v.c_str());
    else if (k == "--greedy")
      greedy = std::atoi(v.c_str());
    else if (k == "-t")
      threads = std::atoi(v.c_str());
    else if (k == "-o")
      out = v;
    else
      return std::fprintf(stderr, "peer_mtmd_logits: unknown option %s\n", k.c_str()), 2;
  }
  if (argc % 2 == 0)
    return std::fprintf(stderr, "peer_mtmd_logits: option %s needs a value\n", argv[argc - 1]), 2;
  if (model_path.empty() || mmproj_path.empty() || prompt_text.empty() || chunk < 1 || greedy < 0 ||
      threads < 1)
    return std::fprintf(stderr, "peer_mtmd_logits: need -m, --mmproj, --prompt, --chunk >= 1\n"), 2;

  llama_model *model = offgraph::peer::load_reference_model(model_path);
  mtmd_helper_log_set(offgraph::peer::quiet_log, nullptr); // also sets mtmd's own log
  if (!model)
    return std::fprintf(stderr, "peer_mtmd_logits: llama.cpp could not load %s\n",
                        model_path.c_str()),
           1;
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

  mtmd_context_params mparams = mtmd_context_params_default();
  mparams.use_gpu = false;
  mparams.print_timings = false;
  mparams.n_threads = threads;
  // f32 attention in the encoder, as llama-mtmd-cli -fa off (tests/peer/vision_peer_test.cpp).
  mparams.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  mparams.warmup = false;
  mtmd_context *mctx = mtmd_init_from_file(mmproj_path.c_str(), model, mparams);
  if (!mctx)
    return std::fprintf(stderr, "peer_mtmd_logits: mtmd could not load %s\n", mmproj_path.c_str()),
           1;
  if (!mtmd_support_vision(mctx))
    return std::fprintf(stderr, "peer_mtmd_logits: %s has no vision encoder\n",
                        mmproj_path.c_str()),
           1;
  if (mtmd_decode_use_mrope(mctx))
    return std::fprintf(stderr, "peer_mtmd_logits: M-RoPE projectors are not supported\n"), 1;

  size_t n_markers = 0;
  const std::string marker = mtmd_default_marker();
  for (size_t at = prompt_text.find(marker); at != std::string::npos;
       at = prompt_text.find(marker, at + marker.size()))
    ++n_markers;
  if (n_markers != images.size())
    return std::fprintf(stderr, "peer_mtmd_logits: the prompt has %zu %s markers for %zu images\n",
                        n_markers, marker.c_str(), images.size()),
           2;

  std::vector<mtmd_bitmap *> bitmaps;
  for (const std::string &path : images) {
    mtmd_helper_bitmap_wrapper w = mtmd_helper_bitmap_init_from_file(
        mctx, path.c_str(), false, mtmd_helper_init_opt_default());
    if (!w.bitmap || w.video_ctx || mtmd_bitmap_is_audio(w.bitmap))
      return std::fprintf(stderr, "peer_mtmd_logits: %s is not an image mtmd can load\n",
                          path.c_str()),
             1;
    bitmaps.push_back(w.bitmap);
  }

  // BOS as the vocabulary says; the prompt's special-token text stays plain text (mtmd itself
  // tokenizes the image begin/end strings with special tokens parsed).
  const mtmd_input_text text{prompt_text.c_str(), prompt_text.size(), true, false};
  mtmd_input_chunks *chunks = mtmd_input_chunks_init();
  const int32_t tr = mtmd_tokenize(
      mctx, chunks, &text, const_cast<const mtmd_bitmap **>(bitmaps.data()), bitmaps.size());
  if (tr != 0) return std::fprintf(stderr, "peer_mtmd_logits: mtmd_tokenize failed (%d)\n", tr), 1;
  const size_t n_chunks = mtmd_input_chunks_size(chunks);
  const llama_pos n_pos = mtmd_helper_get_n_pos(chunks);

  llama_context *ctx =
      offgraph::peer::reference_context(model, uint32_t(n_pos + greedy + 1), chunk, threads);
  if (!ctx) return std::fprintf(stderr, "peer_mtmd_logits: could not create a context\n"), 1;

  offgraph::peer::LogitsFile file;
  file.n_vocab = uint32_t(n_vocab);
  offgraph::peer::LogitsDecoder decoder("peer_mtmd_logits", ctx, file, chunk);

  llama_pos n_past = 0;
  int image_index = 0;
  bool ends_in_text = false; // whether the last logits row is the last prompt position's
  for (size_t c = 0; c < n_chunks; ++c) {
    const mtmd_input_chunk *ch = mtmd_input_chunks_get(chunks, c);
    const mtmd_input_chunk_type type = mtmd_input_chunk_get_type(ch);
    ends_in_text = type == MTMD_INPUT_CHUNK_TYPE_TEXT;
    if (type == MTMD_INPUT_CHUNK_TYPE_TEXT) {
      size_t n = 0;
      const llama_token *tokens = mtmd_input_chunk_get_tokens_text(ch, &n);
      for (size_t i = 0; i < n; ++i) file.tokens.push_back(uint32_t(tokens[i]));
      for (size_t at = 0; at < n; at += size_t(chunk)) {
        const int m = int(std::min(size_t(chunk), n - at));
        decoder.decode(tokens + at, m, n_past);
        n_past += m;
      }
    } else if (type == MTMD_INPUT_CHUNK_TYPE_IMAGE) {
      const size_t rows = mtmd_input_chunk_get_n_tokens(ch);
      if (mtmd_input_chunk_get_n_pos(ch) != llama_pos(rows))
        return std::fprintf(stderr, "peer_mtmd_logits: image %d has %zu rows but %d positions\n",
                            image_index, rows, int(mtmd_input_chunk_get_n_pos(ch))),
               1;
      if (mtmd_encode_chunk(mctx, ch) != 0)
        return std::fprintf(stderr, "peer_mtmd_logits: mtmd_encode_chunk failed on image %d\n",
                            image_index),
               1;
      float *embd = mtmd_get_output_embd(mctx);
      std::printf("image %d: %zu rows at position %d\n", image_index, rows, int(n_past));
      llama_pos next = n_past;
      if (mtmd_helper_decode_image_chunk(mctx, ctx, ch, embd, n_past, 0, chunk, &next, nullptr,
                                         nullptr) != 0)
        return std::fprintf(stderr, "peer_mtmd_logits: decoding image %d failed\n", image_index), 1;
      file.tokens.insert(file.tokens.end(), rows, kImageToken);
      n_past = next;
      ++image_index;
    } else {
      return std::fprintf(stderr, "peer_mtmd_logits: unexpected audio chunk\n"), 1;
    }
  }
  file.n_prompt = uint32_t(file.tokens.size());
  if (file.n_prompt != uint32_t(n_pos) || image_index != int(images.size()))
    return std::fprintf(stderr, "peer_mtmd_logits: %u prompt positions, mtmd counts %d\n",
                        file.n_prompt, int(n_pos)),
           1;
  if (greedy > 0 && !ends_in_text)
    return std::fprintf(stderr, "peer_mtmd_logits: the prompt ends in an image, no logits to "
                                "decode greedily from\n"),
           1;
  decoder.greedy(greedy, n_past);
  std::printf("%u prompt positions (%zu chunks, %d images), %u logits rows, %zu greedy picks\n",
              file.n_prompt, n_chunks, image_index, file.n_rows(),
              file.tokens.size() - file.n_prompt);

  mtmd_input_chunks_free(chunks);
  for (mtmd_bitmap *b : bitmaps) mtmd_bitmap_free(b);
  mtmd_free(mctx);
  llama_free(ctx);
  llama_model_free(model);
  if (!out.empty() && !file.write(out))
    return std::fprintf(stderr, "peer_mtmd_logits: cannot write %s\n", out.c_str()), 1;
  return 0;
}
