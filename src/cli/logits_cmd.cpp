#include "commands.h"
#include "device_flags.h"
#include "image_flags.h"

#include "kv/storage_types.h"
#include "model/forward.h"
#include "peer/logits_file.h"
#include "text/tokenizer/tokenizer.h"

#include "ggml-cpu.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>
#include <sstream>

namespace offgraph::cli {

std::function<int()> add_logits(CLI::App &app) {
  struct Opts {
    std::string model, tokens, out, ctk = "f32", ctv = "f32", ring_order = "physical", prompt,
                                    attention = "grouped";
    int32_t random = 0, chunk = 32, greedy = 0, threads = 2;
    uint64_t seed = 1;
    DeviceFlags devices;
    ImageFlags images;
    std::vector<std::string> image_files;
  };
  auto o = std::make_shared<Opts>();
  CLI::App *cmd =
      app.add_subcommand("logits", "compute logits for a token list, then decode greedily");
  add_device_flags(*cmd, o->devices);
  add_image_flags(*cmd, o->images);
  cmd->add_option("--image", o->image_files,
                  "an image for the prompt's next <__media__> marker (with --mmproj; repeatable)");
  cmd->add_option("-m,--model", o->model, "the GGUF model")->required();
  cmd->add_option("--tokens", o->tokens, "prompt token ids, comma-separated");
  cmd->add_option("--random", o->random, "or a prompt of this many random token ids");
  cmd->add_option("-p,--prompt", o->prompt,
                  "or a text prompt, tokenized by the model's tokenizer (BOS per the vocabulary)");
  cmd->add_option("--seed", o->seed, "seed for --random")->capture_default_str();
  cmd->add_option("--chunk", o->chunk, "prefill chunk (max_write)")->capture_default_str();
  cmd->add_option("--greedy", o->greedy, "greedy decode steps after the prompt")
      ->capture_default_str();
  cmd->add_option("--ctk", o->ctk, "K cache type")->capture_default_str();
  cmd->add_option("--ctv", o->ctv, "V cache type")->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "threads")->capture_default_str();
  cmd->add_option("--ring-order", o->ring_order,
                  "physical (no copy) or logical (summation order of an unwrapped cache)")
      ->capture_default_str();
  cmd->add_option("--attention", o->attention,
                  "attention kernels: grouped (offgraph's: grouped decode, tiled prefill), "
                  "grouped-decode (ggml's flash attention for prefill) or ggml (flash attention "
                  "everywhere, as llama.cpp)")
      ->capture_default_str();
  cmd->add_option("-o,--out", o->out,
                  "write every logits row to this file (for the peer comparer)");
  return [o]() -> int {
    auto fail = [](const std::string &m) {
      return std::fprintf(stderr, "offgraph logits: %s\n", m.c_str()), 1;
    };
    // One prompt source: a second one would be silently ignored.
    std::vector<std::string> sources;
    if (!o->tokens.empty()) sources.push_back("--tokens");
    if (!o->prompt.empty()) sources.push_back("--prompt");
    if (o->random > 0) sources.push_back("--random");
    if (sources.size() > 1)
      return fail("give one prompt: " + sources[0] + " and " + sources[1] +
                  " were both given (--image goes with --prompt)");
    if (!o->image_files.empty() && o->prompt.empty())
      return fail("--image needs a text prompt (-p) with <__media__>, not " +
                  (sources.empty() ? std::string("no prompt") : sources[0]));
    auto m = load_placed(o->model, o->devices, [](uint64_t d, uint64_t t) {
      if (t > (256u << 20)) progress_bar("loading", d, t);
    });
    if (!m.ok()) return fail(m.message());
    report_placement(**m);
    const model::ModelConfig &c = (*m)->config();
    std::vector<int32_t> prompt;
    // Images: each fills its marker with its rows (image positions have no logits row, and their
    // ids are written as 0xFFFFFFFF: the peer's convention, tools/peer/peer_mtmd_logits.cpp).
    std::vector<engine::Request::Embeddings> placed;
    if (!o->image_files.empty()) {
      if (o->images.mmproj.empty()) return fail("--image needs --mmproj");
      auto tok = text::Tokenizer::from_gguf(o->model);
      if (!tok.ok()) return fail(tok.message());
      auto in = load_image_input(o->images, **m, **tok, o->threads);
      if (!in.ok()) return fail(in.message());
      auto images = encode_image_files(*in->encoder, o->image_files);
      if (!images.ok()) return fail(images.message());
      prompt = tokenize_with_media(**tok, o->prompt, in->markers.marker, images->size(),
                                   (*tok)->add_bos_default());
      std::vector<int32_t> no_starts;
      auto p = engine::place_images(prompt, no_starts, in->markers, *images, c.n_vocab);
      if (!p.ok()) return fail(p.message());
      placed = std::move(p).value();
    } else if (!o->tokens.empty()) {
      std::stringstream ss(o->tokens);
      for (std::string item; std::getline(ss, item, ',');) {
        try {
          prompt.push_back(std::stoi(item));
        } catch (...) {
          return fail("'" + item + "' is not a token id");
        }
      }
    } else if (!o->prompt.empty()) {
      auto tok = text::Tokenizer::from_gguf(o->model);
      if (!tok.ok()) return fail(tok.message());
      prompt = (*tok)->encode(o->prompt, (*tok)->add_bos_default(), false);
    } else if (o->random > 0) {
      std::mt19937_64 rng(o->seed);
      for (int32_t i = 0; i < o->random; ++i)
        prompt.push_back(std::uniform_int_distribution<int32_t>(0, c.n_vocab - 1)(rng));
    }
    if (prompt.empty()) return fail("no prompt (give --tokens, --prompt or --random)");
    if (o->chunk < 1) return fail("--chunk must be at least 1");
    auto ctk = kv::parse_storage_type(o->ctk), ctv = kv::parse_storage_type(o->ctv);
    if (!ctk.ok() || !ctv.ok()) return fail((ctk.ok() ? ctv : ctk).message());
    const int32_t capacity = int32_t(prompt.size()) + std::max(o->greedy, 1);
    auto layout = model::make_layout(**m, {capacity, std::min(o->chunk, capacity)});
    if (!layout.ok()) return fail(layout.message());
    auto store = kv::KvStore::create(*layout, {*ctk, *ctv}, (**m).cache_buffer_types());
    if (!store.ok()) return fail(store.message());
    if (o->ring_order != "physical" && o->ring_order != "logical")
      return fail("--ring-order is physical or logical");
    if (o->ring_order == "logical")
      if (Status st = (*store)->set_ring_order(kv::RingOrder::Logical); !st.ok())
        return fail(st.message());
    auto kernel = kv::parse_attention_kernel(o->attention);
    if (!kernel.ok()) return fail(kernel.message());
    (*store)->set_attention_kernel(*kernel);
    const kv::SeqId seq = *(*store)->create_sequence();
    model::Forward fwd(**m, **store, o->threads);

    peer::LogitsFile file;
    file.n_vocab = uint32_t(c.n_vocab);
    file.n_prompt = uint32_t(prompt.size());
    std::vector<const float *> image_row(prompt.size(), nullptr); // each position's, if an image's
    for (const auto &e : placed)
      for (int32_t i = 0; i < e.rows->n_rows; ++i)
        image_row[size_t(e.at + i)] = e.rows->rows.data() + size_t(i) * size_t(c.n_embd);
    for (size_t i = 0; i < prompt.size(); ++i)
      file.tokens.push_back(image_row[i] ? 0xFFFFFFFFu : uint32_t(prompt[i]));
    // Prefill in chunks, keeping every text row's logits.
    for (size_t at = 0; at < prompt.size();) {
      const int32_t n = int32_t(std::min<size_t>(size_t(o->chunk), prompt.size() - at));
      model::Batch b;
      b.tokens.assign(prompt.begin() + long(at), prompt.begin() + long(at) + n);
      b.spans.push_back({seq, int32_t(at), n});
      for (int32_t i = 0; i < n; ++i) {
        if (const float *row = image_row[at + size_t(i)]) {
          b.embedding_at.push_back(i);
          b.embeddings.insert(b.embeddings.end(), row, row + c.n_embd);
        } else {
          b.logit_rows.push_back(i);
        }
      }
      auto logits = fwd.run(b); // a chunk of image rows alone wants none
      if (!logits.ok()) return fail(logits.message());
      file.logits.insert(file.logits.end(), logits->begin(), logits->end());
      at += size_t(n);
    }
    auto argmax = [&]() {
      const float *row = file.logits.data() + file.logits.size() - size_t(c.n_vocab);
      return int32_t(std::max_element(row, row + c.n_vocab) - row);
    };
    std::printf("greedy:");
    for (int32_t g = 0; g < o->greedy; ++g) {
      const int32_t next = argmax();
      file.tokens.push_back(uint32_t(next));
      std::printf(" %d", next);
      if (g + 1 == o->greedy) break; // the last pick needs no logits of its own
      model::Batch b;
      b.tokens = {next};
      b.spans.push_back({seq, int32_t(file.tokens.size()) - 1, 1});
      b.logit_rows = {0};
      auto logits = fwd.run(b);
      if (!logits.ok()) return fail(logits.message());
      file.logits.insert(file.logits.end(), logits->begin(), logits->end());
    }
    std::printf("\n");
    if (!o->out.empty() && !file.write(o->out)) return fail("cannot write " + o->out);
    return 0;
  };
}

} // namespace offgraph::cli
